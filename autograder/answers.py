"""The "predict" exercises: the student writes a value (a number, or a nested list of numbers)
before running anything, and the grader compares it with the reference's value.

The executor reads such a target instead of calling it (`Call.answer`, execute._answer) and
returns it as one float64 tensor. The grader compares it with a tolerance for hand-written
numbers: each entry within ANSWER_ATOL of the exact value (the exercise text says "to two
decimals"); `float("nan")` matches NaN and `float("inf")` / `-float("inf")` match infinities of
that sign. A written answer is a value, not code: it is graded once, on the CPU, for all its
points (no device-portability test).

The self-check runs in the student's own kernel, next to the package's public source, so it
holds nothing that could give an answer back: its data keep only the answer's shape (`form`),
and it checks only the form (`check_form`: not `...`, numbers, the shape the question asks for)
and says the answer is recorded. The same message comes back for a right and a wrong value of
that form, so trying values there learns nothing; only the grader, which computes the expected
value from the reference solutions, judges the value. Neither its messages nor the hints of
likely wrong answers (cases/extra.py) state the expected value.
"""
from __future__ import annotations

import torch

from .calls import Call, ErrorKind, Outcome
from .compare import NOT_IMPLEMENTED, Mismatch

ANSWER_ATOL = 0.01  # "within 0.01": answers written to two decimals pass


def shape_words(shape) -> str:
    """The form of an answer in words ("a list of 3 numbers")."""
    shape = tuple(shape)
    if not shape:
        return "a single number"
    if len(shape) == 1:
        return f"a list of {shape[0]} number{'s' if shape[0] != 1 else ''}"
    return "a nested list of shape (" + ", ".join(str(s) for s in shape) + ")"


def close(got: torch.Tensor, want: torch.Tensor, atol: float = ANSWER_ATOL) -> torch.Tensor:
    """Element-wise: whether each hand-written number counts as the exact one."""
    got, want = got.double(), want.double()
    both_nan = torch.isnan(got) & torch.isnan(want)
    same_inf = torch.isinf(got) & torch.isinf(want) & (torch.sign(got) == torch.sign(want))
    finite = torch.isfinite(got) & torch.isfinite(want)
    return both_nan | same_inf | (finite & ((got - want).abs() <= atol))


def form(expected: Outcome) -> Outcome:
    """What the self-check keeps of a reference answer: its shape, never its value."""
    shape = list(expected.outputs[0].shape) if not expected.error and expected.outputs else []
    return Outcome(returned="answer", outputs=[],
                   meta=[{"shape": shape, "dtype": "float64", "device": "cpu"}])


def _error(student: Outcome) -> Mismatch | None:
    err = student.error
    if err and err.get("type") == "NotImplementedError":
        return Mismatch("error", f"{NOT_IMPLEMENTED}: {err['message']}", not_implemented=True)
    if err:
        kind = ErrorKind.of(err)
        return Mismatch(kind.aspect if kind else "error", err["message"])
    return None


def _wrong_shape(call: Call, got: torch.Tensor, shape) -> Mismatch | None:
    if tuple(got.shape) != tuple(shape):
        return Mismatch("shape", f"`{call.target}` is {shape_words(tuple(got.shape))}; the question asks "
                        f"for {shape_words(tuple(shape))}.", output=0)
    return None


def check_form(call: Call, student: Outcome, expected_form: Outcome) -> Mismatch | None:
    """The self-check's whole judgement of a written answer: not the stub `...`, numbers (NaN
    and infinities included, as written), in the shape the question asks for. Whatever the
    value, an answer of that form passes: the value is for the grader (compare_answer)."""
    m = _error(student)
    if m:
        return m
    if len(student.outputs) != 1 or not isinstance(student.outputs[0], torch.Tensor):
        return Mismatch("returned", f"`{call.target}` came back without its value.")
    return _wrong_shape(call, student.outputs[0], expected_form.meta[0]["shape"])


def compare_answer(call: Call, student: Outcome, expected: Outcome) -> Mismatch | None:
    m = _error(student)
    if m:
        return m
    if expected.error or not expected.outputs:
        return Mismatch("grader", "the reference answer is missing for this question; please report "
                        "this to your instructor.")
    from .compare import structure

    m = structure(student, expected)
    if m:
        return m
    got, want = student.outputs[0], expected.outputs[0]
    if got is None or want is None:
        return Mismatch("returned", f"`{call.target}` came back without its value.")
    m = _wrong_shape(call, got, want.shape)
    if m:
        return m
    ok = close(got, want)
    if bool(ok.all()):
        return None
    bad = torch.nonzero(~ok)
    where = [int(i) for i in bad[0]] if got.dim() else []
    at = f" (first at index {tuple(where)}, where you wrote {got[tuple(where)].item():g})" if where else \
        f" (you wrote {got.item():g})"
    n = int(bad.shape[0]) if got.dim() else 1
    count = f"{n} of {got.numel()} numbers are" if got.numel() > 1 else "the number is"
    return Mismatch("values", f"not the right answer: {count} wrong{at}. Each number must be within "
                    f"{ANSWER_ATOL:g} of the exact value.", output=0, where=where)


def answer_hints(*pairs):
    """An `explain` for Hints: pairs of (wrong answer, hint); the hint of the wrong answer the
    student wrote (at the answers' own tolerance), else None. A hint names the reasoning that
    was missed, never the right value nor a fact that gives it away (tests/test_written_answers.py);
    the pairs are kept on the function (`explain.pairs`) for that test."""
    table = [(torch.as_tensor(value, dtype=torch.float64), text) for value, text in pairs]

    def explain(call, student, expected, mismatch):
        if mismatch.aspect != "values" or not student.outputs:
            return None
        got = student.outputs[0]
        for value, text in table:
            if tuple(value.shape) == tuple(got.shape) and bool(close(got, value).all()):
                return text
        return None
    explain.pairs = table
    return explain

"""The "predict" exercises: the student writes a value (a number, or a nested list of numbers)
before running anything, and it is compared with the reference's value.

The executor reads such a target instead of calling it (`Call.answer`, execute._answer) and
returns it as one float64 tensor. Here it is compared with a tolerance for hand-written numbers:
each entry within ANSWER_ATOL of the exact value (the exercise text says "to two decimals");
`float("nan")` matches NaN and `float("inf")` / `-float("inf")` match infinities of that sign.
The messages never show the expected value (the self-check must not give the answer away).
"""
from __future__ import annotations

import torch

from .calls import Call, ErrorKind, Outcome
from .compare import NOT_IMPLEMENTED, Mismatch

ANSWER_ATOL = 0.01  # "within 0.01": answers written to two decimals pass


def _shape_words(shape) -> str:
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


def compare_answer(call: Call, student: Outcome, expected: Outcome) -> Mismatch | None:
    err = student.error
    if err and err.get("type") == "NotImplementedError":
        return Mismatch("error", f"{NOT_IMPLEMENTED}: {err['message']}", not_implemented=True)
    if err:
        kind = ErrorKind.of(err)
        return Mismatch(kind.aspect if kind else "error", err["message"])
    if expected.error or not expected.outputs:
        return Mismatch("grader", "the reference answer is missing for this question; please report "
                        "this to your instructor.")
    from .compare import structure

    m = structure(student, expected)
    if m:
        return m
    got, want = student.outputs[0], expected.outputs[0]
    if got is None or want is None:  # the meta device: an answer is compared as on the CPU
        return Mismatch("returned", f"`{call.target}` came back without its value.")
    if tuple(got.shape) != tuple(want.shape):
        return Mismatch("shape", f"`{call.target}` is {_shape_words(tuple(got.shape))}; the question asks "
                        f"for {_shape_words(tuple(want.shape))}.", output=0)
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
    student wrote (at the answers' own tolerance), else None."""
    table = [(torch.as_tensor(value, dtype=torch.float64), text) for value, text in pairs]

    def explain(call, student, expected, mismatch):
        if mismatch.aspect != "values" or not student.outputs:
            return None
        got = student.outputs[0]
        for value, text in table:
            if tuple(value.shape) == tuple(got.shape) and bool(close(got, value).all()):
                return text
        return None
    return explain

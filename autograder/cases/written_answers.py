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
likely wrong answers state the expected value, and a wrong answer gets one verdict, with no
count or index of wrong entries. The hints and their wrong answers are kept with the
instructor's data (the solution notebooks, `hint_table`), not in this package.
"""
from __future__ import annotations

import json
import math
import re
from functools import lru_cache

import torch

from ..shared.calls import Call, Outcome
from ..grading.compare import Mismatch
from ..references.solutions import solutions_dir
from ..selfcheck.answers import _error, _wrong_shape, check_form, shape_words  # noqa: F401

ANSWER_ATOL = 0.01  # "within 0.01": answers written to two decimals pass


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


def compare_answer(call: Call, student: Outcome, expected: Outcome) -> Mismatch | None:
    m = _error(student)
    if m:
        return m
    if expected.error or not expected.outputs:
        return Mismatch("grader", "the reference answer is missing for this question; please report "
                        "this to your instructor.")
    from ..grading.compare import structure

    m = structure(student, expected)
    if m:
        return m
    got, want = student.outputs[0], expected.outputs[0]
    if got is None or want is None:
        return Mismatch("returned", f"`{call.target}` came back without its value.")
    m = _wrong_shape(call, got, want.shape)
    if m:
        return m
    if bool(close(got, want).all()):
        return None
    # One verdict for the whole answer: no count and no index of the wrong entries, so that
    # resubmitting (on Gradescope, say) cannot narrow an answer down entry by entry. Its own
    # aspect, "answer": the hint engine's guesses about code (NaN from an overflow, ...) would
    # be wrong here, and would tell whether the answer holds a NaN.
    return Mismatch("answer", f"not the right answer (you wrote {_written(got)}). Each number must be "
                    f"within {ANSWER_ATOL:g} of the exact value.", output=0)


def _written(got: torch.Tensor) -> str:
    """The student's own value, briefly."""
    text = f"{got.item():g}" if got.dim() == 0 else str([round(x, 4) for x in got.flatten().tolist()])
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------ hints of likely wrong answers
# The hints of likely wrong answers live with the instructor's data, in the answer cell of the
# solution notebook, inside its solution region (so they leave the exercise notebook with the
# answer), one comment line each:
#     # hint for [0, 1, 1, 1, 1, 0]: off by one: count the visible keys again ...
# A table of wrong answers in the package would give the right one away (three wrong parameter
# counts, each missing one bias, gave the count): the package holds none
# (tests/course/test_written_answers.py).
_HINT_NAMES = {"nan": math.nan, "inf": math.inf, "pi": math.pi, "exp": math.exp, "sin": math.sin, "cos": math.cos}
HINT_LINE = re.compile(r"^#\s*hint for (.+?):\s+(.+)$")


def hint_table(chapter: str, name: str) -> list[tuple[torch.Tensor, str]]:
    """(wrong answer, hint) pairs for `name` from the chapter's solution notebook; [] where the
    solutions are not at hand (the student's machine)."""
    return list(_hint_table(str(solutions_dir() / f"{chapter}.ipynb"), name))


@lru_cache(maxsize=None)
def _hint_table(path: str, name: str) -> tuple:
    try:
        with open(path, encoding="utf-8") as f:
            cells = json.load(f)["cells"]
    except (OSError, ValueError, KeyError):
        return ()
    pairs = []
    for cell in cells:
        source = cell.get("source", "")
        source = source if isinstance(source, str) else "".join(source)
        if cell.get("cell_type") != "code" or not re.search(rf"^{re.escape(name)}\s*=", source, re.M):
            continue
        for line in source.splitlines():
            m = HINT_LINE.match(line.strip())
            if m:  # the instructor's own notebook: numbers, nan, inf, pi, exp, sin, cos
                value = eval(m.group(1), {"__builtins__": {}}, _HINT_NAMES)
                pairs.append((torch.as_tensor(value, dtype=torch.float64), m.group(2).strip()))
    return tuple(pairs)


def answer_hints(chapter: str, name: str):
    """An `explain` for Hints: the hint of the likely wrong answer the student wrote (at the
    answers' own tolerance), from the instructor's table (`hint_table`), else None. A hint names
    the reasoning that was missed, never the right value nor a fact that gives it away."""
    def explain(call, student, expected, mismatch):
        if mismatch.aspect != "answer" or not student.outputs:
            return None
        got = student.outputs[0]
        for value, text in hint_table(chapter, name):
            if tuple(value.shape) == tuple(got.shape) and bool(close(got, value).all()):
                return text
        return None
    return explain

"""The self-check's whole judgement of a written answer ("predict the output"): its form, never
its value. The self-check runs where the student can read and patch everything, so its data keep
only the shape the question asks for (`cases.written_answers.form`); the grader, which computes
the expected value from the reference solutions, judges the value (`written_answers.compare_answer`)."""
from __future__ import annotations

import torch

from ..shared.calls import Call, ErrorKind, Outcome
from ..grading.compare import NOT_IMPLEMENTED, Mismatch


def shape_words(shape) -> str:
    """The form of an answer in words ("a list of 3 numbers")."""
    shape = tuple(shape)
    if not shape:
        return "a single number"
    if len(shape) == 1:
        return f"a list of {shape[0]} number{'s' if shape[0] != 1 else ''}"
    return "a nested list of shape (" + ", ".join(str(s) for s in shape) + ")"


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

"""Test cases per chapter: which Calls grade an exercise, and which mistakes explain a mismatch.

Each chapter module defines
    cases(exercise, gen, ref, quick) -> list[Call]   # inputs made from `gen`; `ref` is the
                                                     # reference namespace (to shape weights)
    hint(call, student, expected, mismatch) -> str | None
                                                     # names the likely mistake, from the call's
                                                     # inputs and the student's outputs alone
and may define
    compare(call, student, expected) -> Mismatch | None
                                                     # its own comparison (e.g. training-mode
                                                     # dropout, graded by properties)
The chapter, exercise and target fields of each Call are filled in here.
"""
from __future__ import annotations

import dataclasses
import importlib

import torch

from ..calls import Call, Outcome
from ..contract import CHAPTERS
from ..inputs import generator


def _module(chapter: str):
    return importlib.import_module(f"{__name__}.ch{chapter}")


def build_cases(chapter: str, exercise: str, ref: dict, *, seed: int, quick: bool = False) -> list[Call]:
    ex = CHAPTERS[chapter].exercise(exercise)
    calls = _module(chapter).cases(exercise, generator(seed, chapter, exercise), ref, quick)
    return [dataclasses.replace(c, chapter=chapter, exercise=exercise, target=c.target or ex.target)
            for c in calls]


def compare(call: Call, student: Outcome, expected: Outcome):
    """The chapter's own comparison where it has one, else `autograder.compare.compare`."""
    from .. import compare as generic

    own = getattr(_module(call.chapter), "compare", None)
    return (own or generic.compare)(call, student, expected)


def hint(call: Call, student: Outcome, expected: Outcome, mismatch) -> str | None:
    if mismatch.not_implemented:  # a stub: any hint about the intended behaviour would mislead
        return None
    try:
        return _module(call.chapter).hint(call, student, expected, mismatch)
    except Exception:  # a hint is a courtesy; never let it break grading
        return None


def matches(a, b, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
    """Whether a submitted tensor `a` equals the output `b` of a mistake model (NaN counted as 0):
    how the hints recognise a mistake."""
    return (a is not None and b is not None and tuple(a.shape) == tuple(b.shape)
            and torch.allclose(torch.nan_to_num(a.double()), torch.nan_to_num(b.double()), rtol=rtol, atol=atol))


def call(case: str, *args, **fields) -> Call:
    """A Call with the bookkeeping fields left for build_cases to fill."""
    return Call(chapter="", exercise="", case=case, target=fields.pop("target", ""),
                args=list(args), **fields)

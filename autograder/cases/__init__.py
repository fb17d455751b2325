"""Test cases per chapter, and each exercise's mistake models for the hint engine.

Each chapter module defines
    cases(exercise, gen, ref, quick) -> list[Call]   # inputs made from `gen`; `ref` is the
                                                     # reference namespace (to shape weights)
    HINTS: dict[str, Hints]                          # per exercise: its mistake models as data
and may define
    compare(call, student, expected, notes) -> Mismatch | None
                                                     # its own comparison (e.g. training-mode
                                                     # dropout, graded by properties)
The chapter, exercise and target fields of each Call are filled in here.

A mistake model (`Mistake`) recomputes a call with one named mistake in plain torch: these
models are working re-implementations of the exercises, so they stay here, with the instructor;
the engine that matches them (`autograder/selfcheck/hint_engine.py`) is shared with the student
package, which gets the models' predictions on its quick cases as data (`selfcheck_data.py`).
"""
from __future__ import annotations

import dataclasses
import importlib

from ..shared.calls import Call, Outcome
from ..shared.contract import CHAPTERS
from ..shared.kinds import IMPLEMENT
from .inputs import generator
from ..selfcheck.hint_engine import (  # noqa: F401  (the engine's names, as the chapters use them)
    EXACT, FULLY_MASKED_NAN, KEPT_KEYS_NAN, MODEL_ASPECTS, NO_HINT_ASPECTS, OVERFLOW_NAN, Hints, Mistake,
    _same_nonfinite, convention_hint, exercise_hint, explains, hint_tolerance, matches, model_hint,
    nonfinite_hint, predict)
from ..selfcheck import hint_engine


def chapter_module(chapter: str):
    """The chapter's case module (`autograder.cases.ch<chapter>`)."""
    return importlib.import_module(f"{__name__}.ch{chapter}")


def build_cases(chapter: str, exercise: str, ref: dict, *, seed: int, quick: bool = False) -> list[Call]:
    """The exercise's cases, from its task's strategy (`kinds.py`), with their bookkeeping fields."""
    ex = CHAPTERS[chapter].exercise(exercise)
    calls = _strategy(chapter, exercise).cases(chapter, exercise, generator(seed, chapter, exercise), ref, quick)
    return [dataclasses.replace(c, chapter=chapter, exercise=exercise, target=c.target or ex.target)
            for c in calls]


def _strategy(chapter: str, exercise: str):
    """The strategy of the exercise's task (`kinds.py`); an exercise outside the contract is
    treated as one to implement."""
    from .kinds import STRATEGIES, strategy  # (it uses this module's helpers)

    try:
        return strategy(CHAPTERS[chapter].exercise(exercise))
    except KeyError:
        return STRATEGIES[IMPLEMENT]


def compare(call: Call, student: Outcome, expected: Outcome, notes: list | None = None):
    """The comparison of the exercise's task: a written answer's (written_answers.py), else the
    chapter's own where it has one, else `autograder.grading.compare.compare`."""
    return _strategy(call.chapter, call.exercise).compare(call, student, expected, notes)


# ----------------------------------------------------------------------------- hints
def hint(call: Call, student: Outcome, expected: Outcome, mismatch) -> str | None:
    """The hint for a failing case (the engine's `hint`, with this exercise's mistake models)."""
    spec, extra = _spec(call)
    return hint_engine.hint(spec, extra, call, student, expected, mismatch)


def small_difference_hint(call: Call, student: Outcome, expected: Outcome) -> str | None:
    """The engine's `small_difference_hint`, with this exercise's mistake models."""
    spec, extra = _spec(call)
    return hint_engine.small_difference_hint(spec, extra, call, student, expected)


def _spec(call: Call) -> tuple:
    """(the exercise's Hints or None, whether it keeps to its own hints: a written answer or a
    find-the-bug fix, `kinds.py`)."""
    try:
        task = _strategy(call.chapter, call.exercise)
        return task.hints(call.chapter, call.exercise), task.own_hints
    except Exception:  # a hint is a courtesy: never an error of the grader
        return None, False


def call(case: str, *args, **fields) -> Call:
    """A Call with the bookkeeping fields left for build_cases to fill."""
    return Call(chapter="", exercise="", case=case, target=fields.pop("target", ""),
                args=list(args), **fields)

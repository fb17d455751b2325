"""Each chapter's comparison rules and the hints that no mistake model shows, in the terms the
grader and the self-check share: plain functions of (call, student outcome, expected outcome,
mismatch), holding no model of an exercise. `autograder/cases/chNN_*.py` pairs them with its
mistake models; the self-check pairs them with the models' stored predictions."""
from __future__ import annotations

import importlib

from ...grading import compare as generic


def chapter_rules(chapter: str):
    """The chapter's rules module, or None where the chapter has none."""
    try:
        return importlib.import_module(f"{__name__}.ch{chapter}")
    except ModuleNotFoundError:
        return None


def compare(call, student, expected, notes=None, probe=None):
    """The chapter's own comparison where it has one, else the generic one; `probe`: what a
    property check needs of the mistake-free models (chapter 8's dropout), where it needs it."""
    rules = chapter_rules(call.chapter)
    own = getattr(rules, "compare", None)
    if own is None:
        return generic.compare(call, student, expected, notes)
    if probe is not None:
        return own(call, student, expected, notes, probe=probe)
    return own(call, student, expected, notes)


def explain(chapter: str, exercise: str):
    """The exercise's `explain` (hints no model shows), or None."""
    return getattr(chapter_rules(chapter), "EXPLAIN", {}).get(exercise)

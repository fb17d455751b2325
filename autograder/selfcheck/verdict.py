"""The self-check's verdict on one quick case: the grader's rule (`grading.judge.judge`), with the
mistake models' stored predictions in place of the models.

Compare the student's outcome with the stored expected one (on the meta device: shapes, dtypes and
devices only) by the chapter's rule (`rules.compare`), name the likely mistake with the hint engine
(`hint_engine.hint`) and record forbidden built-ins. The stored hint data of a case (built by
`autograder/cases/selfcheck_data.py`) hold each applicable mistake's hint and prediction, the
mistake-free model's prediction, and for a find-the-bug exercise the bug's prediction and symptom
in words; `tests/course/test_student_package.py` checks that the verdicts equal the grader's."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..shared.calls import Call, Outcome
from ..shared.contract import Exercise
from ..grading.compare import FLOAT32_NOTE, PRECISION_HINT, Mismatch, compare_meta
from ..runtime.device_check import DEVICE_CHECKS
from .hint_engine import Hints, Mistake, Stored, bug_hint, prediction_from_plain, small_difference_hint
from .hint_engine import hint as engine_hint
from .rules import compare as rule_compare, explain as rule_explain


@dataclass
class Verdict:
    """The diagnosis of one case: the first failing aspect (with its hint), the forbidden
    built-ins the call used, and a note on a pass (float32 rounding in a float64 case)."""

    mismatch: Mismatch | None
    forbidden: set = field(default_factory=set)
    note: str = ""


def stored_spec(call: Call, stored: dict | None) -> tuple[Hints | None, bool]:
    """(the exercise's Hints with stored predictions for models, whether it is of another kind)."""
    if stored is None:
        return None, False
    mistakes = tuple(Mistake(text, Stored(prediction_from_plain(p))) for text, p in stored["mistakes"])
    correct = Stored(prediction_from_plain(stored["correct"])) if stored["correct"] is not None else None
    if stored["extra"]:
        bugs = [(prediction_from_plain(p), lambda student, expected, text=text: text) for p, text in stored["bugs"]]
        explain = (lambda c, s, e, m: bug_hint(bugs, c, s, e, m)) if bugs else None
    else:
        explain = rule_explain(call.chapter, call.exercise)
    return Hints(mistakes, correct, explain, stored["weights_right"], stored["fully_masked"]), stored["extra"]


def judge(ex: Exercise, call: Call, student: Outcome, expected: Outcome, stored_hints: dict | None = None,
          probe: dict | None = None) -> Verdict:
    """The grader's rule on one quick case (see the module's docstring)."""
    notes: list = []
    try:
        if call.device in DEVICE_CHECKS and not call.answer:
            m = compare_meta(call, student, expected)
        else:
            m = rule_compare(call, student, expected, notes, probe)
    except Exception as e:  # an outcome that no rule foresaw: the case fails, the check goes on
        m = Mismatch("returned", f"the result could not be compared with the reference "
                     f"({type(e).__name__}: {str(e)[:200]}).")
        return Verdict(m, ex.forbidden.used_in(student.forbidden))
    if m:
        spec, extra = stored_spec(call, stored_hints)
        try:
            m.hint = m.hint or engine_hint(spec, extra, call, student, expected, m)
        except Exception:
            m.hint = None
        if not m.hint and m.aspect == "grads" and FLOAT32_NOTE in notes:
            m.hint = small_difference_hint(spec, extra, call, student, expected) or PRECISION_HINT
    return Verdict(m, ex.forbidden.used_in(student.forbidden), notes[0] if notes and m is None else "")


def forbidden_message(ex: Exercise, names) -> str:
    return (f"uses {ex.forbidden.what} ({', '.join(sorted(names))}); this exercise asks you to write "
            "the computation yourself, so it scores zero.")

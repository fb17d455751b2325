"""The verdict on one case, the grader's and the self-check's alike (`judge_by`), and the self-check's
source of comparisons and hints: the mistake models' stored predictions in place of the models.

Compare the student's outcome with the expected one (on the meta device: shapes, dtypes and
devices only) by the chapter's rule, name the likely mistake with the hint engine and record
forbidden built-ins. The grader's rules and hints come from `autograder/cases` (its live mistake
models: `grading.judge.judge`); the self-check's (`judge`) from `StoredRules`: the chapter's rule
(`rules.compare`) and the hint engine (`hint_engine.hint`) on the stored data. The stored hint data of a case (built by
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


class StoredRules:
    """The self-check's comparison and hints of one case: the chapter's rule (with chapter 8's dropout
    `probe`) and the hint engine on the case's stored hint data (`stored_spec`, read on a failure)."""

    def __init__(self, stored: dict | None = None, probe: dict | None = None):
        self.stored, self.probe, self._spec = stored, probe, None

    def spec(self, call: Call) -> tuple[Hints | None, bool]:
        if self._spec is None:
            try:
                self._spec = stored_spec(call, self.stored)
            except Exception:  # a hint is a courtesy: never an error of the check
                self._spec = (None, False)
        return self._spec

    def compare(self, call: Call, student: Outcome, expected: Outcome, notes: list):
        return rule_compare(call, student, expected, notes, self.probe)

    def hint(self, call: Call, student: Outcome, expected: Outcome, mismatch) -> str | None:
        return engine_hint(*self.spec(call), call, student, expected, mismatch)

    def small_difference_hint(self, call: Call, student: Outcome, expected: Outcome) -> str | None:
        return small_difference_hint(*self.spec(call), call, student, expected)


def judge(ex: Exercise, call: Call, student: Outcome, expected: Outcome, stored_hints: dict | None = None,
          probe: dict | None = None) -> Verdict:
    """The grader's rule on one quick case, with the stored hint data (see the module's docstring)."""
    return judge_by(StoredRules(stored_hints, probe), ex, call, student, expected)


def judge_by(rules, ex: Exercise, call: Call, student: Outcome, expected: Outcome) -> Verdict:
    """The one grading rule, used by the grader, the self-check and nbgrader alike: compare the
    student's outcome of `call` with the expected one (on the meta device: shapes, dtypes and
    devices only), name the likely mistake, and record forbidden built-ins. `rules`: where the
    comparison and the hints come from (`compare`, `hint`, `small_difference_hint` of a call):
    `autograder.cases` in the grader, `StoredRules` in the self-check."""
    notes: list = []
    try:
        if call.device in DEVICE_CHECKS and not call.answer:  # (an answer is a value: compared as on the CPU)
            m = compare_meta(call, student, expected)
        else:
            m = rules.compare(call, student, expected, notes)
    except Exception as e:  # an outcome that no rule foresaw: the case fails, the grading goes on
        m = Mismatch("returned", f"the result could not be compared with the reference "
                     f"({type(e).__name__}: {str(e)[:200]}).")
        return Verdict(m, ex.forbidden.used_in(student.forbidden))
    if m:
        try:
            m.hint = m.hint or rules.hint(call, student, expected, m)
        except Exception:
            m.hint = None
        if not m.hint and m.aspect == "grads" and FLOAT32_NOTE in notes:
            m.hint = rules.small_difference_hint(call, student, expected) or PRECISION_HINT
    return Verdict(m, ex.forbidden.used_in(student.forbidden), notes[0] if notes and m is None else "")


def forbidden_message(ex: Exercise, names) -> str:
    return (f"uses {ex.forbidden.what} ({', '.join(sorted(names))}); this exercise asks you to write "
            "the computation yourself, so it scores zero.")

"""The student-side check, called from each exercise's self-check cell.

    from autograder.selfcheck import check
    check("02_scaled_dot_product_attention", "scaled_dot_product_attention", scaled_dot_product_attention)

It runs a few fast cases in the student's own kernel and compares with expected outcomes stored
in `autograder/data/selfcheck.agw` (made from the reference solutions by
`python -m autograder selfcheck-data`, `cases/selfcheck_data.py`), so it needs neither the
solutions nor the grader's hidden cases, and reveals no reference code. Failures raise
`SelfCheckFailed` with the same diagnosis the autograder gives (`verdict.judge`): the first
failing aspect, the largest error and where, a hint; except that a find-the-bug hint
(`Exercise.task`) names the symptom only, never the fix: finding the fix is the exercise.

This folder, with what it imports, is the student package (`tools/build_student_dist.py`): it
holds no mistake model (those are working answers, and stay in `autograder/cases/`); the hints
come from the models' predictions on the quick cases, stored in the data.

A written answer ("predict the output", a task whose `value` is read) is the exception: this check
runs where the student can read and patch everything, so its data hold no expected value for
it, only the shape the question asks for. It checks the answer's form (`answers.check_form`:
not `...`, numbers, that shape) and says the answer is recorded, with the same words for a
right and a wrong value; the autograder, which computes the expected value from the reference
solutions, checks the value.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..runtime.device_check import DEVICE_CHECKS, FAKE_CUDA, unchecked
from ..shared import wire
from ..shared.calls import Call, Outcome
from ..shared.contract import CHAPTERS
from ..runtime.execute import execute
from ..grading.compare import Mismatch
from ..grading.variants import variants
from .answers import check_form, shape_words
from .verdict import forbidden_message, judge

DATA = Path(__file__).resolve().parent.parent / "data" / "selfcheck.agw"


class SelfCheckFailed(AssertionError):
    """A self-check found a problem; the message is the diagnosis."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows the diagnosis alone, not a traceback into the grader's own code."""
        return str(self).splitlines()


@lru_cache(maxsize=1)
def _fixtures() -> dict:
    return wire.load(DATA)


def run_checks(chapter: str, exercise: str, obj) -> list[tuple[Call, object, str]]:
    """(call, mismatch or None, note) for each quick case up to the first failure, then the
    first case on the meta device; judged by the grader's own rule (`verdict.judge`). A written
    answer: its form only (`answers.check_form`), whatever its value."""
    ex = CHAPTERS[chapter].exercise(exercise)
    namespace = {ex.target: obj}
    results = []
    entries = _fixtures()[f"{chapter}/{exercise}"]
    if ex.task.value:
        for entry in entries:
            c = Call.from_plain(entry["call"])
            results.append((c, check_form(c, execute(namespace, c), Outcome.from_plain(entry["expected"])), ""))
        return results
    for entry in entries:
        c = Call.from_plain(entry["call"])
        verdict = judge(ex, c, execute(namespace, c), Outcome.from_plain(entry["expected"]),
                        entry["hints"], entry.get("probe"))
        m = verdict.mismatch
        if m is None and verdict.forbidden:
            m = Mismatch("forbidden", forbidden_message(ex, verdict.forbidden))
        results.append((c, m, verdict.note))
        if m:
            return results
    first = entries[0]
    if first["expected_meta"] is not None:
        (_, c), = variants([Call.from_plain(first["call"])], FAKE_CUDA)
        student = execute(namespace, c)
        m = judge(ex, c, student, Outcome.from_plain(first["expected_meta"]), first["hints_meta"]).mismatch
        results.append((c, None if unchecked(student) else m, ""))
    return results


def check(chapter: str, exercise: str, obj, raise_on_failure: bool = True) -> bool:
    """Run the quick checks of one exercise; print a summary, and on failure raise
    SelfCheckFailed with the diagnosis (or, with raise_on_failure=False, print it and return False)."""
    results = run_checks(chapter, exercise, obj)
    failed = [(c, m) for c, m, _ in results if m]
    answer = CHAPTERS[chapter].exercise(exercise).task.value
    if not failed and answer:
        shape = _fixtures()[f"{chapter}/{exercise}"][0]["expected"]["meta"][0]["shape"]
        print(f"✓ {exercise}: recorded ({shape_words(shape)}, the form the question asks for).\n"
              "  This check looks at the form only and says the same for any value; whether the value "
              "is right, only the autograder checks.")
        return True
    if not failed:
        print(f"✓ {exercise}: {len(results)} quick checks passed "
              "(shapes, values, gradients, masks, device portability). The autograder runs more cases.")
        for note in sorted({n for _, _, n in results if n}):
            print(f"  note: {note}")
        return True
    c, m = failed[0]
    device = " in the device check (your code run as if on a GPU)" if c.device in DEVICE_CHECKS else ""
    lines = [f"✗ {exercise}: failed on case '{c.case}'{device}", f"  {m.message}"]
    if m.not_implemented:
        lines = [f"✗ {exercise}: not implemented yet (the stub raises NotImplementedError)."]
        if answer:
            lines = [f"✗ {exercise}: not implemented yet (replace the `...` with your answer)."]
    elif answer:
        lines = [f"✗ {exercise}: {m.message}"] + ([f"  hint: {m.hint}"] if m.hint else [])
    elif m.hint:
        lines.append(f"  hint: {m.hint}")
    if not raise_on_failure:
        print("\n".join(lines))
        return False
    raise SelfCheckFailed("\n".join(lines)) from None

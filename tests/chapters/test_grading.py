"""What every chapter's grading must do, chapter by chapter: the reference scores full marks;
the untouched stubs score zero with no misleading hint; the self-check (quick) cases are few
and run on the reference on CPU and on the meta device. (Their speed is measured by
tools/benchmark.py, not asserted here.)"""
import pytest

from autograder.cases import build_cases
from autograder.shared.contract import CHAPTERS
from autograder.runtime.execute import execute
from autograder.cases.inputs import SELF_CHECK_SEED
from autograder.references.solutions import load_reference

from grading_helpers import exercise_namespace, failures, full, grade_in, namespace_of



@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_reference_scores_full_marks(chapter):
    result = grade_in(chapter, namespace_of(chapter))
    assert set(result) == {ex.name for ex in CHAPTERS[chapter].exercises}
    for name, e in result.items():
        assert full(e), (name, failures(e))


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_unimplemented_stubs_score_zero_without_hints(chapter):
    """The untouched exercise notebook: every exercise raises NotImplementedError (a "predict"
    answer is still `...`), and is reported as not implemented."""
    graded = grade_in(chapter, exercise_namespace(chapter))
    assert set(graded) == {ex.name for ex in CHAPTERS[chapter].exercises}  # (never vacuous)
    for name, e in graded.items():
        assert e["score"] == 0, name
        cases = [c for t in e["tests"] for c in t.cases]
        assert cases and all(not c.passed and c.hint is None for c in cases), name
        assert all(c.not_implemented or c.message.startswith("not run") for c in cases), name
        stub = "is still `...`" if CHAPTERS[chapter].exercise(name).kind == "answer" else "NotImplementedError"
        assert all(stub in c.message or c.message.startswith("not run")
                   for c in cases), (name, {c.message for c in cases})


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_quick_cases_are_few_and_run_on_cpu_and_meta(chapter):
    ref = load_reference(chapter)
    for ex in CHAPTERS[chapter].exercises:
        calls = build_cases(chapter, ex.name, ref, seed=SELF_CHECK_SEED, quick=True)
        fewest = 1 if ex.kind == "answer" else 2  # a "predict" answer is one value
        # (a few more than the basics where the exercise states rules that each need a case of
        # their own: tests/rules.py; MultiHeadAttention has the most, 8)
        assert fewest <= len(calls) <= 8, (ex.name, len(calls))
        for c in calls:
            assert execute(ref, c).error is None or c.expect_error, (ex.name, c.case)
            if not c.train:
                for device in ("meta", "fake-cuda"):  # the device check, and its fallback
                    meta = execute(ref, c.on(device, "float32"))
                    assert meta.error is None or c.expect_error, (ex.name, c.case, device, meta.error)
                    assert not meta.device_note, (ex.name, c.case, meta.device_note)

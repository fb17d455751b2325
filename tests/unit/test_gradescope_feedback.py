"""Gradescope's results.json as a student reads it (report/gradescope.py, integrations/gradescope.py):
the score summary first, every chapter of the assignment (one not handed in at zero, with the
reason), sandbox notes never in what the student sees and once in the instructor's output, a zip
in the submission unpacked as `import` does, written answers' results hidden until the grades are
published (Gradescope's `visibility: after_published`)."""
from __future__ import annotations

import json
import zipfile

import pytest

from autograder.shared.contract import CHAPTERS
from autograder.report import gradescope
from autograder.grading.results import CaseResult, ChapterResult, SubmissionResult
from autograder.grading.results import TestResult as Result
from autograder.sandbox.modes import CONTAINER_NOTE
from grading_helpers import REPO

CH1, CH2 = "01_intuition", "02_scaled_dot_product_attention"


def _chapter(chapter, notebook="x.ipynb", passed=3, notes=()):
    tests = [Result(chapter, ex.name, "cpu", round(ex.points * passed / 3, 4), float(ex.points),
                    [CaseResult(f"c{i}", "cpu", "float64", i < passed, "" if i < passed else "values",
                                "" if i < passed else "wrong values") for i in range(3)])
             for ex in CHAPTERS[chapter].exercises]
    return ChapterResult(chapter, notebook, tests, notes=list(notes))


def _result():
    sandbox = ["sandbox: container", CONTAINER_NOTE]
    return SubmissionResult("sub", [
        _chapter(CH1, notes=[*sandbox, "cell 4: NameError: name 'x' is not defined"]),
        _chapter(CH2, notebook=None, passed=0),
        _chapter("05_masks", passed=2, notes=sandbox)], sandbox="container")


def test_the_summary_comes_first_with_every_chapter():
    data = gradescope.results_json(_result())
    first, *rest = data["output"].splitlines()
    most = sum(CHAPTERS[c].points for c in (CH1, CH2, "05_masks"))
    assert first.startswith("Score: ") and first.endswith(f"/ {most}")
    scores = rest[:rest.index("")] if "" in rest else rest
    lines = {line.split()[0]: line for line in scores}
    assert set(lines) == {CH1, CH2, "05_masks"}
    assert "not handed in (no notebook submitted)" in lines[CH2] and f"0 / {CHAPTERS[CH2].points}" in lines[CH2]
    assert "cell 4: NameError" in data["output"]  # the student's own notebook's notes stay
    assert {t["extra_data"]["chapter"] for t in data["tests"]} == {CH1, CH2, "05_masks"}


def test_sandbox_notes_are_for_the_instructor_once():
    r = _result()
    data = gradescope.results_json(r)
    student = data["output"] + "".join(t["output"] for t in data["tests"])
    assert "network is not cut off" not in student and "sandbox" not in student.lower()
    instructor = gradescope.instructor_output(r)
    assert instructor.count(CONTAINER_NOTE) == 1 and instructor.count("sandbox: container") == 1
    assert data["stdout_visibility"] == "hidden"


def test_written_answers_can_wait_for_the_published_grades():
    r = _result()
    answers = {ex.name for c in CHAPTERS.values() for ex in c.exercises if ex.kind == "answer"}
    shown = gradescope.results_json(r)
    assert all(t["visibility"] == "visible" for t in shown["tests"])
    hidden = gradescope.results_json(r, hide_answers=True)
    for t in hidden["tests"]:
        is_answer = t["extra_data"]["exercise"] in answers
        assert t["visibility"] == ("after_published" if is_answer else "visible"), t["name"]
    assert any(t["visibility"] == "after_published" for t in hidden["tests"])
    first = hidden["output"].splitlines()[0]
    counted = sum(t["max_score"] for t in hidden["tests"] if t["visibility"] == "visible")
    assert f"/ {counted:g}" in first and "written answers not counted" in first
    assert hidden["score"] == pytest.approx(r.score)  # (the grade itself is the same)


@pytest.mark.timeout(900)
def test_a_zip_in_the_submission_is_unpacked_and_a_missing_chapter_scores_zero(tmp_path, capsys):
    from autograder.integrations.gradescope import run

    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    with zipfile.ZipFile(root / "submission" / "my work.zip", "w") as z:
        z.write(REPO / "solutions" / f"{CH1}.ipynb", f"hw/{CH1} (1).ipynb")
        z.writestr("hw/notes.txt", "hello")
    data = run(root, [CH1, CH2], hide_answers=True)
    assert json.loads((root / "results" / "results.json").read_text()) == data
    assert data["score"] == pytest.approx(CHAPTERS[CH1].points)
    out = data["output"]
    assert out.startswith("Score: ") and "unpacked my work.zip" in out
    assert "not graded: my work.zip/hw/notes.txt" in out
    assert f"{CH2}" in out and "not handed in" in out
    assert any(t["visibility"] == "after_published" for t in data["tests"])
    assert "sandbox" not in out.lower() and "sandbox" in capsys.readouterr().out


def test_a_symlink_in_the_submission_is_not_followed(tmp_path):
    """A student links the grader's own solution notebook into the upload: placing it refuses
    the link (it is graded as not handed in), and says why."""
    from autograder.lms.placing import place_submission

    sub = tmp_path / "submission"
    sub.mkdir()
    (sub / f"{CH1}.ipynb").symlink_to(REPO / "solutions" / f"{CH1}.ipynb")
    (sub / "more").symlink_to(REPO / "solutions", target_is_directory=True)
    placed, unplaced = place_submission(sub, tmp_path / "placed")
    assert placed.placed == {} and not list((tmp_path / "placed").glob("*.ipynb"))
    why = {u.source: u.reason for u in unplaced}
    assert "symbolic link" in why[f"{CH1}.ipynb"]

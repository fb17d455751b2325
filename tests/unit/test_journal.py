"""The batch's journal: what a resumed run takes from it."""
from __future__ import annotations

from autograder.batch.journal import Journal, graded_students, journal_path
from autograder.grading.grader import Grader
from autograder.grading.results import ChapterResult, SubmissionResult
from autograder.grading.scoring import zero_chapter
from autograder.shared.contract import CHAPTERS

CH5 = "05_masks"


def test_a_resumed_run_grades_again_whom_the_grader_failed(tmp_path):
    """A student whose grading could not finish (a worker that died three times, a full disk in
    the spool) is `error`, not a grade: the run that resumes grades them again."""
    grader = Grader(device="cpu")
    ok = SubmissionResult("amy", [ChapterResult(CH5, "a.ipynb", zero_chapter(CHAPTERS[CH5], grader.devices, "stub"))])
    failed = SubmissionResult("bob", [grader.failed_chapter(CH5, tmp_path / "b.ipynb", RuntimeError("worker died"))])
    assert failed.error and ok.error is None
    path = journal_path(tmp_path / "grades.csv")
    assert path == tmp_path / "grades.csv.journal"
    first = Journal(path, [CH5], 1, grader.devices)
    first.add("amy", "print-a", ok, [])
    first.add("bob", "print-b", failed, [])
    found = Journal(path, [CH5], 1, grader.devices).resume({"amy": "print-a", "bob": "print-b"})
    assert sorted(found) == ["amy"]


def test_a_line_cut_short_does_not_take_the_next_student_with_it(tmp_path):
    """The run stopped part-way through a line (a full disk): the run that resumes starts its
    first student on a line of their own, so a third run still finds them."""
    grader = Grader(device="cpu")
    ok = SubmissionResult("amy", [ChapterResult(CH5, "a.ipynb", zero_chapter(CHAPTERS[CH5], grader.devices, "stub"))])
    path = journal_path(tmp_path / "grades.csv")
    first = Journal(path, [CH5], 1, grader.devices)
    first.add("amy", "print-a", ok, [])
    first._file.write('{"student": "bob", "finger')  # (cut short)
    first._file.close()
    second = Journal(path, [CH5], 1, grader.devices)
    assert sorted(second.resume({"amy": "print-a", "bob": "print-b"})) == ["amy"]
    second.add("bob", "print-b", ok, [])
    second._file.close()
    third = Journal(path, [CH5], 1, grader.devices).resume({"amy": "print-a", "bob": "print-b"})
    assert sorted(third) == ["amy", "bob"]


def test_the_stop_message_counts_the_students_kept_not_the_lines(tmp_path):
    """"N students graded so far" (the message of a stopped batch) counts what a resumed run
    keeps: not an `error` entry, a student's second line or a line cut short."""
    grader = Grader(device="cpu")
    ok = SubmissionResult("amy", [ChapterResult(CH5, "a.ipynb", zero_chapter(CHAPTERS[CH5], grader.devices, "stub"))])
    failed = SubmissionResult("bob", [grader.failed_chapter(CH5, tmp_path / "b.ipynb", RuntimeError("worker died"))])
    path = journal_path(tmp_path / "grades.csv")
    assert graded_students(path) is None
    journal = Journal(path, [CH5], 1, grader.devices)
    journal.add("amy", "print-a", ok, [])
    journal.add("bob", "print-b", failed, [])
    journal.add("amy", "print-a2", ok, [])
    journal._file.write('{"student": "cy", "finger')  # (cut short)
    journal._file.close()
    assert graded_students(path) == 1

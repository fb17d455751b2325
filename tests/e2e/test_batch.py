"""Class grading: every student is graded out of the same chapters."""
import shutil

import pytest

from autograder.batch.grade_class import grade_class
from autograder.shared.contract import CHAPTERS
from autograder.grading.grader import Grader

from grading_helpers import REPO

CH1, CH5 = "01_intuition", "05_masks"


def test_every_student_gets_the_same_maximum_and_a_missing_notebook_is_blank_with_a_note(tmp_path, capsys):
    cls = tmp_path / "class"
    for name, chapters in (("alice", (CH1, CH5)), ("carol", (CH1,))):
        (cls / name).mkdir(parents=True)
        for ch in chapters:
            shutil.copy(REPO / "solutions" / f"{ch}.ipynb", cls / name)
    results = grade_class(cls, Grader(device="cpu"), jobs=1, csv_path=tmp_path / "grades.csv")
    out = capsys.readouterr().out
    assert f"out of chapters {CH1}, {CH5}" in out
    maximum = CHAPTERS[CH1].points + CHAPTERS[CH5].points
    from grading_helpers import read_gradebook
    rows = read_gradebook(tmp_path / "grades.csv")
    assert float(rows["carol"]["Total"]) == pytest.approx(CHAPTERS[CH1].points)
    assert rows["carol"][CH5] == "" and f"{CH5}: no notebook submitted" in rows["carol"]["Notes"]
    assert float(rows["alice"][CH5]) == pytest.approx(CHAPTERS[CH5].points)
    assert results["carol"].max_score == pytest.approx(maximum)

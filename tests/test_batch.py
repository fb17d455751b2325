"""Class grading: every student is graded out of the same chapters."""
import csv
import shutil

import pytest

from autograder.batch import grade_class
from autograder.contract import CHAPTERS
from autograder.grading import Grader

from grading_helpers import REPO

CH1, CH5 = "01_intuition", "05_masks"


def test_every_student_gets_the_same_maximum_and_a_missing_notebook_says_missing(tmp_path, capsys):
    cls = tmp_path / "class"
    for name, chapters in (("alice", (CH1, CH5)), ("carol", (CH1,))):
        (cls / name).mkdir(parents=True)
        for ch in chapters:
            shutil.copy(REPO / "solutions" / f"{ch}.ipynb", cls / name)
    results = grade_class(cls, Grader(device="cpu"), jobs=1, csv_path=tmp_path / "grades.csv")
    out = capsys.readouterr().out
    assert f"out of chapters {CH1}, {CH5}" in out
    maximum = CHAPTERS[CH1].points + CHAPTERS[CH5].points
    rows = {r["student"]: r for r in csv.DictReader(open(tmp_path / "grades.csv"))}
    assert float(rows["alice"]["max_score"]) == float(rows["carol"]["max_score"]) == pytest.approx(maximum)
    assert float(rows["carol"]["score"]) == pytest.approx(CHAPTERS[CH1].points)
    assert rows["carol"][CH5] == "missing" and rows["alice"][CH5] != "missing"
    assert results["carol"].max_score == pytest.approx(maximum)

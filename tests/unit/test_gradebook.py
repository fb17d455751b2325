"""The gradebook CSV: Canvas's grade-import format (the checks its importer makes: the five
leading columns, a Points Possible row, numbers or blanks in every graded column), LMS ids where
`import` recorded them, blanks with reasons, full precision."""
from __future__ import annotations

import csv
import shutil

import pytest

from autograder.batch.grade_class import grade_class
from autograder.shared.contract import CHAPTERS
from autograder.grading.grader import Grader
from autograder.report.gradebook import LEADING, POINTS_POSSIBLE, READ_ONLY
from grading_helpers import REPO

CH1, CH5 = "01_intuition", "05_masks"


def canvas_check(path) -> list[dict]:
    """What Canvas's gradebook importer requires of a CSV (its documented format): the header
    starts with Student, ID, SIS User ID, SIS Login ID, Section; an optional second row whose
    first cell is "Points Possible" gives each assignment's points or "(read only)"; every
    assignment column holds a number or nothing. Returns the student rows."""
    with open(path, newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    header, possible, students = table[0], table[1], table[2:]
    assert header[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert possible[0].strip() == "Points Possible" and len(possible) == len(header)
    graded = [i for i in range(5, len(header)) if possible[i] != READ_ONLY]
    for i in graded:
        float(possible[i])  # a number of points
    for row in students:
        assert len(row) == len(header) and row[1], row
        for i in graded:
            assert row[i] == "" or float(row[i]) >= 0, (header[i], row[i])
    return [dict(zip(header, row)) for row in students]


def test_the_gradebook_imports_as_canvas_expects(tmp_path):
    cls = tmp_path / "class"
    for name, src in (("erin", "solutions"), ("li", "exercises")):
        (cls / name).mkdir(parents=True)
        for ch in (CH1, CH5):
            shutil.copy(REPO / src / f"{ch}.ipynb", cls / name)
    (cls / "sam").mkdir()
    shutil.copy(REPO / "solutions" / f"{CH1}.ipynb", cls / "sam")
    (cls / "sam" / f"{CH5}.ipynb").write_text("{ not json")
    (cls / "students.csv").write_text("student,lms,id_kind,lms_id,name,email,notes\n"
                                      "erin,canvas,user id,1001,Erin Smith,,\nli,canvas,user id,1002,Li Wu,,\n")
    grade_class(cls, Grader(device="cpu"), jobs=1, csv_path=tmp_path / "grades.csv", progress=False)
    rows = {r["ID"]: r for r in canvas_check(tmp_path / "grades.csv")}
    assert set(rows) == {"1001", "1002", "sam"}  # the LMS's ids where import recorded them
    assert rows["1001"]["Student"] == "Erin Smith"
    full = CHAPTERS[CH1].points + CHAPTERS[CH5].points
    assert float(rows["1001"]["Total"]) == pytest.approx(full) and rows["1001"]["Status"] == "ok"
    for ex in CHAPTERS[CH5].exercises:  # per-exercise columns, full points for the solution
        assert float(rows["1001"][f"{CH5}: {ex.name}"]) == pytest.approx(ex.points)
    assert float(rows["1002"]["Total"]) == 0.0
    # an unreadable notebook: blank cells and the reason, never a 0 that looks like a grade
    assert rows["sam"][CH5] == "" and all(rows["sam"][f"{CH5}: {e.name}"] == "" for e in CHAPTERS[CH5].exercises)
    assert "05_masks: not graded" in rows["sam"]["Notes"] and "JSON" in rows["sam"]["Notes"]
    with open(tmp_path / "grades.csv", newline="") as f:
        possible = list(csv.reader(f))[1]
    assert possible[0] == POINTS_POSSIBLE and possible[:5][1:] == ["", "", "", ""]
    assert LEADING == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def test_scores_keep_their_precision():
    from autograder.report.gradebook import _number

    assert _number(12.800000000000001) == "12.8" and _number(2 / 3) == "0.666666667"
    assert _number(1.2345678) == "1.2345678"  # (before: 4 significant figures, "1.235")

"""`python -m autograder export` (lms/export.py): each LMS's file against its documented
import columns, full precision, notes for the instructor, and cells a spreadsheet cannot run.
Built from synthetic results saved as `batch --out` saves them (no grading: fast).

The documented formats these tests hold the files to:
* Canvas, gradebook import: "The CSV file you import ... has four required components: Student
  Name OR Student ID OR Student SIS User ID ...; SIS Login ID; Section; Assignment Name", and "New
  assignment columns in the Gradebook generate new assignments" (Ohio State's Canvas guide,
  https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/import-csv-file-carmen-grades);
  read-only columns are ignored on re-upload
  (https://ts.vcu.edu/askit/teaching-and-learning/canvas/faculty/grading-faculty/gradebook-action-menu-faculty/).
* Moodle, gradebook CSV import: map "Email Address" to useremail or "Id Number" to useridnumber
  (https://docs.moodle.org/311/en/Grade_import).
* Moodle, assignment grading worksheet: the importer needs the columns "Identifier" (read as
  "Participant <id>"), "Grade" and "Last modified (grade)" (a date strtotime reads)
  (moodle/moodle, mod/assign/feedback/offline/importgradeslib.php).
"""
from __future__ import annotations

import csv
import datetime as dt

import pytest

from autograder import cli
from autograder.shared.contract import CHAPTERS
from autograder.report import class_report, gradebook
from autograder.lms import export as lms_export
from autograder.grading.results import CaseResult, ChapterResult, SubmissionResult
from autograder.grading.results import TestResult as Result

CH1, CH5 = "01_intuition", "05_masks"


def _test(chapter, exercise, max_score, passed, run=3, note="", aspect="values"):
    cases = [CaseResult(f"case {i}", "cpu", "float64", i < passed, "" if i < passed else aspect) for i in range(run)]
    return Result(chapter, exercise, "cpu", round(max_score * passed / run, 4), max_score, cases, note)


def _result(folder, passed=3, error=None, chapters=(CH1, CH5), tests=None):
    """Every exercise of the chapters on the CPU at full weight, `passed` of 3 cases each."""
    r = SubmissionResult(folder)
    for c in chapters:
        ts = [_test(c, ex.name, float(ex.points), passed) for ex in CHAPTERS[c].exercises]
        for t in tests or ():
            if t.chapter == c:
                ts = [t if x.exercise == t.exercise else x for x in ts]
        r.chapters.append(ChapterResult(c, f"{folder}/{c}.ipynb", ts, error=error if c == chapters[0] else None))
    return r


def _class(tmp_path, students: dict, rows: str):
    cls, out = tmp_path / "class", tmp_path / "out"
    cls.mkdir(parents=True)
    (cls / "students.csv").write_text("student,lms,id_kind,lms_id,name,email,notes\n" + rows, encoding="utf-8")
    for folder, r in students.items():
        class_report.save(out, folder, r, cls)
    return out


def _read(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_canvas_has_its_five_leading_columns_a_points_row_and_only_the_chosen_columns(tmp_path):
    out = _class(tmp_path, {"ann": _result("ann"), "bo": _result("bo", passed=2), "cy": _result("cy", error="boom"),
                            "dee": _result("dee")},
                 "ann,canvas,Canvas user id,1001,Ann Lee,,\nbo,canvas,Canvas user id,1002,Bo Chan,,\n"
                 "cy,canvas,Canvas user id,1003,Cy Ng,,\ndee,gradescope,Gradescope SID,S-77,Dee Park,dee@u.edu,\n")
    path, tell = lms_export.export(out, "canvas", tmp_path / "canvas.csv")
    table = _read(path)
    header, possible, body = table[0], table[1], table[2:]
    assert header[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert header[5:] == [lms_export.DEFAULT_NAME]  # one assignment, not 50 new ones
    assert possible[0].strip() == "Points Possible" and possible[1:5] == ["", "", "", ""]
    assert float(possible[5]) == CHAPTERS[CH1].points + CHAPTERS[CH5].points
    rows = {r[0]: r for r in body}
    assert rows["Ann Lee"][1:3] == ["1001", ""]
    assert rows["Dee Park"][1:3] == ["", "S-77"]  # a Gradescope SID is the school's id: SIS User ID, not ID
    assert float(rows["Ann Lee"][5]) == float(possible[5])
    assert rows["Cy Ng"][5] == ""  # grading that did not finish: blank, never a zero
    assert any("Cy" in line or "cy" in line for line in tell)

    by_chapter = _read(lms_export.export(out, "canvas", tmp_path / "c2.csv", "chapters", "Lab 1 (4242)")[0])
    assert by_chapter[0][5:] == [f"Lab 1 (4242): {CH1}", f"Lab 1 (4242): {CH5}"]
    assert [float(x) for x in by_chapter[1][5:]] == [CHAPTERS[CH1].points, CHAPTERS[CH5].points]
    per_exercise = _read(lms_export.export(out, "canvas", tmp_path / "c3.csv", "exercises")[0])
    assert len(per_exercise[0]) == 5 + len(CHAPTERS[CH1].exercises) + len(CHAPTERS[CH5].exercises)
    for row in per_exercise[2:]:
        assert all(c == "" or float(c) >= 0 for c in row[5:])
    # a chapter not handed in: blank cells (as in the grades CSV), never zeros that look graded
    missing = _class(tmp_path / "m", {"eve": _result("eve")}, "eve,canvas,Canvas user id,1005,Eve,,\n")
    saved = class_report.load(missing)[0]["eve"]["result"]
    saved.chapters[1].notebook = None
    class_report.save(missing, "eve", saved)
    for which in ("chapters", "exercises"):
        table = _read(lms_export.export(missing, "canvas", tmp_path / f"m-{which}.csv", which)[0])
        cells = dict(zip(table[0], table[2]))
        assert all(v == "" for h, v in cells.items() if CH5 in h) and any(v for h, v in cells.items() if CH1 in h)


def test_scores_are_summed_before_any_rounding(tmp_path):
    """2 of 3 cases of every exercise: each test stores 0.6667 of a point, rounded; the sums are
    of the unrounded 2/3 (a total of 4.0000000 for 6 points of exercises, not 4.0002)."""
    r = SubmissionResult("x", [ChapterResult(CH1, "x.ipynb", [_test(CH1, "softmax", 1.0, 2) for _ in range(6)])])
    assert r.chapters[0].tests[0].score == 0.6667
    assert r.score == pytest.approx(4.0, abs=1e-12)
    rows = gradebook.rows({"x": r})
    assert rows[2][rows[0].index("Total")] == "4.0"
    assert rows[2][rows[0].index(f"{CH1}: softmax")] == "4.0"
    # full marks are the maximum exactly (1.6 * 7 / 7 is 1.6000000000000003 in floats)
    for run in range(1, 40):
        assert _test(CH1, "softmax", 1.6, run, run=run).exact_score == 1.6
    # a score grading set otherwise (a forbidden API's zero) is kept
    t = _test(CH1, "softmax", 1.0, 3)
    t.score = 0.0
    assert t.exact_score == 0.0


def test_moodle_gets_its_grading_worksheet_from_a_moodle_download(tmp_path):
    out = _class(tmp_path, {"ann": _result("ann"), "bo": _result("bo", passed=1)},
                 "ann,moodle,Moodle participant id,4711,Ann Lee,,\nbo,moodle,Moodle participant id,4712,Bo Chan,,\n")
    path, tell = lms_export.export(out, "moodle", tmp_path / "moodle.csv")
    table = _read(path)
    header = table[0]
    for required in ("Identifier", "Grade", "Last modified (grade)"):
        assert required in header
    assert header == lms_export.MOODLE_WORKSHEET
    rows = {r[header.index("Full name")]: dict(zip(header, r)) for r in table[1:]}
    assert rows["Ann Lee"]["Identifier"] == "Participant 4711"  # what the importer strips to the id
    assert float(rows["Bo Chan"]["Grade"]) == pytest.approx((CHAPTERS[CH1].points + CHAPTERS[CH5].points) / 3)
    assert float(rows["Ann Lee"]["Maximum Grade"]) == CHAPTERS[CH1].points + CHAPTERS[CH5].points
    when = dt.datetime.strptime(rows["Ann Lee"]["Last modified (grade)"], lms_export.MOODLE_DATE)
    assert abs((dt.datetime.now() - when).total_seconds()) < 24 * 3600
    assert CH1 in rows["Ann Lee"]["Feedback comments"]
    with pytest.raises(lms_export.ExportError, match="one grade"):
        lms_export.export(out, "moodle", tmp_path / "m2.csv", "chapters")


def test_moodle_without_participant_ids_is_matched_by_email_or_refused(tmp_path):
    out = _class(tmp_path, {"ann": _result("ann"), "dee": _result("dee")},
                 "ann,gradescope,Gradescope email,ann@u.edu,Ann Lee,ann@u.edu,\n"
                 "dee,gradescope,Gradescope SID,S-77,Dee Park,dee@u.edu,\n")
    table = _read(lms_export.export(out, "moodle", tmp_path / "m.csv", "chapters")[0])
    assert table[0][:3] == ["Full name", "Email address", "ID number"]
    rows = {r[0]: r for r in table[1:]}
    assert rows["Ann Lee"][1:3] == ["ann@u.edu", ""] and rows["Dee Park"][1:3] == ["dee@u.edu", "S-77"]
    assert len(table[0]) == 5

    bare = _class(tmp_path / "b", {"zed": _result("zed")}, "")
    with pytest.raises(lms_export.ExportError, match="zed.*import the class from its Moodle download"):
        lms_export.export(bare, "moodle", tmp_path / "m3.csv")
    # A class imported from Canvas: `import` was done; what is missing is an email address.
    canvas = _class(tmp_path / "c", {"kim": _result("kim")}, "kim,canvas,Canvas user id,1002,Kim Ro,,\n")
    with pytest.raises(lms_export.ExportError, match="kim.*from a Canvas download.*`email` column") as e:
        lms_export.export(canvas, "moodle", tmp_path / "m4.csv")
    assert "python -m autograder import" not in str(e.value)


def test_plain_keeps_every_column_and_the_notes(tmp_path):
    from autograder.grading.judge import forbidden_message

    ex = CHAPTERS[CH1].exercise("softmax")
    banned = _test(CH1, "softmax", 4.0, 3, note=forbidden_message(ex, {"torch.softmax"}))
    banned.score = 0.0
    slow = _test(CH5, "causal_mask", 3.0, 1, aspect="timeout")
    out = _class(tmp_path, {"ann": _result("ann", tests=[banned, slow])},
                 "ann,canvas,Canvas user id,1001,Ann Lee,,LATE: Canvas marked the submission late; "
                 "unpacked work.zip; not placed: notes.pdf (a PDF)\n")
    table = _read(lms_export.export(out, "plain", tmp_path / "plain.csv")[0])
    header, row = table[0], table[2]
    notes = row[header.index("Notes")]
    for text in ("LATE", "unpacked work.zip", "not placed: notes.pdf", "forbidden API: 01_intuition: softmax uses "
                 "torch.softmax", "timeout: 05_masks: timed out in causal_mask"):
        assert text in notes, (text, notes)
    assert header[-3:] == ["Total", "Status", "Notes"]
    assert table[1][-3:] == ["(read only)"] * 3  # (Canvas computes its own total: not an assignment)
    page = (class_report.write(out)).read_text(encoding="utf-8")
    for text in ("LATE", "unpacked", "not placed", "forbidden API", "timeout"):
        assert f"<td>{text}</td>" in page, text


HOSTILE = ["=HYPERLINK(\"http://x\",\"y\")", "+SUM(A1)", "-2+3", "@cmd", "\tx", "\r=1"]


@pytest.mark.parametrize("lms", ["canvas", "moodle", "plain"])
def test_no_cell_a_spreadsheet_would_run(tmp_path, lms):
    students = {f"s{i}": _result(f"s{i}") for i in range(len(HOSTILE))}
    rows = "".join(f"s{i},moodle,Moodle participant id,{100 + i},{csv_quote(n)},{csv_quote(n)},{csv_quote(n)}\n"
                   for i, n in enumerate(HOSTILE))
    out = _class(tmp_path, students, rows)
    table = _read(lms_export.export(out, lms, tmp_path / "x.csv")[0])
    cells = [c for row in table for c in row]
    assert not [c for c in cells if c[:1] in ("=", "+", "@", "\t", "\r")]
    assert not [c for c in cells if c.startswith("-") and not _is_number(c)]
    assert any(c.startswith("'=HYPERLINK") for c in cells)


def test_import_and_batch_csvs_are_neutralised_too(tmp_path):
    from autograder.lms import submissions as lms_import

    r = gradebook.rows({"s": _result("s")}, names={"s": ("=1+1", "@x")}, imports={"s": {"notes": "-x; y"}})
    assert r[2][0] == "'=1+1" and r[2][1] == "'@x" and r[2][-1].startswith("'-x")
    report = lms_import.ImportReport("canvas", tmp_path, tmp_path)
    report.students["a"] = lms_import.StudentImport("a", "7", "=cmd|' /C calc'!A0", "Canvas user id", "+x@u.edu")
    lms_import._write_students_csv(report)
    row = _read(tmp_path / "students.csv")[1]
    assert row[4] == "'=cmd|' /C calc'!A0" and row[5] == "'+x@u.edu"


def test_the_export_command(tmp_path, capsys):
    out = _class(tmp_path, {"ann": _result("ann")}, "ann,canvas,Canvas user id,1001,Ann Lee,,\n")
    assert cli.main(["export", str(out), "--lms", "canvas", "--columns", "chapters"]) == 0
    assert (out / "canvas.csv").is_file() and "wrote" in capsys.readouterr().out
    assert cli.main(["export", str(tmp_path / "nowhere"), "--lms", "canvas"]) == 2
    (tmp_path / "empty").mkdir()
    assert cli.main(["export", str(tmp_path / "empty"), "--lms", "plain"]) == 2
    assert "batch --out" in capsys.readouterr().err


def csv_quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def test_a_student_folder_named_like_a_formula_keeps_their_report_row(tmp_path):
    """The CSV's ID cell of folder "=evil" is "'=evil"; the class report still finds the student
    (their flags, their feedback link) from it."""
    slow = _test(CH5, "causal_mask", 3.0, 1, aspect="timeout")
    out = _class(tmp_path, {"=evil": _result("=evil", tests=[slow])}, "")
    page = class_report.write(out).read_text(encoding="utf-8")
    assert "href='%3Devil/feedback.html'" in page
    assert "timed out in causal_mask" in page

"""Gradebook files each LMS imports as they are, from what `batch --out DIR` saved.

    python -m autograder export DIR --lms canvas|moodle|plain [--columns total|chapters|exercises]
                                    [--csv FILE] [--name NAME]

Read from DIR/<student>/grading.json (`class_report.save`): every student's result, with the
name and ids `import` recorded. The layouts follow each LMS's documented import:

* **canvas**: Canvas's gradebook import (Grades > Import): Student, ID, SIS User ID, SIS Login
  ID, Section, then one column per assignment, and a "Points Possible" row. Canvas matches a row
  by its ID (the Canvas user id of a Canvas download), else its SIS User ID (a Gradescope SID,
  the school's student id), else the name; each column it does not know becomes a new
  assignment, so the columns are the ones chosen (`--columns`: one total by default, or one per
  chapter, or one per exercise). No notes column: Canvas would make it an assignment.
* **moodle**: where every student has the Moodle participant id of a Moodle download, the
  assignment's offline grading worksheet (Grading action: Upload grading worksheet): Identifier
  ("Participant N"), Full name, Email address, Status, Grade, Maximum Grade, Grade can be
  changed, Last modified (submission), Last modified (grade), Feedback comments. Otherwise the
  gradebook's CSV import (Grades > Import > CSV file), where Moodle maps a column to a user by
  email address or ID number: Full name, Email address, ID number, then the chosen columns.
* **plain**: the grades CSV as `batch` writes it (every chapter and exercise, Total, Status, Notes).

Scores carry full precision (sums of unrounded test scores, to 1e-9). A student whose grading
could not finish has blank grades (never a zero that looks like one) and is listed on stderr.
Every text cell is neutralised for spreadsheets (`csv_safe`); the file is written whole or not
at all.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from ..shared.contract import CHAPTERS
from ..report import class_report, flags, gradebook
from ..report.csv_safe import write as write_csv

COLUMNS = ("total", "chapters", "exercises")
CANVAS_LEADING = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_WORKSHEET = ["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade",
                    "Grade can be changed", "Last modified (submission)", "Last modified (grade)",
                    "Feedback comments"]
MOODLE_PARTICIPANT = "Participant "   # (Moodle's 'hiddenuser' string, before the participant id)
MOODLE_DATE = "%A, %d %B %Y, %I:%M %p"  # (Moodle's strftimedatetime, which its importer parses)
DEFAULT_NAME = "Attention course autograder"


class ExportError(ValueError):
    """Nothing to export, or the chosen LMS cannot match these students."""


@dataclass
class Student:
    folder: str
    name: str
    lms: str
    id_kind: str
    lms_id: str
    email: str
    notes: str       # the import's (students.csv's `notes`)
    result: object   # SubmissionResult


def load(out_dir) -> tuple[list[Student], list[str]]:
    """The saved students of DIR, by name, and the problems reading them."""
    saved, problems = class_report.load(out_dir)
    students = []
    for folder, d in saved.items():
        imp = d.get("import") or {}
        students.append(Student(folder, d.get("name") or folder, imp.get("lms", ""), imp.get("id_kind", ""),
                                imp.get("lms_id") or "", imp.get("email") or "", imp.get("notes") or "",
                                d["result"]))
    if not students:
        raise ExportError(f"{out_dir}: no saved student results (DIR/<student>/{class_report.SAVED}); "
                          "grade the class with `batch --out DIR` first")
    return sorted(students, key=lambda s: (s.name, s.folder)), problems


def _chapters(students: list[Student]) -> list[str]:
    return [c for c in CHAPTERS if any(ch.chapter == c for s in students for ch in s.result.chapters)]


def columns(students: list[Student], which: str, name: str = DEFAULT_NAME) -> list[tuple[str, float, callable]]:
    """(header, points possible, score of a result or None) of each grade column."""
    chapters = _chapters(students)

    def graded(r, c):  # (a chapter not handed in or not readable: blank, as in the grades CSV)
        ch = next((x for x in r.chapters if x.chapter == c), None)
        return None if ch is None or ch.notebook is None or ch.not_graded else ch

    def chapter_score(c):
        return lambda r: None if (ch := graded(r, c)) is None else ch.score

    def exercise_score(c, e):
        return lambda r: None if (ch := graded(r, c)) is None else sum(t.exact_score for t in ch.tests if t.exercise == e)

    if which == "total":
        return [(name, sum(CHAPTERS[c].points for c in chapters), lambda r: r.score)]
    if which == "chapters":
        return [(f"{name}: {c}", CHAPTERS[c].points, chapter_score(c)) for c in chapters]
    if which == "exercises":
        return [(f"{name}: {c}: {ex.name}", ex.points, exercise_score(c, ex.name))
                for c in chapters for ex in CHAPTERS[c].exercises]
    raise ExportError(f"unknown --columns {which!r} (one of {', '.join(COLUMNS)})")


def _cell(value) -> str:
    return "" if value is None else gradebook._number(value)


def canvas_rows(students: list[Student], which: str = "total", name: str = DEFAULT_NAME) -> list[list]:
    cols = columns(students, which, name)
    out = [CANVAS_LEADING + [h for h, _, _ in cols],
           [gradebook.POINTS_POSSIBLE, "", "", "", ""] + [gradebook._number(p) for _, p, _ in cols]]
    for s in students:
        canvas_id = s.lms_id if s.lms == "canvas" else ""
        sis_user = s.lms_id if s.id_kind == "Gradescope SID" else ""  # (a school's student id, not Canvas's)
        grades = ["" if s.result.error else _cell(f(s.result)) for _, _, f in cols]
        out.append([s.name, canvas_id, sis_user, "", ""] + grades)
    return out


def moodle_kind(students: list[Student]) -> str:
    """"worksheet" where every student has a Moodle participant id, "gradebook" where every
    one has an email address or an ID number; ExportError naming those with neither."""
    if all(s.lms == "moodle" and s.lms_id.isdigit() for s in students):
        return "worksheet"
    lacking = [s.folder for s in students if not s.email and not (s.lms == "gradescope" and s.id_kind == "Gradescope SID")]
    if lacking:
        other = sorted({s.lms for s in students if s.folder in lacking and s.lms})
        hint = (f"their ids are from a {' and '.join(o.capitalize() for o in other)} download, which Moodle "
                "cannot match: add their email addresses to the `email` column of the class folder's "
                "students.csv and grade the class again with --out" if other else
                "import the class from its Moodle download with `python -m autograder import`")
        raise ExportError("Moodle matches a grade to a student by participant id (a Moodle download), email "
                          "address or ID number; these students have none of them: "
                          f"{', '.join(lacking[:10])}{' ...' if len(lacking) > 10 else ''} ({hint})")
    return "gradebook"


def moodle_worksheet_rows(students: list[Student], now: _dt.datetime | None = None) -> list[list]:
    """The assignment's grading worksheet: one grade (the total) per participant, the chapter
    scores as the feedback comment the student sees."""
    stamp = (now or _dt.datetime.now()).strftime(MOODLE_DATE)
    chapters = _chapters(students)
    most = sum(CHAPTERS[c].points for c in chapters)
    out = [list(MOODLE_WORKSHEET)]
    for s in students:
        r = s.result
        feedback = "" if r.error else "; ".join(
            f"{ch.chapter}: {gradebook._number(ch.score)} / {gradebook._number(ch.max_score)}" for ch in r.chapters)
        out.append([f"{MOODLE_PARTICIPANT}{s.lms_id}", s.name, s.email, "", "" if r.error else _cell(r.score),
                    gradebook._number(most), "Yes", "", stamp, feedback])
    return out


def moodle_gradebook_rows(students: list[Student], which: str = "total", name: str = DEFAULT_NAME) -> list[list]:
    cols = columns(students, which, name)
    out = [["Full name", "Email address", "ID number"] + [h for h, _, _ in cols]]
    for s in students:
        id_number = s.lms_id if s.id_kind == "Gradescope SID" else ""
        out.append([s.name, s.email, id_number] + ["" if s.result.error else _cell(f(s.result)) for _, _, f in cols])
    return out


def plain_rows(students: list[Student]) -> list[list]:
    results = {s.folder: s.result for s in students}
    names = {s.folder: (s.name, s.lms_id or s.folder) for s in students}
    imports = {s.folder: {"notes": s.notes} for s in students}
    return gradebook.rows(results, names=names, imports=imports)


def export(out_dir, lms: str, path, which: str | None = None, name: str = DEFAULT_NAME) -> tuple[Path, list[str]]:
    """Write the LMS's file; returns its path and the lines to tell the instructor."""
    students, problems = load(out_dir)
    tell = list(problems)
    if lms == "canvas":
        rows = canvas_rows(students, which or "total", name)
        unmatched = [s.folder for s in students if s.lms not in ("canvas",) and s.id_kind != "Gradescope SID"]
        if unmatched:
            tell.append(f"no Canvas user id or SIS User ID for {len(unmatched)} student(s) ({', '.join(unmatched[:5])}"
                        f"{' ...' if len(unmatched) > 5 else ''}): Canvas matches them by name only")
    elif lms == "moodle":
        kind = moodle_kind(students)
        if kind == "worksheet":
            if which not in (None, "total"):
                raise ExportError("the Moodle grading worksheet holds one grade per student: --columns total")
            rows = moodle_worksheet_rows(students)
            tell.append("a Moodle grading worksheet: upload it in the assignment (View all submissions > Grading "
                        "action > Upload grading worksheet)")
        else:
            rows = moodle_gradebook_rows(students, which or "total", name)
            tell.append("a Moodle gradebook CSV: in Grades > Import > CSV file, map 'Email address' to the email "
                        "address (or 'ID number' to the ID number)")
    elif lms == "plain":
        if which not in (None, "exercises"):
            raise ExportError("the plain gradebook has every column; --columns is for canvas and moodle")
        rows = plain_rows(students)
    else:
        raise ExportError(f"unknown LMS {lms!r} (canvas, moodle or plain)")
    errors = [s.folder for s in students if s.result.error]
    if errors:
        tell.append(f"grading could not finish for {', '.join(errors)}: their grades are blank (grade them again)")
    for s in students:
        notes = flags.import_notes({"notes": s.notes}) + [f"{k}: {t}" for k, t in flags.run_flags(s.result)]
        if notes and lms != "plain":
            tell.append(f"{s.name}: {'; '.join(notes)}")
    return write_csv(path, rows), tell

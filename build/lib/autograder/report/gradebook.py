"""The class's gradebook CSV, ready for an LMS's grade import (Canvas's format; Moodle maps it).

Layout (documented in the README, "The gradebook CSV"):

    Student, ID, SIS User ID, SIS Login ID, Section,     Canvas's five leading columns
    <chapter>..., <chapter>: <exercise>...,              points, numbers only
    Total, Status, Notes                                 read only
    "    Points Possible" row: each graded column's maximum, "(read only)" where it is not a grade

`Student` is the name and `ID` the LMS's student id where `python -m autograder import` wrote
them (CLASS_DIR/students.csv), else the student's folder name for both. Scores carry full
precision (as computed, to 1e-9). A chapter not handed in, or a notebook that could not be read,
leaves its cells blank and says why in Notes; a student whose grading could not finish has
`error` in Status (never a silent zero), with every score blank.
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..shared.contract import CHAPTERS
from ..grading.results import ChapterResult, SubmissionResult
from . import flags
from .csv_safe import cell as _cell
from .untrusted_text import printable


def cell(text) -> str:
    """A text cell: printable, and neutralised for spreadsheets."""
    return _cell(printable(str(text)))

LEADING = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
POINTS_POSSIBLE = "    Points Possible"  # (Canvas's own spelling, leading spaces included)
READ_ONLY = "(read only)"


def _number(x: float) -> str:
    """Full precision, without the float noise of summing rounded scores (12.800000000000001)."""
    return repr(round(float(x), 9))


def _students(class_dir) -> dict:
    """folder -> (name, LMS id), from CLASS_DIR/students.csv where `import` wrote one."""
    path = Path(class_dir) / "students.csv" if class_dir else None
    if path is None or not path.is_file():
        return {}
    out = {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row.get("student"):
                    out[row["student"]] = (row.get("name") or row["student"], row.get("lms_id") or row["student"])
    except (OSError, csv.Error, UnicodeDecodeError):
        return {}
    return out


def imported(class_dir) -> dict[str, dict]:
    """folder -> CLASS_DIR/students.csv's row (lms, id_kind, lms_id, name, email, notes), where
    `import` wrote one ({} otherwise, or where it cannot be read)."""
    path = Path(class_dir) / "students.csv" if class_dir else None
    if path is None or not path.is_file():
        return {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return {row["student"]: row for row in csv.DictReader(f) if row.get("student")}
    except (OSError, csv.Error, UnicodeDecodeError, KeyError):
        return {}


def _why_blank(ch: ChapterResult | None, chapter: str) -> str | None:
    if ch is None or ch.notebook is None:
        return f"{chapter}: no notebook submitted"
    if ch.not_graded:
        return f"{chapter}: not graded ({ch.not_graded})"
    return None


def rows(results: dict[str, SubmissionResult], class_dir=None, names: dict | None = None,
         imports: dict | None = None) -> list[list[str]]:
    """The CSV's rows, header and Points Possible row first. names: folder -> (name, LMS id),
    and imports: folder -> students.csv row, instead of CLASS_DIR/students.csv's (the class
    report, rebuilt from saved results). Notes: the import's (LATE, files not placed, unpacked
    zips), the grading's, forbidden-API uses and timeouts (`flags`). Text cells are
    neutralised for spreadsheets (`csv_safe`)."""
    chapters = [c for c in CHAPTERS if any(ch.chapter == c for r in results.values() for ch in r.chapters)]
    exercises = [(c, ex.name) for c in chapters for ex in CHAPTERS[c].exercises]
    header = LEADING + chapters + [f"{c}: {e}" for c, e in exercises] + ["Total", "Status", "Notes"]
    maxima = {c: float(CHAPTERS[c].points) for c in chapters}
    possible = ([POINTS_POSSIBLE, "", "", "", ""] + [_number(maxima[c]) for c in chapters]
                + [_number(CHAPTERS[c].exercise(e).points) for c, e in exercises]
                + [READ_ONLY, READ_ONLY, READ_ONLY])  # (Total: Canvas computes its own; not an assignment)
    names = _students(class_dir) if names is None else names
    imports = imported(class_dir) if imports is None else imports
    out = [header, possible]
    students = sorted(results.items(), key=lambda item: (*names.get(item[0], (item[0], item[0])), item[0]))
    for folder, r in students:
        name, lms_id = names.get(folder, (folder, folder))
        by = {ch.chapter: ch for ch in r.chapters}
        notes = flags.import_notes(imports.get(folder)) + list(r.notes)
        cells = []
        for c in chapters:
            why = _why_blank(by.get(c), c)
            if why:
                notes.append(why)
            cells.append("" if why or r.error else _number(by[c].score))
        for c, e in exercises:
            ch = by.get(c)
            blank = r.error or _why_blank(ch, c)
            cells.append("" if blank else _number(sum(t.exact_score for t in ch.tests if t.exercise == e)))
        notes += [f"{kind}: {text}" for kind, text in flags.run_flags(r)]
        if r.error:
            notes.append(f"error: grading could not finish ({r.error}); grade this student again")
        total = "" if r.error else _number(r.score)
        out.append([cell(name), cell(lms_id), "", "", ""] + cells
                   + [total, "error" if r.error else "ok", cell("; ".join(notes))])
    return out


def row_key(row: list[str]) -> tuple:
    """A student's row's place in the gradebook (by name, then LMS id: `rows`' order)."""
    return (row[0], row[1] if len(row) > 1 else "")


def write(results: dict[str, SubmissionResult], path, class_dir=None) -> None:
    from . import csv_safe

    csv_safe.write(path, rows(results, class_dir))

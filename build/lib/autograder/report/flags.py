"""What the instructor must know about a submission beyond its score, as short notes: how it
was handed in (LATE, files `import` could not place, zips it unpacked: from the import's
students.csv) and how it ran (forbidden-API uses, timeouts). The gradebook's Notes column and the
class report's flags show them; they change no score."""
from __future__ import annotations

import re

from ..grading.results import SubmissionResult

# grading.forbidden_message's wording ("uses <what> (<names>); this exercise asks you to write
# the computation yourself, so it scores zero."): read here without importing the grader (torch).
_FORBIDDEN = re.compile(r"^uses (?P<what>.+?) \((?P<names>[^)]*)\); this exercise asks you to write")
# A cell stopped for time (session._lost, a Timeout error) or the student's budget spent.
_CELL_TIMEOUT = re.compile(r"^cell (?P<cell>\d+): (.*ran longer than|Timeout\b)")
_BUDGET = "time budget"


def import_notes(row: dict | None) -> list[str]:
    """The notes `import` recorded for a student (students.csv's `notes`, "; "-separated)."""
    text = (row or {}).get("notes") or ""
    return [n.strip() for n in text.split("; ") if n.strip()]


def run_flags(result: SubmissionResult) -> list[tuple[str, str]]:
    """(kind, note) for each forbidden-API use and each timeout of a graded submission; kind is
    "forbidden API" or "timeout"."""
    out: list[tuple[str, str]] = []
    for ch in result.chapters:
        forbidden: dict[str, str] = {}
        timed_out: list[str] = []
        for t in ch.tests:
            m = _FORBIDDEN.match(t.note or "")
            if m:
                forbidden.setdefault(t.exercise, m["names"])
            if any(c.aspect == "timeout" for c in t.cases) and t.exercise not in timed_out:
                timed_out.append(t.exercise)
        out += [("forbidden API", f"{ch.chapter}: {ex} uses {names} (scored zero)") for ex, names in forbidden.items()]
        if timed_out:
            out.append(("timeout", f"{ch.chapter}: timed out in {', '.join(timed_out)}"))
        cells = [m["cell"] for n in ch.notes if (m := _CELL_TIMEOUT.match(n))]
        if cells:
            out.append(("timeout", f"{ch.chapter}: cell {', '.join(cells)} ran out of time"))
        if any(_BUDGET in n for n in ch.notes):
            out.append(("timeout", f"{ch.chapter}: the student's grading time budget ran out"))
    return out


def notes(result: SubmissionResult, imported: dict | None = None) -> list[str]:
    """Every instructor note of one student: the import's, then the run's."""
    return import_notes(imported) + [f"{kind}: {text}" for kind, text in run_flags(result)]

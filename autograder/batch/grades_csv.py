"""The class's grades CSV: written whole or not at all (every cell formula-safe), keeping the rows
of students a run did not grade, and merged from the CSVs and report folders of shards."""
from __future__ import annotations


import csv
import io
import shutil
from pathlib import Path


from ..report import gradebook
from ..report.csv_safe import row as safe_row
from ..report.text import plural
from ..grading.results import SubmissionResult


def _cells(rows: list[list]) -> list[list[str]]:
    """Every cell of the gradebook as written: student text shown (`printable`) and never a
    spreadsheet formula (`csv_safe.row`)."""
    return [safe_row(row) for row in rows]


def write_csv(results: dict[str, SubmissionResult], path, class_dir=None, keep_others: bool = False,
              only: bool = False) -> list[str]:
    """The gradebook CSV (`report.gradebook`: Canvas's import format, documented in the README),
    written whole or not at all (`atomic`). An existing CSV is never shortened by a run that did
    not regrade its rows: with `keep_others` (or `only`) the rows of students not in `results`
    are kept (by the ID column). ValueError, writing nothing, where such rows exist under other
    columns (another class's or other chapters' CSV). Returns the names in the kept rows."""
    from ..report import atomic

    new = _cells(gradebook.rows(results, class_dir))
    old = []
    if (keep_others or only) and Path(path).is_file():
        with open(path, newline="", encoding="utf-8") as f:
            old = list(csv.reader(f))
    ids = {row[1] for row in new[2:]}
    others = [row for row in old[2:] if len(row) >= 2 and row[1] not in ids]
    if others and old[:2] != new[:2]:
        raise ValueError(f"{path} holds {plural(len(others), 'student')} this run did not grade, under other "
                         "columns (other chapters or another class): it is left as it was; write this run's "
                         "grades to another --csv, or regrade with the class's --chapters")
    out = io.StringIO()
    csv.writer(out).writerows(new[:2] + sorted(new[2:] + others, key=gradebook.row_key))
    atomic.write_text(path, out.getvalue())
    return [row[0] for row in others]


RUN_SUFFIX = ".run"  # beside a CSV: how its students were graded (`class_report.run_of`)


def run_path(csv_path) -> Path:
    return Path(str(csv_path) + RUN_SUFFIX)


def write_run(csv_path, run: dict) -> None:
    """Record beside the CSV how its students were graded (the seed's digest, the devices),
    for `batch --only` and `merge` to compare: without `--out` nothing else says it."""
    import json

    from ..report import atomic

    atomic.write_text(run_path(csv_path), json.dumps(run) + "\n")


def read_run(csv_path) -> dict | None:
    """What `write_run` recorded beside the CSV (None: nothing, or not readable: a CSV of an
    older grader, or of no grader)."""
    import json

    try:
        run = json.loads(run_path(csv_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return run if isinstance(run, dict) else None


def update_csv(results: dict[str, SubmissionResult], path, class_dir=None) -> None:
    """Replace these students' rows (by the ID column) in an existing gradebook CSV, or add
    them, keeping every other row: regrading a few students (`batch --only`). ValueError if the
    CSV's columns differ from theirs (it was graded out of other chapters)."""
    write_csv(results, path, class_dir, only=True)


def merge_csvs(paths: list, out) -> int:
    """Join the CSVs of a class graded in shards (`batch --shard K/N`) into one, as one batch
    would have written it: the same header (the shards must grade the same chapters), every
    student's row once, sorted by student. Returns the number of students; ValueError if the
    headers differ, a student appears twice, or two shards were graded with another seed or
    other devices (`read_run`; a shard without the record is taken as it is)."""
    header, rows = None, {}
    runs = {str(path): run for path in paths if (run := read_run(path)) is not None}
    if len({repr(sorted(run.items())) for run in runs.values()}) > 1:
        raise ValueError(f"{', '.join(runs)} were graded with another seed or other devices (their "
                         f"{RUN_SUFFIX} files differ): grade every shard with the class's --seed and --device")
    for path in paths:
        with open(path, newline="") as f:
            lines = list(csv.reader(f))
        if not lines:
            raise ValueError(f"{path}: empty")
        head = [row for row in lines[:2] if row and (row is lines[0] or row[0] == gradebook.POINTS_POSSIBLE)]
        if header is None:
            header = head
        elif head != header:
            raise ValueError(f"{path}: its columns differ from {paths[0]}'s (grade every shard with the "
                             "same --chapters, or let batch take them from the whole class)")
        for row in lines[len(head):]:
            key = gradebook.row_key(row)
            if key in rows:
                raise ValueError(f"{path}: student {row[0]!r} ({row[1] if len(row) > 1 else ''}) is in two shards")
            rows[key] = row
    from ..report import atomic

    text = io.StringIO()
    w = csv.writer(text)
    w.writerows(header)
    for name in sorted(rows):
        w.writerow(rows[name])
    atomic.write_text(out, text.getvalue())
    if runs and len(runs) == len(paths):
        write_run(out, next(iter(runs.values())))
    return len(rows)


def merge_reports(folders: list, out) -> int:
    """Copy the per-student report folders of every shard (`batch --out`) into one."""
    count = 0
    for folder in folders:
        for student in sorted(Path(folder).iterdir()):
            if student.is_dir():
                if (Path(out) / student.name).exists():
                    raise ValueError(f"{student}: student {student.name!r} is in two shards")
                shutil.copytree(student, Path(out) / student.name)
                count += 1
    return count

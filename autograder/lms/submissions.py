"""Import an LMS's submission export into the layout `batch` grades: one folder per student.

    python -m autograder.lms.submissions SOURCE DEST [--lms auto|canvas|moodle|gradescope] [--force]

SOURCE is the export as the LMS gives it, a .zip or the folder it unzips to:

* **Canvas** ("Download Submissions"): one flat folder, every file named
  `<lastfirst>[_LATE]_<user id>_<submission id>_<original name>`, where Canvas numbers a file
  uploaded again under the same name `<name>-1.ext`, `<name>-2.ext`, ...
* **Moodle** ("Download all submissions"): a folder per student,
  `<Full Name>_<participant id>_assignsubmission_file_` (and `..._onlinetext_`), holding the
  student's files; without "download submissions in folders", flat files
  `<Full Name>_<participant id>_assignsubmission_file_<original name>`.
* **Gradescope** ("Export Submissions"): a folder `submission_<id>` per submission and a
  `submission_metadata.yml` naming each submission's submitters (name, sid, email).

DEST gets `DEST/<student>/NN_chapter.ipynb` (each notebook renamed to its chapter, so `batch`
finds it), `DEST/students.csv` (folder, the LMS's own student id, name, email) and
`DEST/import_report.txt` (what the command printed). Zips a student handed in are unpacked;
where a student handed in several notebooks for one chapter, the newest is placed (by the LMS's
numbering: a later submission id, Canvas's `-N`, a browser's `x (N).ipynb`; else by file time)
and the report says which and why; a notebook that is not UTF-8 (UTF-16 from some editors) is
written as UTF-8; every file that could not be placed is listed with the reason. An existing
student folder in DEST is never overwritten unless `force` (`--force`) is given.
"""
from __future__ import annotations


import argparse
import csv
import os
import re
import shutil
import sys
import unicodedata
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from ..report.csv_safe import cell
from .uploads import DestinationExists, LmsImportError, folder_tree, open_zip, visible, zip_tree
from .layouts import ID_KINDS, LMS_NAMES, Collector, StudentFiles, collect_canvas, detect, collect_gradescope, is_student_entry, collect_moodle
from .placing import StudentImport, Placer, choose, read_chosen


REPORT_FILE = "import_report.txt"
STUDENTS_CSV = "students.csv"


@dataclass
class ImportReport:
    lms: str
    source: Path
    dest: Path
    students: dict = field(default_factory=dict)  # folder -> StudentImport
    unplaced: list = field(default_factory=list)  # [Unplaced]
    written: bool = False                         # False for a dry run
    existing: list = field(default_factory=list)  # student folders DEST had already (replaced with force)

    @property
    def choices(self) -> list:
        return [c for s in self.students.values() for c in s.choices]

    @property
    def placed_count(self) -> int:
        return sum(len(s.placed) for s in self.students.values())

    def student(self, lms_id: str) -> StudentImport:
        """The student with this LMS id (KeyError if none)."""
        for s in self.students.values():
            if s.lms_id == str(lms_id):
                return s
        raise KeyError(lms_id)

    def summary(self) -> str:
        lms = LMS_NAMES.get(self.lms, self.lms)
        lines = [f"{'Imported' if self.written else 'Would import'} a {lms} export from {self.source} "
                 f"into {self.dest}: {len(self.students)} student{_s(self.students)}, "
                 f"{self.placed_count} notebook{_s(self.placed_count)} placed, "
                 f"{len(self.unplaced)} item{_s(self.unplaced)} not placed."]
        if self.students:
            kind = "Gradescope SID or email" if self.lms == "gradescope" else ID_KINDS.get(self.lms, "LMS id")
            lines += ["", f"Students (folder, {kind}, name: chapters placed):"]
            for s in self.students.values():
                chapters = ", ".join(s.placed) or "no gradable notebook (an empty folder: batch scores it zero)"
                extra = "".join(f"; {n}" for n in s.notes)
                lines.append(f"  {s.folder}  {s.lms_id}  {s.name}: {chapters}{extra}")
                for p in s.placed.values():
                    lines += [f"      {p.chapter} <- {p.source}: {n}" for n in p.notes]
        if self.choices:
            lines += ["", "More than one notebook for a chapter (the newest is placed):"]
            lines += [f"  {c.describe()}" for c in self.choices]
        if self.unplaced:
            lines += ["", "Not placed (nothing of these is graded):"]
            for u in self.unplaced:
                lines.append(f"  {u.source}{f' [{u.student}]' if u.student else ''}: {u.reason}")
        lines.append("")
        if self.existing:
            lines.append(f"{'replaced' if self.written else 'DEST already has (an import needs --force)'}: "
                         f"{', '.join(self.existing)}")
        if self.placed_count == 0:
            lines.append("error: no gradable notebook found in this export.")
        elif self.written:
            lines.append(f"wrote {self.dest / STUDENTS_CSV} and {self.dest / REPORT_FILE}; next: "
                         f"python -m autograder batch {self.dest} --csv grades.csv")
        return "\n".join(lines)


def _s(n) -> str:
    return "" if (n if isinstance(n, int) else len(n)) == 1 else "s"


def _slug(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


# -- the import ------------------------------------------------------------------------------------
def import_submissions(source, dest, lms: str = "auto", force: bool = False,
                       dry_run: bool = False, max_zip_bytes: int | None = None) -> ImportReport:
    """Import the LMS export `source` (a folder or .zip) into `dest`: one folder per student with
    their notebooks named by chapter, `students.csv` and `import_report.txt`. See the module's
    docstring. Raises LmsImportError (DestinationExists without `force` where a student's folder
    exists in `dest` already; nothing is written then). max_zip_bytes: a student's zips unpacked,
    in all (default: `settings.current()`'s)."""
    if max_zip_bytes is None:
        from ..settings import current
        max_zip_bytes = current().max_student_zip_bytes
    source, dest = Path(source), Path(dest)
    if lms not in ("auto", *LMS_NAMES):
        raise LmsImportError(f"unknown LMS {lms!r} (auto, {', '.join(LMS_NAMES)})")
    if not source.exists():
        raise LmsImportError(f"{source}: no such file or folder")
    with ExitStack() as stack:
        top = _export_top(source, dest, stack)
        found = detect(top) if lms == "auto" else lms
        if found is None:
            raise LmsImportError(f"{source}: not recognised as a Canvas, Moodle or Gradescope export "
                                 "(see --help for their file names); name the LMS with --lms")
        col = Collector(found)
        if found == "canvas":
            collect_canvas(top, col)
        elif found == "moodle":
            collect_moodle(top, col)
        else:
            collect_gradescope(top, col)
        report = ImportReport(found, source, dest, unplaced=col.unplaced)
        _name_folders(col.students.values())
        plan = _plan(col, report, Placer(found, stack, max_zip_bytes), found)
        existing = report.existing = [st.folder for st, _, _ in plan if (dest / st.folder).exists()]
        if existing and not force and not dry_run:
            raise DestinationExists(f"{dest} already has folders of {len(existing)} student{_s(existing)} of "
                                    f"this export ({', '.join(existing[:5])}{', ...' if len(existing) > 5 else ''}); "
                                    "nothing was written. Import into a new folder, or pass --force to "
                                    "replace those folders")
        writes = []  # (PlacedNotebook, bytes, file time)
        for st, chosen, si in plan:
            writes += read_chosen(chosen, si, dest / st.folder, report.unplaced)
        if dry_run:
            return report
        _write(dest, report, writes)
        return report


def _export_top(source: Path, dest: Path, stack: ExitStack) -> list:
    """The export's top-level entries (hidden ones left out), inside any folder or zip around
    them; its zips stay open until `stack` closes."""
    if source.is_dir():
        if dest.resolve() == source.resolve():
            raise LmsImportError("DEST must not be the export's own folder")
        root = folder_tree(source, "", dest.resolve())
    else:
        try:
            root = zip_tree(open_zip(source, stack), source.name, "")
        except (zipfile.BadZipFile, OSError) as e:
            raise LmsImportError(f"{source}: not a readable zip ({e})") from None
    top = visible(root.children)
    # A folder (or zip) around the export: Gradescope's `assignment_<id>_export/`, a folder
    # the zip was unpacked into.
    while len(top) == 1 and not is_student_entry(top[0]) and (
            top[0].is_dir or top[0].name.lower().endswith(".zip")):
        node = top[0]
        if not node.is_dir:
            try:
                node = zip_tree(open_zip(node.read(), stack), node.name, node.origin)
            except Exception as e:
                raise LmsImportError(f"{node.origin}: not a readable zip ({e})") from None
        top = visible(node.children)
    if not top:
        raise LmsImportError(f"{source}: empty, no submissions in it")
    return top


def _plan(col: Collector, report: ImportReport, importer: Placer, found: str) -> list[tuple[StudentFiles, dict, list]]:
    """Per student, in folder order: the files chosen for each chapter, and the student's
    entry of the report (added to `report.students`)."""
    plan: list[tuple[StudentFiles, dict, list]] = []
    for st in sorted(col.students.values(), key=lambda s: s.folder):
        si = report.students[st.folder] = StudentImport(st.folder, st.key, st.name, st.id_kind,
                                                        st.email, notes=list(st.notes))
        plan.append((st, choose(importer, st, si, report.unplaced, found), si))
    return plan


def _write(dest: Path, report: ImportReport, writes: list) -> None:
    """Every student's folder made afresh (a file or link in its place removed), their notebooks
    written with their file times, then students.csv and the report."""
    dest.mkdir(parents=True, exist_ok=True)
    for si in report.students.values():
        folder = dest / si.folder
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        elif folder.exists() or folder.is_symlink():
            folder.unlink()
        folder.mkdir()
    for placed, data, mtime in writes:
        placed.path.write_bytes(data)
        if mtime is not None:
            os.utime(placed.path, (mtime, mtime))
    _write_students_csv(report)
    report.written = True
    (dest / REPORT_FILE).write_text(report.summary() + "\n", encoding="utf-8")


def _name_folders(students) -> None:
    """Each student's folder: '<name>_<id>' (ASCII letters, digits and _), unique, the same on
    every import of the same export."""
    used: set = set()
    for s in sorted(students, key=lambda s: (s.key, s.name)):
        base = "_".join(p for p in (_slug(s.name), _slug(s.key)) if p) or "student"
        folder, n = base, 2
        while folder.lower() in used:
            folder, n = f"{base}_{n}", n + 1
        used.add(folder.lower())
        s.folder = folder


CSV_COLUMNS = ["student", "lms", "id_kind", "lms_id", "name", "email", "notes"]


def _write_students_csv(report: ImportReport) -> None:
    """DEST/students.csv: one row per student folder (the `student` of batch's CSV) with the LMS's
    id for the student. Rows of other imports into the same DEST are kept."""
    path = report.dest / STUDENTS_CSV
    rows = {}
    if path.exists():
        try:
            with open(path, newline="", encoding="utf-8") as f:
                rows = {r["student"]: r for r in csv.DictReader(f) if r.get("student")}
        except (OSError, ValueError, KeyError):
            rows = {}
    for s in report.students.values():
        rows[s.folder] = {"student": s.folder, "lms": report.lms, "id_kind": s.id_kind, "lms_id": s.lms_id,
                          "name": s.name, "email": s.email, "notes": "; ".join(gradebook_notes(report, s))}
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for name in sorted(rows):
            w.writerow({k: cell(v) for k, v in rows[name].items()})  # (names are the students' text)


def gradebook_notes(report: ImportReport, s: StudentImport) -> list[str]:
    """What the gradebook's Notes and the class report say of this student's import: the LMS's
    notes (LATE, a group), the zips their placed notebooks were unpacked from, and every file of
    theirs that was not placed, with the reason."""
    zips = sorted({p.source[:p.source.lower().index(".zip/") + 4] for p in s.placed.values()
                   if ".zip/" in p.source.lower()})
    return (list(s.notes) + [f"unpacked {z}" for z in zips]
            + [f"not placed: {u.source} ({u.reason})" for u in report.unplaced if u.student == s.folder])


# -- the command line ------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", type=Path, help="the LMS's submissions download: a .zip or the folder it unzips to")
    p.add_argument("dest", type=Path, help="the class folder to write (one folder per student), for `batch`")
    p.add_argument("--lms", choices=["auto", *LMS_NAMES], default="auto",
                   help="which LMS made the export (default: auto, from its file names)")
    p.add_argument("--force", action="store_true",
                   help="replace student folders that DEST already has (default: refuse, write nothing)")
    p.add_argument("--dry-run", action="store_true", help="say what would be imported; write nothing")


def run(args: argparse.Namespace, settings=None) -> int:
    """The command: 0 when some notebook was placed, 1 when nothing gradable was found, 2 when the
    export cannot be imported (or DEST has its students' folders, without --force). settings:
    the command line's (`settings.Settings`; default read from the environment now)."""
    from ..settings import Settings

    settings = settings or Settings.from_env()
    try:
        report = import_submissions(args.source, args.dest, args.lms, force=args.force, dry_run=args.dry_run,
                                    max_zip_bytes=settings.max_student_zip_bytes)
    except LmsImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.placed_count else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m autograder.lms.submissions",
        description="Import a Canvas, Moodle or Gradescope submissions download into one folder per "
                    "student (DEST/<student>/NN_chapter.ipynb) for `python -m autograder batch DEST`; "
                    "also writes DEST/students.csv (each folder's LMS student id) and DEST/import_report.txt.",
        epilog="Canvas: <lastfirst>[_LATE]_<user id>_<submission id>_<file>[-N].ipynb in one folder. Moodle: "
               "<Full Name>_<participant id>_assignsubmission_file_/ folders. Gradescope: submission_<id>/ "
               "folders and submission_metadata.yml. Exit status: 0 notebooks placed, 1 nothing gradable "
               "found, 2 the export cannot be read or DEST already has these students.")
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

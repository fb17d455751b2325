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
import codecs
import csv
import io
import json
import os
import re
import shutil
import sys
import time
import unicodedata
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..shared.contract import CHAPTER_IDS, CHAPTERS, chapter_for_filename
from ..report.csv_safe import cell

LMS_NAMES = {"canvas": "Canvas", "moodle": "Moodle", "gradescope": "Gradescope"}
ID_KINDS = {"canvas": "Canvas user id", "moodle": "Moodle participant id", "gradescope": "Gradescope SID"}
MAX_FILE_BYTES = 256 << 20  # a file read from a zip (a student's notebook or zip); more is refused
MAX_ZIP_DEPTH = 3           # zips inside zips inside the export
MAX_STUDENT_ZIP_BYTES = 256 << 20  # a student's zips, unpacked to temporary files (not memory), in all
REPORT_FILE = "import_report.txt"
STUDENTS_CSV = "students.csv"
LATE_NOTE = "LATE: Canvas marked the submission late"

# Files that operating systems add to folders and zips: never a student's work, never listed.
_JUNK = re.compile(r"^(__MACOSX|\.DS_Store|Thumbs\.db|desktop\.ini|\._.*)$", re.IGNORECASE)
_NOTEBOOK = re.compile(r"\.ipynb(\.txt|\.json)?$", re.IGNORECASE)  # (browsers add .txt/.json)
_ARCHIVES = (".rar", ".7z", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".zst")

_CANVAS = re.compile(r"^(?P<name>[^_]+?)(?P<late>_LATE)?_(?P<uid>\d+)_(?P<sid>\d+)_(?P<orig>.+)$")
_CANVAS_NO_SID = re.compile(r"^(?P<name>[^_]+?)(?P<late>_LATE)?_(?P<uid>\d+)_(?P<orig>.+)$")  # (online text)
_MOODLE_DIR = re.compile(r"^(?P<name>.+?)_(?P<pid>\d+)_assignsubmission_(?P<plugin>[A-Za-z]+)_?$")
_MOODLE_FILE = re.compile(r"^(?P<name>.+?)_(?P<pid>\d+)_assignsubmission_(?P<plugin>[A-Za-z]+)_(?P<orig>.+)$")
_GS_DIR = re.compile(r"^submission_(?P<id>\d+)$")
_GS_FILE = re.compile(r"^submission_(?P<id>\d+)\.[A-Za-z0-9]+$")  # (a PDF assignment's upload)
GS_METADATA = "submission_metadata.yml"


class LmsImportError(Exception):
    """The export cannot be imported at all (not found, not an export, a damaged zip)."""


class DestinationExists(LmsImportError):
    """DEST already has a folder of a student of this export (use force=True / --force)."""


# -- results ---------------------------------------------------------------------------------------
@dataclass
class PlacedNotebook:
    chapter: str
    path: Path    # where it was written (DEST/<student>/<chapter>.ipynb)
    source: str   # where it came from, inside the export ("a.zip/b/05_masks.ipynb")
    notes: list = field(default_factory=list)  # e.g. "re-encoded from UTF-16 (LE, with BOM) to UTF-8"


@dataclass
class Choice:
    """A chapter for which a student handed in more than one notebook."""

    student: str  # folder name
    chapter: str
    chosen: str   # source of the notebook placed
    others: list  # sources of the ones not placed
    reason: str   # why the chosen one counts as the newest

    def describe(self) -> str:
        return (f"{self.student} {self.chapter}: chose {self.chosen} over {', '.join(self.others)} "
                f"({self.reason})")


@dataclass
class Unplaced:
    source: str        # where it is, inside the export
    reason: str
    student: str | None = None  # the folder of the student it belongs to, when known


@dataclass
class StudentImport:
    folder: str   # the folder name in DEST, and the student's name in `batch`'s CSV
    lms_id: str   # the student's id as the LMS names it (see `id_kind`)
    name: str
    id_kind: str = ""  # "Canvas user id", "Moodle participant id", "Gradescope SID" (or email)
    email: str = ""
    placed: dict = field(default_factory=dict)   # chapter id -> PlacedNotebook
    choices: list = field(default_factory=list)  # [Choice]
    notes: list = field(default_factory=list)    # e.g. "Canvas marked the submission late"


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


# -- the export as a tree of nodes -----------------------------------------------------------------
@dataclass
class _Node:
    name: str
    origin: str                       # its path inside the export, for the report
    children: list | None = None      # a folder's (None for a file)
    read: Callable[[], bytes] | None = None
    mtime: float | None = None
    size: int = 0
    open: Callable | None = None      # a zip member's stream (read in pieces, not whole)

    @property
    def is_dir(self) -> bool:
        return self.children is not None


def _join(origin: str, name: str) -> str:
    return f"{origin}/{name}" if origin else name


def _folder_tree(path: Path, origin: str, skip: Path | None) -> _Node:
    node = _Node(path.name, origin, children=[])
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as e:
        raise LmsImportError(f"cannot read {path}: {e.strerror or e}") from None
    for e in entries:
        p = Path(e.path)
        if skip is not None and p.resolve() == skip:
            continue
        if e.is_dir(follow_symlinks=False):
            node.children.append(_folder_tree(p, _join(origin, e.name), skip))
        elif e.is_symlink():
            node.children.append(_Node(e.name, _join(origin, e.name), read=_refuse_link, size=0))
        elif e.is_file():
            st = e.stat()
            node.children.append(_Node(e.name, _join(origin, e.name), read=p.read_bytes,
                                       mtime=st.st_mtime, size=st.st_size))
    return node


def _refuse_link() -> bytes:
    raise OSError("a symbolic link: not followed")


def _zip_tree(zf: zipfile.ZipFile, name: str, origin: str) -> _Node:
    """The zip's members as a tree (folders implied by member names included)."""
    root = _Node(name, origin, children=[])
    dirs = {(): root}

    def folder(parts: tuple) -> _Node:
        if parts not in dirs:
            parent = folder(parts[:-1])
            dirs[parts] = _Node(parts[-1], _join(parent.origin, parts[-1]), children=[])
            parent.children.append(dirs[parts])
        return dirs[parts]

    for info in zf.infolist():
        parts = tuple(p for p in info.filename.replace("\\", "/").split("/") if p not in ("", "."))
        if not parts:
            continue
        if info.is_dir():
            folder(parts)
            continue
        parent = folder(parts[:-1])
        try:
            mtime = time.mktime(info.date_time + (0, 0, -1))
        except (OverflowError, ValueError):
            mtime = None
        parent.children.append(_Node(parts[-1], _join(parent.origin, parts[-1]), read=_member_reader(zf, info),
                                     mtime=mtime, size=info.file_size, open=lambda info=info: zf.open(info)))
    for node in dirs.values():
        node.children.sort(key=lambda n: n.name)
    return root


def _member_reader(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Callable[[], bytes]:
    def read() -> bytes:
        if info.file_size > MAX_FILE_BYTES:
            raise ValueError(f"{info.file_size / 2**20:.0f} MiB, more than the {MAX_FILE_BYTES >> 20} MiB "
                             "the importer reads")
        with zf.open(info) as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"more than the {MAX_FILE_BYTES >> 20} MiB the importer reads")
        return data
    return read


def _spool(node: _Node, stack: ExitStack, allowance: int):
    """The zip `node` copied into a temporary file in pieces (a zip of zips is never held in
    memory), at most `allowance` bytes of it (ValueError beyond: a 2 MB zip of eight 250 MiB zips
    would otherwise be 2 GB). Returns (the file, its size)."""
    import tempfile

    f = stack.enter_context(tempfile.TemporaryFile())
    with (node.open() if node.open else io.BytesIO(node.read())) as src:
        size = 0
        while chunk := src.read(1 << 20):
            size += len(chunk)
            if size > allowance:
                raise ValueError(f"more than the {MAX_STUDENT_ZIP_BYTES >> 20} MiB of zips the importer "
                                 "unpacks for one student")
            f.write(chunk)
    f.seek(0)
    return f, size


def _open_zip(data_or_path, stack: ExitStack) -> zipfile.ZipFile:
    source = io.BytesIO(data_or_path) if isinstance(data_or_path, bytes) else data_or_path
    zf = zipfile.ZipFile(source)
    stack.enter_context(zf)
    return zf


def _is_junk(node: _Node) -> bool:
    return bool(_JUNK.match(node.name))


def _visible(children: list) -> list:
    return [c for c in children if not _is_junk(c)]


# -- file names ------------------------------------------------------------------------------------
_DASH = re.compile(r"^(?P<base>.+?)-(?P<n>\d{1,3})$")
_PAREN = re.compile(r"^(?P<base>.+?)\s?\((?P<n>\d{1,3})\)$")
_COPY = re.compile(r"^(?P<base>.+?) copy(?: (?P<n>\d{1,3}))?$", re.IGNORECASE)  # (macOS Finder)


def _numbering(name: str) -> tuple[str, int, int]:
    """(base name, Canvas's -N, a browser's (N) or Finder's "copy N") of a notebook's file name:
    '05_masks (2)-1.ipynb' -> ('05_masks', 1, 2). Unnumbered: 0; a bare "copy": 1."""
    stem = _NOTEBOOK.sub("", name)
    dash = paren = 0
    m = _DASH.match(stem)
    if m:
        stem, dash = m["base"], int(m["n"])
    m = _PAREN.match(stem)
    if m:
        stem, paren = m["base"], int(m["n"])
    else:
        m = _COPY.match(stem)
        if m:
            stem, paren = m["base"], int(m["n"] or 1)
    return stem.strip(), dash, paren


def chapter_of(name: str) -> str | None:
    """The chapter id a submitted notebook's name names, or None: the grader's own rule
    (`contract.chapter_for_filename`) on the name without its copy numbering, case, spaces and
    hyphens ('04_Positional_Encoding-2.ipynb', '05 Masks (1).ipynb'), else the chapter's name
    without its number at the end of the name ('my_masks.ipynb')."""
    base, _, _ = _numbering(name)
    norm = re.sub(r"_+", "_", re.sub(r"[\s\-.]+", "_", base.lower())).strip("_")
    ch = chapter_for_filename(norm + ".ipynb")
    if ch is not None:
        return ch.id
    named = [c for c in CHAPTER_IDS if norm == c[3:] or norm.endswith("_" + c[3:])]
    return named[0] if len(named) == 1 else None


def _slug(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _why_not_notebook(name: str) -> str:
    lower = name.lower()
    ext = os.path.splitext(lower)[1]
    if ext == ".pdf":
        return "a PDF, not a notebook: the grader runs .ipynb notebooks (ask the student for the .ipynb)"
    if ext in (".html", ".htm"):
        return "an HTML page (online text or an exported notebook), not a notebook"
    if ext == ".py":
        return "a Python script, not a notebook (the grader runs .ipynb notebooks)"
    if ext in _ARCHIVES or lower.endswith((".tar.gz", ".tar.bz2", ".tar.xz")):
        return f"an archive ({ext}) the importer does not open: only .zip archives are unpacked"
    if not ext:
        return "not a notebook (a file without an extension)"
    return f"not a notebook ({ext} file)"


# -- encodings -------------------------------------------------------------------------------------
def to_utf8(data: bytes) -> tuple[bytes, str | None]:
    """The notebook's bytes as UTF-8, and a note when they had to be re-encoded (None if they
    were UTF-8 already: written unchanged)."""
    for bom, codec, label in ((codecs.BOM_UTF32_LE, "utf-32", "UTF-32 (LE, with BOM)"),
                              (codecs.BOM_UTF32_BE, "utf-32", "UTF-32 (BE, with BOM)"),
                              (codecs.BOM_UTF16_LE, "utf-16", "UTF-16 (LE, with BOM)"),
                              (codecs.BOM_UTF16_BE, "utf-16", "UTF-16 (BE, with BOM)")):
        if data.startswith(bom):
            try:
                return data.decode(codec).encode("utf-8"), f"re-encoded from {label} to UTF-8"
            except UnicodeDecodeError:
                break
    try:
        data.decode("utf-8")
        return data, None
    except UnicodeDecodeError:
        pass
    if len(data) >= 4 and len(data) % 2 == 0:  # UTF-16 without a BOM: '{' then a zero byte, or the reverse
        for codec, zeros, label in (("utf-16-le", data[1::2], "LE"), ("utf-16-be", data[0::2], "BE")):
            if zeros.count(0) > 0.9 * len(zeros):
                try:
                    return data.decode(codec).encode("utf-8"), f"re-encoded from UTF-16 ({label}, no BOM) to UTF-8"
                except UnicodeDecodeError:
                    pass
    try:
        text, label = data.decode("cp1252"), "Windows-1252"
    except UnicodeDecodeError:
        text, label = data.decode("latin-1"), "Latin-1"
    return text.encode("utf-8"), f"not UTF-8: re-encoded from {label} (a guess) to UTF-8"


# -- the per-LMS layouts ---------------------------------------------------------------------------
@dataclass
class _Student:
    key: str       # the LMS's id for the student
    name: str
    id_kind: str
    email: str = ""
    notes: list = field(default_factory=list)
    items: list = field(default_factory=list)  # [(node, name to read it by, LMS order or None)]
    folder: str = ""


class _Collector:
    """Students found in the export, and what could not be attributed to anyone."""

    def __init__(self, lms: str):
        self.lms = lms
        self.students: dict[str, _Student] = {}
        self.unplaced: list[Unplaced] = []

    def student(self, key: str, name: str, id_kind: str | None = None, email: str = "") -> _Student:
        s = self.students.get(key)
        if s is None:
            s = self.students[key] = _Student(key, name, id_kind or ID_KINDS[self.lms], email)
        return s

    def skip(self, node: _Node, reason: str) -> None:
        self.unplaced.append(Unplaced(node.origin, reason))


def _canvas(top: list, col: _Collector) -> None:
    known = {m["uid"] for m in (_CANVAS.match(n.name) for n in top) if m}
    for node in top:
        m = _CANVAS.match(node.name)
        if not m:  # a file without a submission id (online text): only for a student seen already
            m = _CANVAS_NO_SID.match(node.name)
            if m and m["uid"] not in known:
                m = None
        if not m:
            col.skip(node, "not named like a Canvas download (<lastfirst>[_LATE]_<user id>_<submission id>_"
                           "<file name>): whose it is is unknown")
            continue
        s = col.student(m["uid"], m["name"])
        if m["late"] and LATE_NOTE not in s.notes:
            s.notes.append(LATE_NOTE)
        order = int(m["sid"]) if "sid" in m.groupdict() else None
        s.items.append((node, m["orig"], order))


def _moodle(top: list, col: _Collector) -> None:
    for node in top:
        m = (_MOODLE_DIR if node.is_dir else _MOODLE_FILE).match(node.name)
        if not m:
            col.skip(node, "not named like a Moodle download (<Full Name>_<participant id>_assignsubmission_"
                           "file_...): whose it is is unknown")
            continue
        s = col.student(m["pid"], m["name"].strip())
        s.items.append((node, node.name if node.is_dir else m["orig"], None))


def _gradescope(top: list, col: _Collector) -> None:
    meta_node = next((n for n in top if n.name == GS_METADATA and not n.is_dir), None)
    if meta_node is None:
        raise LmsImportError(f"no {GS_METADATA} in the Gradescope export: whose submission is whose is unknown")
    try:
        meta = parse_gradescope_metadata(meta_node.read())
    except Exception as e:
        raise LmsImportError(f"{meta_node.origin}: cannot read it ({type(e).__name__}: {e})") from None
    for node in top:
        if node is meta_node:
            continue
        m = (_GS_DIR if node.is_dir else _GS_FILE).match(node.name)
        if not m:
            col.skip(node, "not a Gradescope submission (submission_<id>): whose it is is unknown")
            continue
        sub_id = m["id"]
        entry = meta.get(f"submission_{sub_id}")
        if not entry or not entry["submitters"]:
            col.skip(node, f"submission {sub_id} is not in {GS_METADATA}: whose it is is unknown")
            continue
        people = entry["submitters"]
        for person in people:
            key, kind = ((person["sid"], "Gradescope SID") if person["sid"]
                         else (person["email"], "Gradescope email") if person["email"]
                         else (f"submission_{sub_id}", "Gradescope submission id"))
            s = col.student(key, person["name"], kind, person["email"])
            if len(people) > 1:
                others = ", ".join(p["name"] or p["email"] for p in people if p is not person)
                note = f"group submission {sub_id} with {others}"
                if note not in s.notes:
                    s.notes.append(note)
            s.items.append((node, node.name, int(sub_id)))


def parse_gradescope_metadata(data: bytes) -> dict:
    """Gradescope's submission_metadata.yml -> {"submission_<id>": {"submitters": [{"name", "sid",
    "email"}], "created_at": str}}. Its keys are Ruby symbols (':submission_123:', ':name:'),
    which YAML reads as strings with a leading colon. With PyYAML where it is installed (the grader
    does not need it), else with a reader of the block-style subset Gradescope writes."""
    text = data.decode("utf-8-sig")
    try:
        import yaml
    except ImportError:
        yaml = None
    raw = None
    if yaml is not None:
        class Loader(yaml.SafeLoader):  # Ruby's tags (!ruby/hash:...) read as plain YAML
            pass

        def untagged(loader, suffix, node):
            if isinstance(node, yaml.MappingNode):
                return loader.construct_mapping(node, deep=True)
            if isinstance(node, yaml.SequenceNode):
                return loader.construct_sequence(node, deep=True)
            return loader.construct_scalar(node)

        Loader.add_multi_constructor("!", untagged)
        try:
            raw = yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError:
            raw = None
    if raw is None:
        raw = _mini_yaml(text)
    if not isinstance(raw, dict):
        raise ValueError("not a mapping of submissions")
    out = {}
    for key, value in raw.items():
        key = str(key).lstrip(":")
        if not key.startswith("submission_") or not isinstance(value, dict):
            continue
        value = {str(k).lstrip(":"): v for k, v in value.items()}
        people = []
        for p in value.get("submitters") or []:
            if isinstance(p, dict):
                p = {str(k).lstrip(":"): v for k, v in p.items()}
                people.append({k: "" if p.get(k) is None else str(p.get(k)).strip()
                               for k in ("name", "sid", "email")})
        out[key] = {"submitters": people, "created_at": str(value.get("created_at") or "")}
    return out


def _mini_yaml(text: str):
    """Block mappings, block sequences (also at their key's indentation, as Ruby writes them),
    plain and quoted scalars, `|`/`>` blocks and plain scalars continued on deeper lines; every
    scalar a string (or None / [] / {}). Enough for Gradescope's metadata."""
    lines = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or stripped in ("---", "..."):
            continue
        lines.append([len(raw) - len(raw.lstrip(" ")), raw.strip()])
    pos = 0

    def scalar(v: str):
        v = v.strip()
        if v in ("", "~", "null"):
            return None
        if v == "[]":
            return []
        if v == "{}":
            return {}
        if len(v) >= 2 and v[0] == v[-1] == "'":
            return v[1:-1].replace("''", "'")
        if len(v) >= 2 and v[0] == v[-1] == '"':
            try:
                return json.loads(v)
            except ValueError:
                return v[1:-1]
        return v

    def continued(indent: int, first: str):
        """The scalar `first` of a line at `indent`, with the deeper lines that continue it."""
        nonlocal pos
        parts = []
        while pos < len(lines) and lines[pos][0] > indent:
            parts.append(lines[pos][1])
            pos += 1
        if first in ("|", ">", "|-", ">-", "|+", ">+"):
            return ("\n" if first[0] == "|" else " ").join(parts)
        return scalar(" ".join([first] + parts))

    def block(indent: int):
        nonlocal pos
        if pos >= len(lines):
            return None
        if lines[pos][1].startswith("-") and lines[pos][1][1:2] in ("", " "):
            items = []
            while pos < len(lines) and lines[pos][0] == indent and lines[pos][1][:1] == "-" \
                    and lines[pos][1][1:2] in ("", " "):
                rest = lines[pos][1][1:].lstrip()
                if not rest:
                    pos += 1
                    items.append(block(lines[pos][0]) if pos < len(lines) and lines[pos][0] > indent else None)
                elif _KEY.match(rest):  # "- key: value": a mapping whose first line this is
                    lines[pos] = [indent + len(lines[pos][1]) - len(rest), rest]
                    items.append(block(lines[pos][0]))
                else:
                    pos += 1
                    items.append(continued(indent, rest))
            return items
        mapping = {}
        while pos < len(lines) and lines[pos][0] == indent and not (
                lines[pos][1][:1] == "-" and lines[pos][1][1:2] in ("", " ")):
            m = _KEY.match(lines[pos][1])
            if not m:
                raise ValueError(f"cannot read line {lines[pos][1]!r}")
            key, value = str(scalar(m["key"])), (m["value"] or "").strip()
            pos += 1
            if value:
                mapping[key] = continued(indent, value)
            elif pos < len(lines) and (lines[pos][0] > indent or (
                    lines[pos][0] == indent and lines[pos][1][:1] == "-")):
                mapping[key] = block(lines[pos][0])
            else:
                mapping[key] = None
        return mapping

    return block(lines[0][0]) if lines else None


_KEY = re.compile(r"""^(?P<key>"[^"]*"|'[^']*'|\S.*?):(?:\s+(?P<value>.*))?$""")


def _detect(top: list) -> str | None:
    """Which LMS made an export with these top-level entries (None: none recognised)."""
    names = {n.name for n in top}
    if GS_METADATA in names or any(n.is_dir and _GS_DIR.match(n.name) for n in top):
        return "gradescope"
    scores = {
        "moodle": sum(bool((_MOODLE_DIR if n.is_dir else _MOODLE_FILE).match(n.name)) for n in top),
        "canvas": sum(bool(not n.is_dir and _CANVAS.match(n.name)) for n in top),
    }
    best = max(scores, key=scores.get)
    return best if scores[best] else None


def _is_student_entry(node: _Node) -> bool:
    return bool(_MOODLE_DIR.match(node.name) or _GS_DIR.match(node.name) or _CANVAS.match(node.name)
                or node.name == GS_METADATA)


# -- a student's files -----------------------------------------------------------------------------
@dataclass
class _Candidate:
    chapter: str
    source: str
    read: Callable[[], bytes]
    order: int | None   # the LMS's (a submission id)
    base: str
    dash: int
    paren: int
    mtime: float | None


class _Importer:
    def __init__(self, lms: str, stack: ExitStack):
        self.lms, self.stack = lms, stack
        self.unpacked: dict = {}  # student folder -> bytes of their zips spooled (_spool)

    def files(self, student: _Student, unplaced: list) -> list[_Candidate]:
        out: list[_Candidate] = []
        for node, name, order in student.items:
            self.walk(node, name, order, student, out, unplaced, depth=0)
        return out

    def walk(self, node: _Node, name: str, order, student: _Student, out: list, unplaced: list,
             depth: int) -> None:
        def skip(reason: str) -> None:
            unplaced.append(Unplaced(node.origin, reason, student.folder))

        if _is_junk(node):
            return
        if node.is_dir:
            if node.name == ".ipynb_checkpoints":
                return skip("Jupyter's autosaved checkpoints, not the notebook handed in")
            if node.name.startswith("."):
                return skip("a hidden folder, not handed-in work")
            kids = _visible(node.children)
            if not kids:
                return skip("an empty folder: nothing in it to grade")
            for kid in kids:
                self.walk(kid, kid.name, order, student, out, unplaced, depth)
            return
        if name.startswith("."):
            return skip("a hidden file, not a notebook")
        if name.lower().endswith(".zip"):
            if depth >= MAX_ZIP_DEPTH:
                return skip(f"a zip inside {MAX_ZIP_DEPTH} zips: not unpacked")
            try:
                used = self.unpacked.get(student.folder, 0)
                data, size = _spool(node, self.stack, MAX_STUDENT_ZIP_BYTES - used)
                self.unpacked[student.folder] = used + size
                zf = _open_zip(data, self.stack)
                tree = _zip_tree(zf, node.name, node.origin)
            except zipfile.BadZipFile as e:
                return skip(f"a damaged zip, not unpacked ({e})")
            except Exception as e:
                return skip(f"a zip that cannot be read ({type(e).__name__}: {e})")
            kids = _visible(tree.children)
            if not kids:
                return skip("an empty zip")
            for kid in kids:
                self.walk(kid, kid.name, order, student, out, unplaced, depth + 1)
            return
        if not _NOTEBOOK.search(name):
            return skip(_why_not_notebook(name))
        chapter = chapter_of(name) or (chapter_of(node.name) if node.name != name else None)
        if chapter is None:
            return skip("a notebook whose name names no chapter (expected a chapter's number and name, "
                        "e.g. 05_masks.ipynb)")
        base, dash, paren = _numbering(name)
        out.append(_Candidate(chapter, node.origin, node.read, order, base.lower(), dash, paren, node.mtime))


def _newest(cands: list[_Candidate], lms: str) -> tuple[list, str]:
    """A chapter's notebooks, the newest first, and why the first is the newest. By the LMS's
    order (a later submission id), then, among copies of one file name, its numbering (Canvas's
    -N, then a browser's (N)), then the file's time."""
    same_base = len({c.base for c in cands}) == 1

    def key(c: _Candidate):
        return (c.order if c.order is not None else -1, c.dash if same_base else 0,
                c.paren if same_base else 0, c.mtime if c.mtime is not None else float("-inf"), c.source)

    ranked = sorted(cands, key=key, reverse=True)
    best, runner = ranked[0], ranked[1]
    kb, kr = key(best), key(runner)
    label = f"{LMS_NAMES.get(lms, lms)} submission id"
    if kb[0] != kr[0]:
        why = f"the later {label}: {kb[0]} > {kr[0]}"
    elif kb[1] != kr[1]:
        why = f"the higher re-submission number: -{kb[1]} over {f'-{kr[1]}' if kr[1] else 'none'}"
    elif kb[2] != kr[2]:
        why = f"the higher copy number: ({kb[2]}) over {f'({kr[2]})' if kr[2] else 'none'}"
    elif kb[3] != kr[3]:
        why = f"the newer file time: {_when(kb[3])} > {_when(kr[3])}"
    else:
        why = "no numbering or file time tells them apart: chose the last by name"
    return ranked, why


def _when(t: float) -> str:
    return "unknown" if t == float("-inf") else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# -- the import ------------------------------------------------------------------------------------
def import_submissions(source, dest, lms: str = "auto", force: bool = False,
                       dry_run: bool = False) -> ImportReport:
    """Import the LMS export `source` (a folder or .zip) into `dest`: one folder per student with
    their notebooks named by chapter, `students.csv` and `import_report.txt`. See the module's
    docstring. Raises LmsImportError (DestinationExists without `force` where a student's folder
    exists in `dest` already; nothing is written then)."""
    source, dest = Path(source), Path(dest)
    if lms not in ("auto", *LMS_NAMES):
        raise LmsImportError(f"unknown LMS {lms!r} (auto, {', '.join(LMS_NAMES)})")
    if not source.exists():
        raise LmsImportError(f"{source}: no such file or folder")
    with ExitStack() as stack:
        if source.is_dir():
            if dest.resolve() == source.resolve():
                raise LmsImportError("DEST must not be the export's own folder")
            root = _folder_tree(source, "", dest.resolve())
        else:
            try:
                root = _zip_tree(_open_zip(source, stack), source.name, "")
            except (zipfile.BadZipFile, OSError) as e:
                raise LmsImportError(f"{source}: not a readable zip ({e})") from None
        top = _visible(root.children)
        # A folder (or zip) around the export: Gradescope's `assignment_<id>_export/`, a folder
        # the zip was unpacked into.
        while len(top) == 1 and not _is_student_entry(top[0]) and (
                top[0].is_dir or top[0].name.lower().endswith(".zip")):
            node = top[0]
            if not node.is_dir:
                try:
                    node = _zip_tree(_open_zip(node.read(), stack), node.name, node.origin)
                except Exception as e:
                    raise LmsImportError(f"{node.origin}: not a readable zip ({e})") from None
            top = _visible(node.children)
        if not top:
            raise LmsImportError(f"{source}: empty, no submissions in it")
        found = _detect(top) if lms == "auto" else lms
        if found is None:
            raise LmsImportError(f"{source}: not recognised as a Canvas, Moodle or Gradescope export "
                                 "(see --help for their file names); name the LMS with --lms")
        col = _Collector(found)
        if found == "canvas":
            _canvas(top, col)
        elif found == "moodle":
            _moodle(top, col)
        else:
            _gradescope(top, col)
        report = ImportReport(found, source, dest, unplaced=col.unplaced)
        _name_folders(col.students.values())
        importer = _Importer(found, stack)
        plan: list[tuple[_Student, dict, list]] = []
        for st in sorted(col.students.values(), key=lambda s: s.folder):
            si = report.students[st.folder] = StudentImport(st.folder, st.key, st.name, st.id_kind,
                                                            st.email, notes=list(st.notes))
            plan.append((st, _choose(importer, st, si, report.unplaced, found), si))

        existing = report.existing = [st.folder for st, _, _ in plan if (dest / st.folder).exists()]
        if existing and not force and not dry_run:
            raise DestinationExists(f"{dest} already has folders of {len(existing)} student{_s(existing)} of "
                                    f"this export ({', '.join(existing[:5])}{', ...' if len(existing) > 5 else ''}); "
                                    "nothing was written. Import into a new folder, or pass --force to "
                                    "replace those folders")
        writes = []  # (PlacedNotebook, bytes, file time)
        for st, chosen, si in plan:
            writes += _read_chosen(chosen, si, dest / st.folder, report.unplaced)
        if dry_run:
            return report
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
        return report


def _choose(importer: _Importer, st: _Student, si: StudentImport, unplaced: list, lms: str) -> dict:
    """chapter -> the student's notebooks for it, the newest first (`si.choices` says why)."""
    cands = importer.files(st, unplaced)
    chosen = {}
    for chapter in (c for c in CHAPTERS if any(x.chapter == c for x in cands)):
        mine = [x for x in cands if x.chapter == chapter]
        if len(mine) > 1:
            mine, why = _newest(mine, lms)
            si.choices.append(Choice(st.folder, chapter, mine[0].source, [x.source for x in mine[1:]], why))
        chosen[chapter] = mine
    return chosen


def _read_chosen(chosen: dict, si: StudentImport, folder: Path, unplaced: list) -> list:
    """(PlacedNotebook, UTF-8 bytes, file time) of each chapter's newest readable notebook."""
    writes = []
    for chapter, ranked in chosen.items():
        failed = []
        for cand in ranked:  # the newest that can be read
            try:
                data = cand.read()
                break
            except Exception as e:
                failed.append(cand.source)
                unplaced.append(Unplaced(cand.source, f"cannot be read ({type(e).__name__}: {e})", si.folder))
        else:
            continue
        placed = si.placed[chapter] = PlacedNotebook(chapter, folder / f"{chapter}.ipynb", cand.source)
        if failed:
            placed.notes.append(f"placed instead of the newer {', '.join(failed)}, which cannot be read")
        data, note = to_utf8(data)
        if note:
            placed.notes.append(note)
        try:
            json.loads(data.decode("utf-8-sig"))
        except ValueError as e:
            placed.notes.append(f"not valid JSON ({type(e).__name__}); placed anyway: the grader "
                                "reports it to the student")
        writes.append((placed, data, cand.mtime))
    return writes


def place_submission(source, dest) -> tuple[StudentImport, list]:
    """One student's hand-in as it is uploaded (Gradescope's /autograder/submission: notebooks,
    zips of them, folders), placed the way `import` places a student's files: each chapter's
    newest notebook written to DEST/<chapter>.ipynb (zips unpacked, names read with their copy
    numbering, UTF-16 re-encoded). Returns what was placed (with choices) and what was not
    ([Unplaced]). Symbolic links are not followed."""
    source, dest = Path(source), Path(dest)
    unplaced: list = []
    with ExitStack() as stack:
        root = _folder_tree(source, "", dest.resolve())
        st = _Student("submission", "", "", folder="")
        st.items = [(node, node.name, None) for node in _visible(root.children)]
        si = StudentImport("", "", "")
        writes = _read_chosen(_choose(_Importer("gradescope", stack), st, si, unplaced, "gradescope"), si, dest,
                              unplaced)
        dest.mkdir(parents=True, exist_ok=True)
        for placed, data, mtime in writes:
            placed.path.write_bytes(data)
    return si, unplaced


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


def read_students_csv(dest) -> dict[str, dict]:
    """DEST/students.csv as {student folder: row} ({} where there is none): for the gradebook."""
    path = Path(dest) / STUDENTS_CSV
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


# -- the command line ------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", type=Path, help="the LMS's submissions download: a .zip or the folder it unzips to")
    p.add_argument("dest", type=Path, help="the class folder to write (one folder per student), for `batch`")
    p.add_argument("--lms", choices=["auto", *LMS_NAMES], default="auto",
                   help="which LMS made the export (default: auto, from its file names)")
    p.add_argument("--force", action="store_true",
                   help="replace student folders that DEST already has (default: refuse, write nothing)")
    p.add_argument("--dry-run", action="store_true", help="say what would be imported; write nothing")


def run(args: argparse.Namespace) -> int:
    """The command: 0 when some notebook was placed, 1 when nothing gradable was found, 2 when the
    export cannot be imported (or DEST has its students' folders, without --force)."""
    try:
        report = import_submissions(args.source, args.dest, args.lms, force=args.force, dry_run=args.dry_run)
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

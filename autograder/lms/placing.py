"""Which of a student's files goes where: each notebook's chapter from its name (however the LMS
or the browser renamed it), the newest where a chapter was handed in more than once (and why),
and every file that could not be placed with the reason."""
from __future__ import annotations


import json
import os
import re
import time
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..shared.contract import CHAPTER_IDS, CHAPTERS, chapter_for_filename
from .uploads import MAX_STUDENT_ZIP_BYTES, MAX_ZIP_DEPTH, Node, folder_tree, is_junk, open_zip, spool, visible, zip_tree, to_utf8
from .layouts import LMS_NAMES, Unplaced, StudentFiles


_NOTEBOOK = re.compile(r"\.ipynb(\.txt|\.json)?$", re.IGNORECASE)  # (browsers add .txt/.json)
_ARCHIVES = (".rar", ".7z", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".zst")


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
class StudentImport:
    folder: str   # the folder name in DEST, and the student's name in `batch`'s CSV
    lms_id: str   # the student's id as the LMS names it (see `id_kind`)
    name: str
    id_kind: str = ""  # "Canvas user id", "Moodle participant id", "Gradescope SID" (or email)
    email: str = ""
    placed: dict = field(default_factory=dict)   # chapter id -> PlacedNotebook
    choices: list = field(default_factory=list)  # [Choice]
    notes: list = field(default_factory=list)    # e.g. "Canvas marked the submission late"


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


class Placer:
    def __init__(self, lms: str, stack: ExitStack, max_zip_bytes: int = MAX_STUDENT_ZIP_BYTES):
        """max_zip_bytes: a student's zips unpacked, in all (`settings.Settings.max_student_zip_bytes`)."""
        self.lms, self.stack, self.max_zip_bytes = lms, stack, max_zip_bytes
        self.unpacked: dict = {}  # student folder -> bytes of their zips spooled (spool)

    def files(self, student: StudentFiles, unplaced: list) -> list[_Candidate]:
        out: list[_Candidate] = []
        for node, name, order in student.items:
            self.walk(node, name, order, student, out, unplaced, depth=0)
        return out

    def walk(self, node: Node, name: str, order, student: StudentFiles, out: list, unplaced: list,
             depth: int) -> None:
        def skip(reason: str) -> None:
            unplaced.append(Unplaced(node.origin, reason, student.folder))

        if is_junk(node):
            return
        if node.is_dir:
            if node.name == ".ipynb_checkpoints":
                return skip("Jupyter's autosaved checkpoints, not the notebook handed in")
            if node.name.startswith("."):
                return skip("a hidden folder, not handed-in work")
            kids = visible(node.children)
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
                data, size = spool(node, self.stack, self.max_zip_bytes - used, self.max_zip_bytes)
                self.unpacked[student.folder] = used + size
                zf = open_zip(data, self.stack)
                tree = zip_tree(zf, node.name, node.origin)
            except zipfile.BadZipFile as e:
                return skip(f"a damaged zip, not unpacked ({e})")
            except Exception as e:
                return skip(f"a zip that cannot be read ({type(e).__name__}: {e})")
            kids = visible(tree.children)
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


def choose(importer: Placer, st: StudentFiles, si: StudentImport, unplaced: list, lms: str) -> dict:
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


def read_chosen(chosen: dict, si: StudentImport, folder: Path, unplaced: list) -> list:
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


def place_submission(source, dest, max_zip_bytes: int = MAX_STUDENT_ZIP_BYTES) -> tuple[StudentImport, list]:
    """One student's hand-in as it is uploaded (Gradescope's /autograder/submission: notebooks,
    zips of them, folders), placed the way `import` places a student's files: each chapter's
    newest notebook written to DEST/<chapter>.ipynb (zips unpacked, names read with their copy
    numbering, UTF-16 re-encoded). Returns what was placed (with choices) and what was not
    ([Unplaced]). Symbolic links are not followed."""
    source, dest = Path(source), Path(dest)
    unplaced: list = []
    with ExitStack() as stack:
        root = folder_tree(source, "", dest.resolve())
        st = StudentFiles("submission", "", "", folder="")
        st.items = [(node, node.name, None) for node in visible(root.children)]
        si = StudentImport("", "", "")
        writes = read_chosen(choose(Placer("gradescope", stack, max_zip_bytes), st, si, unplaced, "gradescope"), si, dest,
                              unplaced)
        dest.mkdir(parents=True, exist_ok=True)
        for placed, data, mtime in writes:
            placed.path.write_bytes(data)
    return si, unplaced

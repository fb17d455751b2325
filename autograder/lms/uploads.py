"""Reading what students uploaded without trusting it: a folder or zip as a tree of files, links
refused, every member's size capped while it is read (a zip's own header is not believed),
nested zips spooled to a capped temporary file, junk (`__MACOSX`, `.DS_Store`) skipped, text
made UTF-8."""
from __future__ import annotations


import codecs
import io
import os
import re
import time
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..settings import MAX_STUDENT_ZIP_BYTES


MAX_FILE_BYTES = 256 << 20  # a file read from a zip (a student's notebook or zip); more is refused
MAX_ZIP_DEPTH = 3           # zips inside zips inside the export
# MAX_STUDENT_ZIP_BYTES: a student's zips, unpacked to temporary files (not memory), in all:
# the default of `Placer`'s, which is the entry point's (`settings.Settings.max_student_zip_bytes`).

# Files that operating systems add to folders and zips: never a student's work, never listed.
_JUNK = re.compile(r"^(__MACOSX|\.DS_Store|Thumbs\.db|desktop\.ini|\._.*)$", re.IGNORECASE)


class LmsImportError(Exception):
    """The export cannot be imported at all (not found, not an export, a damaged zip)."""


class DestinationExists(LmsImportError):
    """DEST already has a folder of a student of this export (use force=True / --force)."""


# -- the export as a tree of nodes -----------------------------------------------------------------
@dataclass
class Node:
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


def folder_tree(path: Path, origin: str, skip: Path | None) -> Node:
    node = Node(path.name, origin, children=[])
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as e:
        raise LmsImportError(f"cannot read {path}: {e.strerror or e}") from None
    for e in entries:
        p = Path(e.path)
        if skip is not None and p.resolve() == skip:
            continue
        if e.is_dir(follow_symlinks=False):
            node.children.append(folder_tree(p, _join(origin, e.name), skip))
        elif e.is_symlink():
            node.children.append(Node(e.name, _join(origin, e.name), read=_refuse_link, size=0))
        elif e.is_file():
            st = e.stat()
            node.children.append(Node(e.name, _join(origin, e.name), read=p.read_bytes,
                                       mtime=st.st_mtime, size=st.st_size))
    return node


def _refuse_link() -> bytes:
    raise OSError("a symbolic link: not followed")


def zip_tree(zf: zipfile.ZipFile, name: str, origin: str) -> Node:
    """The zip's members as a tree (folders implied by member names included)."""
    root = Node(name, origin, children=[])
    dirs = {(): root}

    def folder(parts: tuple) -> Node:
        if parts not in dirs:
            parent = folder(parts[:-1])
            dirs[parts] = Node(parts[-1], _join(parent.origin, parts[-1]), children=[])
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
        parent.children.append(Node(parts[-1], _join(parent.origin, parts[-1]), read=_member_reader(zf, info),
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


def spool(node: Node, stack: ExitStack, allowance: int, cap: int = MAX_STUDENT_ZIP_BYTES):
    """The zip `node` copied into a temporary file in pieces (a zip of zips is never held in
    memory), at most `allowance` bytes of it (ValueError beyond: a 2 MB zip of eight 250 MiB zips
    would otherwise be 2 GB); `cap`: the student's whole allowance, for the message. Returns
    (the file, its size)."""
    import tempfile

    f = stack.enter_context(tempfile.TemporaryFile())
    with (node.open() if node.open else io.BytesIO(node.read())) as src:
        size = 0
        while chunk := src.read(1 << 20):
            size += len(chunk)
            if size > allowance:
                raise ValueError(f"more than the {cap >> 20} MiB of zips the importer "
                                 "unpacks for one student")
            f.write(chunk)
    f.seek(0)
    return f, size


def open_zip(data_or_path, stack: ExitStack) -> zipfile.ZipFile:
    source = io.BytesIO(data_or_path) if isinstance(data_or_path, bytes) else data_or_path
    zf = zipfile.ZipFile(source)
    stack.enter_context(zf)
    return zf


def is_junk(node: Node) -> bool:
    return bool(_JUNK.match(node.name))


def visible(children: list) -> list:
    return [c for c in children if not is_junk(c)]


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

"""CSV cells a spreadsheet cannot run: every CSV the grader writes goes through `cell`.

A cell that begins with = + - @, a tab or a carriage return is read as a formula by Excel,
LibreOffice and Google Sheets (CSV or formula injection, OWASP): a student's name, file name or
notebook text could then run a formula on the instructor's machine. Such a cell gets a leading
apostrophe, which spreadsheets show as text; a plain number ("-1.5") is left as it is."""
from __future__ import annotations

import csv
import os
import re
import tempfile
from pathlib import Path

from ..untrusted_text import printable

_RISKY = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def cell(value) -> str:
    text = "" if value is None else str(value)
    if text.startswith(_RISKY) and not _NUMBER.match(text):
        return "'" + text
    return text


def row(values) -> list[str]:
    """A row's cells, printable (student text may hold control characters) and neutralised."""
    return [cell(printable(str(v)) if v is not None else "") for v in values]


def write(path, rows) -> Path:
    """Write the rows (each through `row`) to a temporary file beside `path`, then rename it
    over `path`: a reader never sees half a file, and a failure leaves the old one as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(row(r) for r in rows)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

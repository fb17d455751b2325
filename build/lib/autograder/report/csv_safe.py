"""CSV cells a spreadsheet cannot run: every CSV the grader writes goes through `cell`.

A cell that begins with = + - @, a tab or a carriage return is read as a formula by Excel,
LibreOffice and Google Sheets (CSV or formula injection, OWASP): a student's name, file name or
notebook text could then run a formula on the instructor's machine. Such a cell gets a leading
apostrophe, which spreadsheets show as text; a plain number ("-1.5") is left as it is."""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from . import atomic
from .untrusted_text import printable

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
    """Write the rows (each through `row`) whole or not at all (`atomic`): a reader never sees
    half a file, and a failure leaves the old one as it was."""
    out = io.StringIO(newline="")
    csv.writer(out).writerows(row(r) for r in rows)
    return atomic.write_text(path, out.getvalue())

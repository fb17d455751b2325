"""Text from a student (exception messages, printed output, names, file names) made safe to show.

A report is read on the instructor's terminal, in a browser, in Gradescope: a control character
there is an instruction, not text (ANSI escapes erase lines and print a fake "Total: 13 / 13";
a bidi override reorders what follows). `printable` shows each one escaped instead, so what the
student wrote stays visible and nothing in it acts.
"""
from __future__ import annotations

_CONTROL = [c for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"]  # C0, DEL, C1
_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]  # embeddings, overrides, isolates
_SHOWN = {c: f"\\x{c:02x}" for c in _CONTROL} | {c: f"\\u{c:04x}" for c in _BIDI}


def printable(text: str) -> str:
    """`text` with every control character but newline and tab (C0, DEL, C1) and every bidi
    embedding, override or isolate shown as an escape ("\\x1b", "\\u202e") instead."""
    return text.translate(_SHOWN)


TEXT_CAP = 4000  # characters of one student-derived message kept in results and reports


def capped(text, limit: int = TEXT_CAP):
    """`text` cut to `limit` characters, saying how many more there were (a module with 29,000
    parameter names of 500 characters made each message 14 MB); anything else as it is."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return f"{text[:limit]}... and {len(text) - limit:,} more characters"

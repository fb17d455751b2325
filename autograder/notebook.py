"""Read a submitted notebook into the Python source of its code cells, in order.

Runs in the trusted grader process, on a file the student wrote, so it never executes
anything and never lets a malformed file become a traceback: every problem is a
`NotebookError` whose message says what is wrong in words a student can act on.

- Format: nbformat 4 (any minor version) is read directly from the JSON (importing nbformat
  costs about a second, and its validator rejects notebooks that Jupyter itself opens);
  nbformat 3 notebooks are upgraded with nbformat; other versions, corrupt JSON, JSON that is
  not a notebook and oversized files are `NotebookError`s. A notebook with no code cells is not
  an error: it has nothing to grade, and the grader reports every name as missing.
- IPython syntax: `%time stmt` / `%timeit [options] stmt` lines run `stmt` once; other
  `%magic`, `!shell` and `obj?` lines become calls on `get_ipython()`
  (IPython's own TransformerManager when IPython is installed, else a plain `pass`), so the rest
  of the cell still runs; the sandboxed child provides a `get_ipython()` whose methods do
  nothing. Cell magics: `%%time`, `%%timeit`, `%%capture` and `%%prun` run their body once as
  ordinary Python (so definitions inside them survive); any other cell magic (`%%bash`,
  `%%writefile`, `%%html`, ...) is skipped.
"""
from __future__ import annotations

import json
import os
import re

MAX_NOTEBOOK_BYTES = 100 << 20  # outputs with images make large notebooks; 100 MiB is plenty
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})

_MAGIC_LINE = re.compile(r"^[ \t]*[%!]|\?[ \t]*$", re.MULTILINE)
_HELP_LINE = re.compile(r"^[ \t]*[\w.]+\?\??[ \t]*$")
_TIMING_LINE = re.compile(r"^([ \t]*)%(?:time|timeit|prun)[ \t]+(.*)$", re.MULTILINE)
_TIMING_OPTION = re.compile(r"^(?:-[nrpso][ \t]*\S+|-[qcitD]\S*)[ \t]+")
_CELL_MAGIC = re.compile(r"^[ \t]*%%([A-Za-z_][\w-]*)")


class NotebookError(ValueError):
    """The file is not a notebook the grader can read; the message says why."""


def read_code_cells(path: str | os.PathLike) -> list[str]:
    """The raw source of each code cell, in order ([] for a notebook without code).

    Raises:
        NotebookError: unreadable, too large, corrupt JSON, not a notebook, unsupported version.
    """
    name = os.path.basename(os.fspath(path))
    try:
        size = os.path.getsize(path)
        if size > MAX_NOTEBOOK_BYTES:
            raise NotebookError(f"{name} is {size / 2**20:.0f} MiB, larger than the "
                                f"{MAX_NOTEBOOK_BYTES >> 20} MiB the grader accepts; "
                                "clear the outputs (Kernel > Restart & Clear Output) and resubmit.")
        with open(path, "rb") as f:
            data = f.read(MAX_NOTEBOOK_BYTES + 1)
    except NotebookError:
        raise
    except OSError as e:
        raise NotebookError(f"cannot read {name}: {e.strerror or e}.") from None
    return parse_code_cells(data, name)


def parse_code_cells(data: bytes | str, name: str = "the notebook") -> list[str]:
    """Like read_code_cells, from the file's contents."""
    if isinstance(data, bytes):
        if not data.strip():
            raise NotebookError(f"{name} is an empty file, not a notebook.")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise NotebookError(f"{name} is not a text file (invalid UTF-8 at byte {e.start}); "
                                "a notebook is a JSON text file.") from None
    else:
        text = data
    if not text.strip():
        raise NotebookError(f"{name} is an empty file, not a notebook.")
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        raise NotebookError(f"{name} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                            "the file is corrupt or was edited outside Jupyter. Download it again "
                            "from Jupyter (File > Download) and resubmit.") from None
    except (RecursionError, ValueError) as e:
        raise NotebookError(f"{name} is not valid JSON ({type(e).__name__}).") from None
    if not isinstance(nb, dict) or not ({"cells", "worksheets"} & set(nb)):
        raise NotebookError(f"{name} is JSON but not a Jupyter notebook (no 'cells').")
    major = nb.get("nbformat")
    if major == 4 or (major is None and "cells" in nb):
        cells = nb.get("cells")
    elif major == 3:
        cells = _upgrade_v3(nb, name)
    else:
        raise NotebookError(f"{name} uses notebook format version {major!r}; the grader reads "
                            "versions 3 and 4. Save it with a current Jupyter and resubmit.")
    if not isinstance(cells, list):
        raise NotebookError(f"{name} is not a valid notebook: 'cells' is not a list.")
    sources = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(s for s in source if isinstance(s, str))
        if isinstance(source, str):
            sources.append(source)
    return sources


def _upgrade_v3(nb: dict, name: str) -> list:
    """The cells of an nbformat 3 notebook, upgraded to version 4 (code in 'source')."""
    try:
        import nbformat

        return nbformat.v4.upgrade(nbformat.from_dict(nb)).cells
    except ImportError:
        pass
    except Exception:
        pass  # a v3 notebook nbformat dislikes: read its code cells directly
    cells = []
    worksheets = nb.get("worksheets")
    if not isinstance(worksheets, list):
        raise NotebookError(f"{name} is a version 3 notebook without worksheets.")
    for ws in worksheets:
        for cell in (ws.get("cells") if isinstance(ws, dict) else None) or []:
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                cells.append({"cell_type": "code", "source": cell.get("input", "")})
    return cells


def to_python(source: str) -> str:
    """The cell's source with IPython-only syntax turned into plain Python.

    Line numbers are kept, so error messages point at the student's lines.
    """
    match = _CELL_MAGIC.match(source)
    if match:
        first, _, body = source.partition("\n")
        if match.group(1) in PYTHON_CELL_MAGICS:
            return "\n" + to_python(body)  # the magic line becomes a blank line
        return f"# cell magic %%{match.group(1)} skipped by the grader\n" + "\n" * body.count("\n")
    if not _MAGIC_LINE.search(source):
        return source
    source = _TIMING_LINE.sub(_timed_statement, source)
    if not _MAGIC_LINE.search(source):
        return source
    transformed = _ipython_transform(source)
    return transformed if transformed is not None else _plain_transform(source)


def _timed_statement(m: re.Match) -> str:
    """`%time stmt` / `%timeit -n 10 stmt` -> `stmt`, run once."""
    statement = m.group(2)
    while True:
        shorter = _TIMING_OPTION.sub("", statement, count=1)
        if shorter == statement:
            return m.group(1) + statement
        statement = shorter


def notebook_cells(path: str | os.PathLike) -> list[str]:
    """The code cells of a submission, ready to run: read_code_cells, then to_python."""
    return [to_python(s) for s in read_code_cells(path)]



_TRANSFORMER = None


def _ipython_transform(source: str) -> str | None:
    global _TRANSFORMER
    try:
        if _TRANSFORMER is None:
            from IPython.core.inputtransformer2 import TransformerManager

            _TRANSFORMER = TransformerManager()
        out = _TRANSFORMER.transform_cell(source)
    except Exception:
        return None
    return out if isinstance(out, str) else None


def _plain_transform(source: str) -> str:
    """Without IPython: magic and shell lines become `pass` (indentation kept)."""
    lines = []
    for line in source.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")) or _HELP_LINE.match(line):
            line = line[: len(line) - len(stripped)] + "pass"
        lines.append(line)
    return "\n".join(lines)

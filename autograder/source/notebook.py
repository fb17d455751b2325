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
import stat

MAX_NOTEBOOK_BYTES = 100 << 20  # outputs with images make large notebooks; 100 MiB is plenty
# Code is parsed in the grader's processes (static check, identical-code flag) and by the
# child: a 1 MB list literal is ~260 MB of syntax tree. The solutions' largest cell is 2.7 KB.
MAX_CELL_BYTES = 100_000
MAX_CODE_BYTES = 1_000_000  # all code cells of one notebook together
MAX_CODE_CELLS = 1_000  # the solutions have at most 40
# IPython's input transformer is slow on many magic lines in one cell (99 kB of `!a` lines: over
# 3 minutes of the grader's CPU, outside any student budget): past this many, such lines become
# `pass` (`_plain_transform`), as where IPython is not installed.
MAX_MAGIC_LINES = 100
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})

# A line IPython reads as its own: a magic or shell escape (`%timeit f()`, `!ls`), also assigned
# (`out = !nvidia-smi`, `t = %timeit -o f()`), or help (`obj?`, `?obj`).
_MAGIC_LINE = re.compile(r"^[ \t]*[%!?]|\?[ \t]*$", re.MULTILINE)
_ASSIGNED_HINT = re.compile(r"=[ \t]*[%!]")  # (cheap: the full pattern only where this is found)
_HELP_LINE = re.compile(r"^[ \t]*\?*[\w.]+\?*[ \t]*$")
_ASSIGNED_MAGIC = re.compile(r"^([ \t]*[\w.]+(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=)[ \t]*[%!]", re.MULTILINE)


def _magic_lines(source: str) -> int:
    assigned = len(_ASSIGNED_MAGIC.findall(source)) if _ASSIGNED_HINT.search(source) else 0
    return len(_MAGIC_LINE.findall(source)) + assigned


def _has_magic(source: str) -> bool:
    return bool(_MAGIC_LINE.search(source) or (_ASSIGNED_HINT.search(source) and _ASSIGNED_MAGIC.search(source)))


_TIMING_LINE = re.compile(r"^([ \t]*)%(time|timeit|prun)[ \t]+(.*)$", re.MULTILINE)
# Their options, by magic: %timeit's -n N, -r R, -p P take a value, -q, -c, -t and -o (return
# the result) are flags; %prun's -s KEY, -l LIMIT, -T FILE, -D FILE take one, -r and -q are flags.
_TIMING_OPTIONS = {"time": None,
                   "timeit": re.compile(r"^(?:-[nrp][ \t]*\S+|-[qcto]+)[ \t]+"),
                   "prun": re.compile(r"^(?:-[slTD][ \t]*\S+|-[rq]+)[ \t]+")}
_CELL_MAGIC = re.compile(r"^(?:[ \t]*\n)*[ \t]*%%([A-Za-z_][\w-]*)")  # (after blank lines, as IPython)


class NotebookError(ValueError):
    """The file is not a notebook the grader can read; the message says why."""


_KINDS = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")]


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def submission_problem(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str | None:
    """Why `path` is not a regular file of the submission folder `root` (None where it is one):
    a symbolic link (the file or any folder between `root` and it: a link to the solutions or
    to a classmate's notebook), a pipe, socket or device (a read that never ends), or a real
    path outside `root`. Only lstat: nothing is opened or followed."""
    path = os.path.abspath(os.fspath(path))
    name = os.path.basename(path)
    if root is not None:
        root = os.path.abspath(os.fspath(root))
        rel = os.path.relpath(path, root)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):
            return f"{name} is not inside the submission folder; refused."
        parts = [] if rel == os.curdir else rel.split(os.sep)
        here = root
        for part in [None, *parts]:  # (None: the submission folder itself)
            here = here if part is None else os.path.join(here, part)
            try:
                if os.path.islink(here):
                    return (f"{os.path.relpath(here, os.path.dirname(root))} is a symbolic link; the "
                            "grader reads only regular files of the submission, so it is refused. "
                            "Submit the notebook itself.")
            except OSError:
                pass
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot read {name}: {e.strerror or e}."
    if stat.S_ISLNK(st.st_mode):
        return (f"{name} is a symbolic link; the grader reads only regular files of the submission, "
                "so it is refused. Submit the notebook itself.")
    if not stat.S_ISREG(st.st_mode):
        return f"{name} is {_kind(st.st_mode)}, not a notebook file; refused."
    if root is not None:
        real, real_root = os.path.realpath(path), os.path.realpath(root)
        if os.path.commonpath([real, real_root]) != real_root:
            return f"{name} lies outside the submission folder; refused."
    return None


def read_submission_file(path: str | os.PathLike, limit: int, root=None) -> bytes:
    """At most `limit` + 1 bytes of a regular file of the submission (`submission_problem`),
    opened without following a link and without blocking (a FIFO or a /proc/self/fd link
    never holds the grader), and checked again on the open file. NotebookError otherwise."""
    name = os.path.basename(os.fspath(path))
    why = submission_problem(path, root)
    if why:
        raise NotebookError(why)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise NotebookError(f"cannot read {name}: {e.strerror or e}.") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # (swapped after the check above)
            raise NotebookError(f"{name} is {_kind(st.st_mode)}, not a notebook file; refused.")
        if st.st_size > limit:
            raise NotebookError(f"{name} is {st.st_size / 2**20:.0f} MiB, larger than the "
                                f"{limit >> 20} MiB the grader accepts; clear the outputs "
                                "(Kernel > Restart & Clear Output) and resubmit.")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = None
            return f.read(limit + 1)
    except OSError as e:
        raise NotebookError(f"cannot read {name}: {e.strerror or e}.") from None
    finally:
        if fd is not None:
            os.close(fd)


def read_code_cells(path: str | os.PathLike, root=None) -> list[str]:
    """The raw source of each code cell, in order ([] for a notebook without code). With
    `root`, the submission folder it must be a regular file of (`submission_problem`); a link
    or special file is refused in any case.

    Raises:
        NotebookError: a link or special file, unreadable, too large, corrupt JSON, not a
        notebook, unsupported version.
    """
    name = os.path.basename(os.fspath(path))
    data = read_submission_file(path, MAX_NOTEBOOK_BYTES, root)
    if len(data) > MAX_NOTEBOOK_BYTES:  # (grew after fstat)
        raise NotebookError(f"{name} is larger than the {MAX_NOTEBOOK_BYTES >> 20} MiB the grader accepts.")
    return capped_cells(parse_code_cells(data, name))


def capped_cells(sources: list[str]) -> list[str]:
    """The cells with every one over MAX_CELL_BYTES (or past MAX_CODE_BYTES in all) replaced
    by a line that raises when run, saying why: nothing parses a huge cell (a megabyte list
    literal is hundreds of megabytes of syntax tree), and what it defined is missing."""
    out, total = [], 0
    for n, source in enumerate(sources, 1):
        if n > MAX_CODE_CELLS:  # (a million empty cells are a gigabyte of parse: the rest is dropped)
            out.append(f"raise MemoryError('the notebook has {len(sources):,} code cells, more than the "
                       f"{MAX_CODE_CELLS:,} the grader reads; this cell and the ones after it were not run')\n")
            return out
        size = len(source.encode("utf-8", "surrogatepass"))
        total += size
        if size > MAX_CELL_BYTES or total > MAX_CODE_BYTES:
            why = (f"code cell {n} is {size:,} bytes, more than the {MAX_CELL_BYTES:,} a cell may hold"
                   if size > MAX_CELL_BYTES else
                   f"the notebook's code reaches {total:,} bytes at cell {n}, more than the "
                   f"{MAX_CODE_BYTES:,} the grader reads")
            source = f"raise MemoryError({why + '; this cell was not run by the grader'!r})\n"
        out.append(source)
    return out


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
        end = source.find("\n", match.end())
        body = "" if end < 0 else source[end + 1:]
        head = "\n" * (source[:match.start(1)].count("\n") + (end >= 0))  # (the lines before the body)
        if match.group(1) in PYTHON_CELL_MAGICS:
            return head + to_python(body)  # the magic line becomes a blank line
        return f"# cell magic %%{match.group(1)} skipped by the grader" + head + "\n" * body.count("\n")
    if not _has_magic(source):
        return source
    source = _TIMING_LINE.sub(_timed_statement, source)
    if not _has_magic(source):
        return source
    if _magic_lines(source) > MAX_MAGIC_LINES:
        return _plain_transform(source)
    transformed = _ipython_transform(source)
    return transformed if transformed is not None else _plain_transform(source)


def _timed_statement(m: re.Match) -> str:
    """`%time stmt` / `%timeit -n 10 stmt` -> `stmt`, run once."""
    statement, options = m.group(3), _TIMING_OPTIONS[m.group(2)]
    while options is not None:
        shorter = options.sub("", statement, count=1)
        if shorter == statement:
            break
        statement = shorter
    return m.group(1) + statement


def notebook_cells(path: str | os.PathLike, root=None) -> list[str]:
    """The code cells of a submission, ready to run: read_code_cells, then to_python."""
    return [to_python(s) for s in read_code_cells(path, root)]



_TRANSFORMER = None


def _ipython_transform(source: str) -> str | None:
    global _TRANSFORMER
    try:
        if _TRANSFORMER is None:
            _TRANSFORMER = _input_transformer_module().TransformerManager()
        out = _TRANSFORMER.transform_cell(source)
    except Exception:
        return None
    return out if isinstance(out, str) else None


def _input_transformer_module():
    """IPython's input transformer (`IPython.core.inputtransformer2`, which imports nothing but
    the standard library), loaded from its file without `import IPython`: the package imports
    its terminal and prompt_toolkit too (0.3 s of a grade's start, before any chapter can run)."""
    import importlib.util
    import sys

    name = "IPython.core.inputtransformer2"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("IPython")  # (found, not imported)
    if package is None or not package.submodule_search_locations:
        raise ImportError("IPython is not installed")
    path = os.path.join(package.submodule_search_locations[0], "core", "inputtransformer2.py")
    spec = importlib.util.spec_from_file_location("autograder_ipython_inputtransformer2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plain_transform(source: str) -> str:
    """Without IPython: magic and shell lines become `pass`, assigned ones `name = None`
    (indentation kept)."""
    lines = []
    for line in source.split("\n"):
        stripped = line.lstrip()
        assigned = _ASSIGNED_MAGIC.match(line)
        if assigned:
            line = assigned.group(1) + " None"
        elif stripped.startswith(("%", "!", "?")) or _HELP_LINE.match(line):
            line = line[: len(line) - len(stripped)] + "pass"
        lines.append(line)
    return "\n".join(lines)

"""A submission's code, read once from its file and parsed once (`ParsedSubmission`), for every
check that reads it: the static checks (`findings`), the trust checks on what the child reports
(`session/trust.py`), the diagnosis of a missing name (`grading/grader.py`) and the class
report's identical-code and similarity flags (`report/`).

The cells are the Python the grader runs (`notebook.notebook_cells`: every cell over the size
cap is already a one-line `raise`, so nothing here parses a huge cell), and each tree is the
parse of exactly that text: a cell with a SyntaxError has no tree, as it defines nothing when
run; one the grader cannot read for depth is replaced by a `raise` (`UNREADABLE_CELL`), so the
child never runs code the checks did not read. Each cell is parsed once, when the submission is
made; the trees are shared and never changed.
"""
from __future__ import annotations

import ast
import os
import re
import sys
import threading
from collections.abc import Iterable
from functools import cached_property

from .notebook import capped_cells, notebook_cells, to_python
from .symbols import Notebook


class ParsedSubmission:
    """One notebook's code cells (a sequence of str, as the session sends them to the child)
    with their syntax trees, symbol table and top-level definitions, each made on first use."""

    def __init__(self, cells: Iterable[str] | None, path: str | os.PathLike | None = None):
        """cells: the cells as they run (`notebook_cells`); anything not a str is an empty cell.
        A cell the grader cannot read (nested past its recursion limit, out of memory: not a
        SyntaxError, which the child meets too) is replaced by a line that raises, so what the
        child runs is what the checks read (`UNREADABLE_CELL`)."""
        sources = [c if isinstance(c, str) else "" for c in (cells or ())]
        parses = [_parse(source) for source in sources]
        for n, (tree, why) in enumerate(parses):
            if why:
                sources[n] = UNREADABLE_CELL.format(why=why)
                parses[n] = (_parse(sources[n])[0], None)
        self.cells: tuple[str, ...] = tuple(sources)
        self._trees = tuple(tree for tree, _ in parses)
        self.path = path

    @classmethod
    def read(cls, path: str | os.PathLike, root=None) -> ParsedSubmission:
        """The notebook at `path` (`notebook_cells`). Raises NotebookError, as it does."""
        return cls(notebook_cells(path, root), path)

    @classmethod
    def from_raw(cls, sources: Iterable[str] | None) -> ParsedSubmission:
        """Cells as a notebook file holds them (IPython syntax, any size), made what the grader
        runs, as `read` does."""
        raw = [s if isinstance(s, str) else "" for s in (sources or ())]
        return cls([to_python(s) for s in capped_cells(raw)])

    @classmethod
    def of(cls, cells) -> ParsedSubmission:
        """`cells` itself when already parsed, else the cells as they run (a list of str)."""
        return cells if isinstance(cells, cls) else cls(cells)

    # -- the cells, as a sequence ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.cells)

    def __iter__(self):
        return iter(self.cells)

    def __getitem__(self, index):
        return self.cells[index]

    # -- the parse ---------------------------------------------------------------------------------
    @property
    def trees(self) -> tuple[ast.Module | None, ...]:
        """Each cell's syntax tree (index = cell number - 1); None where it does not parse."""
        return self._trees

    @cached_property
    def symbols(self) -> Notebook:
        """The symbol table of the static checks (`symbols.Notebook`)."""
        try:
            return Notebook(self.trees, [source.splitlines() for source in self.cells])
        except Exception:  # (never costs a grade: no symbols, no findings)
            return Notebook((), ())

    @cached_property
    def unparsed(self) -> frozenset[int]:
        """The numbers of the cells that do not parse (a SyntaxError when run)."""
        return frozenset(n for n, tree in enumerate(self.trees, 1) if tree is None)

    @cached_property
    def definitions(self) -> dict[str, tuple[int, ast.AST]]:
        """name -> (cell number, node) of the last top-level `def` or `class` of that name (the
        one a run of every cell leaves; statements nested in `if` or `try` are not read)."""
        found: dict = {}
        for number, tree in enumerate(self.trees, 1):
            for node in tree.body if tree is not None else ():
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found[node.name] = (number, node)
        return found

    @cached_property
    def class_bases(self) -> dict[str, list[str]]:
        """Class name -> the names of its bases, for every class the notebook defines, nested
        ones included."""
        classes: dict = {}
        for tree in self.trees:
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.ClassDef):
                    classes[node.name] = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                                          for b in node.bases]
        return classes

    def defining_cells(self, name: str) -> list[int]:
        """The cells whose own top-level code binds `name` (def, class, assignment, import...),
        in order: from the symbol table where a cell parses; where it does not (a SyntaxError),
        read line by line (`_defines_by_lines`)."""
        cells = {b.cell for b in self.symbols.bindings.get(name, ()) if b.kind != "del"}
        cells |= {n for n in self.unparsed if _defines_by_lines(self.cells[n - 1], name)}
        return sorted(cells)


def parsed(notebook) -> ParsedSubmission:
    """A notebook's parse: `notebook` itself where it is one, else its file read
    (`ParsedSubmission.read`: raises NotebookError)."""
    return notebook if isinstance(notebook, ParsedSubmission) else ParsedSubmission.read(notebook)


# Deeply nested code (a chain of 5,000 attributes fits in a capped cell) recurses once per level
# in ast's conversion and in the symbol table's walks: at Python's default limit (1,000) such a
# cell would go unread. 3,000 frames fit the default 8 MiB stack of the grader's threads. (jedi,
# imported with IPython, used to raise the limit so as a side effect.) Deeper code is replaced
# by UNREADABLE_CELL: the child could run it after raising its own limit, unchecked.
PARSE_RECURSION_LIMIT = 3000
UNREADABLE_CELL = ("raise RecursionError('the grader could not read this cell ({why}): it nests "
                   "too deeply; write it with fewer levels. The cell was not run.')\n")


def _parse(source: str) -> tuple[ast.Module | None, str | None]:
    """(the cell's tree or None, None or why the grader cannot read a cell the child could run)."""
    if sys.getrecursionlimit() < PARSE_RECURSION_LIMIT:
        sys.setrecursionlimit(PARSE_RECURSION_LIMIT)
    try:
        return ast.parse(source), None
    except SyntaxError as e:
        if "integer string conversion" not in str(e):
            return None, None  # (the child meets the same SyntaxError)
        return _parse_long_integers(source)
    except ValueError:  # null bytes: the child's compile refuses them too
        return None, None
    except (RecursionError, MemoryError) as e:
        return None, type(e).__name__


def _parse_long_integers(source: str) -> tuple[ast.Module | None, str | None]:
    """A cell with an integer literal past Python's digit limit, which the student's code can
    lift (`sys.set_int_max_str_digits(0)`) before the cell runs: read without the limit (a
    capped cell's literal costs well under a second). The limit is the process's: `grade` parses
    chapters in threads, and one parse must not restore another's lifted limit for good."""
    with _DIGITS_LIFTED:
        old = sys.get_int_max_str_digits()
        try:
            sys.set_int_max_str_digits(0)
            return ast.parse(source), None
        except (SyntaxError, ValueError):
            return None, None
        except (RecursionError, MemoryError) as e:
            return None, type(e).__name__
        finally:
            sys.set_int_max_str_digits(old)


_DIGITS_LIFTED = threading.Lock()


_DEFINITION = re.compile(r"[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)")
_ASSIGNMENT = re.compile(r"(\w+)[ \t]*(?::[^=\n]*)?=(?!=)")


def _defines_by_lines(source: str, name: str) -> bool:
    """For a cell that does not parse: whether one of its lines defines `name` in the cell's
    own scope: `def name` or `class name` inside no other def or class (judged by indentation:
    a method or a nested function is not the name the notebook is asked for), or `name = ...`
    at the start of a line. Linear in the cell's size."""
    enclosing: list[tuple[int, bool]] = []  # (indentation, is a def or class) of the open lines
    for line in source.splitlines():
        code = line.lstrip()
        if not code or code.startswith("#"):
            continue
        indent = len(line) - len(code)
        while enclosing and enclosing[-1][0] >= indent:
            enclosing.pop()
        definition = _DEFINITION.match(line)
        if not any(scope for _, scope in enclosing):
            if definition and definition[1] == name:
                return True
            assignment = _ASSIGNMENT.match(line) if indent == 0 else None
            if assignment and assignment[1] == name:
                return True
        enclosing.append((indent, definition is not None))
    return False

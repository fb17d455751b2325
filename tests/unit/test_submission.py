"""autograder/source/submission.py: a notebook read and parsed once (`ParsedSubmission`), each
cell at most once whatever reads it, and which cell defines a name (the diagnosis of a missing
name, `grader._failed_definitions`), a cell with a SyntaxError included."""
from __future__ import annotations

import ast
import json

import pytest

from autograder.grading.grader import _failed_definitions
from autograder.grading import results
from autograder.report import similarity
from autograder.session.notebook_run import CellRun, NotebookRun
from autograder.session.trust import expected_error_credible
from autograder.shared.contract import CHAPTERS
from autograder.source.findings import findings
from autograder.source.notebook import MAX_CELL_BYTES
from autograder.source.submission import ParsedSubmission

CH1 = "01_intuition"
BROKEN_SOFTMAX = "import torch\n\ndef softmax(x dim=-1):\n    return x.exp() / x.exp().sum(dim, keepdim=True)\n"


@pytest.fixture
def parses(monkeypatch):
    """The sources `ast.parse` is called on, from now on."""
    seen: list = []
    real = ast.parse

    def counting(source, *args, **kwargs):
        seen.append(source)
        return real(source, *args, **kwargs)
    monkeypatch.setattr(ast, "parse", counting)
    return seen


def test_every_reader_shares_one_parse_of_each_cell(parses):
    """The static checks, the trust checks and the identical-code flags read the same trees:
    three readers, one `ast.parse` per cell (each parsed its own copy before)."""
    cells = ["import torch\n", "class ShapeError(ValueError):\n    pass\n",
             ("def softmax(x, dim=-1):\n    if x.dim() == 0:\n        raise ShapeError('0-d')\n"
              "    return torch.softmax(x, dim)\n"), "def broken(:\n"]
    source = ParsedSubmission(cells)
    assert findings(source, CHAPTERS[CH1])["softmax"].forbidden_names == {"softmax"}
    claim = {"type": "ShapeError", "message": "0-d", "where": "<cell 3>, line 3, in softmax: raise ShapeError('0-d')"}
    assert expected_error_credible(claim, "ValueError", source, "softmax")
    assert set(similarity.definitions(source).last) == {"ShapeError", "softmax"}
    assert source.defining_cells("broken") == [4]
    assert sorted(parses) == sorted(cells)


def test_read_caps_a_huge_cell_before_anything_parses_it(tmp_path, parses):
    huge = "x = [" + "0, " * MAX_CELL_BYTES + "]\n"
    path = tmp_path / f"{CH1}.ipynb"
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "source": huge, "metadata": {}, "outputs": [], "execution_count": None}]}))
    source = ParsedSubmission.read(path)
    assert source.trees[0] is not None and len(source[0]) < 1000 and "MemoryError" in source[0]
    assert max(map(len, parses)) < 1000


def test_a_cell_that_does_not_parse_has_no_tree_and_the_others_do():
    source = ParsedSubmission(["x = 1\n", "def f(:\n", "\x00", None])
    assert [t is not None for t in source.trees] == [True, False, False, True]
    assert source.unparsed == {2, 3}
    assert list(source) == ["x = 1\n", "def f(:\n", "\x00", ""]


def test_from_raw_reads_ipython_syntax_as_the_grader_runs_it():
    source = ParsedSubmission.from_raw(["%matplotlib inline\ndef softmax(x):\n    return x\n", "%%bash\nls\n"])
    assert source.defining_cells("softmax") == [1]
    assert source.unparsed == frozenset()


def test_defining_cells_follow_what_a_run_of_the_notebook_binds():
    source = ParsedSubmission([
        "def softmax(x):\n    return x\n",                      # 1: a def
        "if True:\n    softmax = lambda x: x\n",                 # 2: in a block at top level
        "class A:\n    def softmax(self, x):\n        return x\n",  # 3: a method: not the name
        "def outer():\n    def softmax(x):\n        return x\n",    # 4: nested: not the name
        "from torch import softmax\n",                          # 5: an import binds it too
        "del softmax\n",                                        # 6: a del does not define it
        "if False:\n    def softmax(x):\n        return x\n",      # 7: never runs
    ])
    assert source.defining_cells("softmax") == [1, 2, 5]


@pytest.mark.parametrize("cell, defines", [
    (BROKEN_SOFTMAX, True),                                                     # the def that failed
    ("softmax = lambda x: x\ndef f(:\n", True),                               # an assignment at the start of a line
    ("softmax: object = None\ndef f(:\n", True),                              # annotated
    ("softmax == 1\ndef f(:\n", False),                                       # a comparison
    ("try:\n    def softmax(x):\n        return x(\nexcept ImportError:\n    pass\n", True),  # in a top-level block
    ("class Attention:\n    def softmax(self, x:\n        return x\n", False),  # a method of a broken class
    ("def outer(:\n    def softmax(x):\n        return x\n", False),          # nested in a broken def
    ("x = f(\n    softmax=1)\ndef g(:\n", False),                             # a keyword argument
    ("# def softmax(x):\ndef g(:\n", False),                                  # a comment
])
def test_a_cell_with_a_syntax_error_is_read_line_by_line(cell, defines):
    source = ParsedSubmission([cell])
    assert source.trees[0] is None
    assert source.defining_cells("softmax") == ([1] if defines else [])


def _missing(exercise: str) -> results.TestResult:
    case = results.CaseResult("basic", "cpu", "float32", False, aspect="missing", message=f"{exercise} is not defined")
    return results.TestResult(CH1, exercise, "cpu", 0.0, 4.0, [case], note=f"`{exercise}` is not defined in the notebook.")


def _run(*cells: CellRun) -> NotebookRun:
    return NotebookRun("bubblewrap", "", None, list(cells))


def test_a_missing_name_points_at_the_cell_with_the_syntax_error_that_defines_it():
    source = ParsedSubmission(["import torch\n", BROKEN_SOFTMAX, "def attention_pool(q, k, v):\n    raise 1/0\n"])
    info = _run(CellRun(1, "ok"),
                CellRun(2, "error", {"type": "SyntaxError", "message": "invalid syntax (line 3)"}),
                CellRun(3, "error", {"type": "ZeroDivisionError", "message": "division by zero"}))
    tests = [_missing("softmax"), _missing("attention_pool")]
    _failed_definitions(CHAPTERS[CH1], tests, source, info)
    assert tests[0].note.endswith("It is defined in cell 2, which failed: SyntaxError: invalid syntax (line 3)")
    assert tests[1].note.endswith("It is defined in cell 3, which failed: ZeroDivisionError: division by zero")


def test_a_method_of_the_same_name_in_a_failed_cell_is_not_where_the_name_is_defined():
    """The old regex matched any indented `def softmax`; a class's method of that name does not
    define the function the notebook is asked for, so the note does not send the student there."""
    source = ParsedSubmission(["class Attention:\n    def softmax(self, x):\n        return x\n\nraise RuntimeError\n"])
    info = _run(CellRun(1, "error", {"type": "RuntimeError", "message": ""}))
    tests = [_missing("softmax")]
    _failed_definitions(CHAPTERS[CH1], tests, source, info)
    assert tests[0].note == "`softmax` is not defined in the notebook."


FORBIDDEN_SDPA = "def scaled_dot_product_attention(q, k, v, mask=None):\n    return F.scaled_dot_product_attention(q, k, v)\n"


def test_a_cell_the_grader_cannot_read_for_depth_is_not_run_unread():
    """A student lifts the child's recursion limit, then hides a forbidden call in a cell too
    deep for the grader's parse: the child would run what the static check never read. The cell
    is replaced by a line that raises, so what runs is what was checked."""
    deep = FORBIDDEN_SDPA + "_ = q" + ".T" * 12000 + "\n"
    source = ParsedSubmission(["import sys\nsys.setrecursionlimit(100000)\n", deep])
    assert source.cells[1].startswith("raise RecursionError(")
    assert "not run" in source.cells[1] and source.trees[1] is not None
    compile(source.cells[1], "<cell 2>", "exec")  # (what the child runs: a plain raise)


def test_a_long_integer_literal_does_not_hide_a_forbidden_call():
    """Python refuses an integer literal past 4,300 digits, unless the student's earlier cell
    lifts the limit, after which the child runs the cell: the grader reads it without the limit."""
    import sys

    cells = ["import sys\nimport torch.nn.functional as F\nsys.set_int_max_str_digits(0)\n",
             FORBIDDEN_SDPA.replace("    return", "    _ = " + "9" * 5000 + "\n    return")]
    result = findings(ParsedSubmission(cells), CHAPTERS["02_scaled_dot_product_attention"], {})
    assert result["scaled_dot_product_attention"].forbidden_names
    assert sys.get_int_max_str_digits() == 4300  # (the grader's own limit is back)


def test_long_literals_parsed_in_threads_leave_the_digit_limit_on():
    """`grade` parses a student's chapters in threads: one parse lifting the process's digit
    limit must not be restored by another as "lifted" (the grader would then convert any huge
    number a child sends at quadratic cost, outside every budget)."""
    import sys
    import threading

    cell = "x = " + "9" * 20_000 + "\n"

    def parse_many():
        for _ in range(40):
            assert ParsedSubmission([cell]).trees[0] is not None

    threads = [threading.Thread(target=parse_many) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sys.get_int_max_str_digits() == 4300

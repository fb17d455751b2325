"""The notebook reader (`autograder.source.notebook`): unreadable files give clear messages, nbformat 3
and 4 are read without nbformat's own machinery, IPython syntax is neutralised, not lost."""
from __future__ import annotations

import json

import pytest

from autograder.source.notebook import NotebookError, notebook_cells, parse_code_cells, to_python


def _nb(cells, **top):
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                       "cells": [{"cell_type": t, "source": s, "metadata": {}, **(
                           {"outputs": [], "execution_count": None} if t == "code" else {})}
                                 for t, s in cells], **top})


@pytest.mark.parametrize("content, words", [
    (b"", "empty"),
    (b"   \n", "empty"),
    (b'{"cells": [', "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not a text file"),
    (b"[1, 2, 3]", "not a Jupyter notebook"),
    (b'{"hello": "world"}', "not a Jupyter notebook"),
    (b'{"nbformat": 5, "cells": []}', "version 5"),
    (b'{"nbformat": 4, "cells": {"a": 1}}', "not a list"),
    (b"[" * 100_000, "not valid JSON"),
], ids=["empty", "blank", "truncated", "binary", "list", "other-json", "nbformat5", "cells-dict",
        "deep-nesting"])
def test_unreadable_notebooks_give_clear_messages(tmp_path, content, words):
    path = tmp_path / "01_intuition.ipynb"
    path.write_bytes(content)
    with pytest.raises(NotebookError, match=words):
        notebook_cells(path)


def test_missing_file_is_a_notebook_error(tmp_path):
    with pytest.raises(NotebookError, match="cannot read"):
        notebook_cells(tmp_path / "nope.ipynb")


def test_v3_and_v4_notebooks_and_empty_ones():
    v4 = _nb([("markdown", "# hi"), ("code", ["import torch\n", "x = 1"]), ("raw", "r"),
              ("code", "y = 2")])
    assert parse_code_cells(v4) == ["import torch\nx = 1", "y = 2"]
    v3 = json.dumps({"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": [
        {"cells": [{"cell_type": "code", "input": ["a = 1\n", "b = 2"], "language": "python",
                    "outputs": []}, {"cell_type": "markdown", "source": "x"}]}]})
    assert parse_code_cells(v3) == ["a = 1\nb = 2"]
    assert parse_code_cells(_nb([])) == []
    assert parse_code_cells(_nb([("markdown", "only text")])) == []


def test_ipython_syntax_becomes_python_that_keeps_definitions():
    source = ("%matplotlib inline\n!pip install nothing\nimport torch\n"
              "def f(x):\n    %time y = x + 1\n    return y\ntorch.nn?\n")
    py = to_python(source)
    compile(py, "<cell>", "exec")
    assert "def f(x):" in py and "    y = x + 1" in py
    assert to_python("%%time\ndef g():\n    return 1\n").splitlines()[1] == "def g():"
    assert "rm" not in to_python("%%bash\nrm -rf /\n")


# IPython syntax that a real kernel runs and the grader read as a syntax error, costing the whole
# cell (an imports cell: every exercise of chapter 2, 1/18), or as a cell magic it skipped (a
# blank line first): an instructor's probe of honest notebooks, stop 49.
KERNEL_SYNTAX = {
    "shell output assigned (Colab's GPU check)": "import math\ngpu_info = !nvidia-smi\ndef f():\n    return math.pi\n",
    "a magic's result assigned": "def f():\n    return 1\nres = %timeit -o f()\nenv = %env\n",
    "two names assigned": "def f():\n    return 1\na, b = %who_ls\n",
    "%timeit -o (a flag)": "def f():\n    return 1\n%timeit -o f()\n%timeit -o -n 10 f()\n%prun -r f()\n",
    "?obj at the start of a line": "?torch.where\ndef f():\n    return 1\n",
    "a blank line before %%time": "\n%%time\ndef f():\n    return 1\n",
    "blank lines before %%capture": "\n\n%%capture\ndef f():\n    return 1\n",
}


@pytest.mark.parametrize("name", sorted(KERNEL_SYNTAX))
def test_ipython_syntax_a_kernel_runs_keeps_the_cells_definitions(name):
    py = to_python(KERNEL_SYNTAX[name])
    ns = {"get_ipython": lambda: type("Stub", (), {"__getattr__": lambda self, _: lambda *a, **k: None})(),
          "torch": None}
    try:
        exec(compile(py, "<cell>", "exec"), ns)
    except TypeError:  # (`a, b = None`: the grader's get_ipython() returns None, after the def ran)
        assert name == "two names assigned"
    assert ns["f"]() in (1, 3.141592653589793)
    assert len(py.splitlines()) >= KERNEL_SYNTAX[name].rstrip("\n").count("\n")  # (line numbers kept)


def test_without_ipython_assigned_magics_become_none(monkeypatch):
    from autograder.source import notebook

    monkeypatch.setattr(notebook, "_ipython_transform", lambda source: None)
    py = to_python("x = !ls\n  y, z = %who\n?obj\nobj?\nw = 1\n")
    assert py.splitlines() == ["x = None", "  y, z = None", "pass", "pass", "w = 1"]


def test_strings_that_look_like_assigned_magics_are_left_alone():
    for source in ["s = 'x = %d' % 3\n", "y = 'a =%s'\n", "x != 1\n"]:
        assert to_python(source) == source


def test_many_code_cells_are_cut_at_the_cap():
    """A million empty cells would be a gigabyte of parse in the grader: past MAX_CODE_CELLS
    one cell says why, and the rest are not read."""
    from autograder.source.notebook import MAX_CODE_CELLS, capped_cells

    cells = capped_cells(["x = 1\n"] * (MAX_CODE_CELLS + 5000))
    assert len(cells) == MAX_CODE_CELLS + 1
    assert cells[-1].startswith("raise MemoryError(") and "not run" in cells[-1]
    assert cells[:MAX_CODE_CELLS] == ["x = 1\n"] * MAX_CODE_CELLS


def test_a_cell_of_many_magic_lines_skips_ipythons_slow_transformer(monkeypatch):
    """IPython's transformer took minutes of the grader's CPU on 99 kB of `!a` lines, outside any
    budget: past MAX_MAGIC_LINES such lines become `pass`, without it."""
    from autograder.source import notebook

    def slow(source):
        raise AssertionError("IPython's transformer ran")
    monkeypatch.setattr(notebook, "_ipython_transform", slow)
    out = to_python("x = 1\n" + "!a\n" * (notebook.MAX_MAGIC_LINES + 1))
    assert out.splitlines()[0] == "x = 1" and set(out.splitlines()[1:]) == {"pass"}

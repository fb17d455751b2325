"""Attacks on the grade itself, each written as a student's notebook, with the grader's source
open (it is public): forged outcomes, reading the grader's code or classmates' work, bypassing
the recorders that measure scored properties. Each must be contained: a forged outcome scores
zero, nothing secret is readable or importable, a bypassed recorder changes no score.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.sandbox import modes
from autograder.sandbox import visibility as sandbox
from autograder.shared.calls import Call
from autograder.grading.grader import Grader
from autograder.source.notebook import notebook_cells
from autograder.sandbox.limits import Limits
from autograder.sandbox.modes import probe_bubblewrap
from session_helpers import lone_session

REPO = Path(__file__).resolve().parents[2]


def notebook_with(path: Path, template: str, extra: list[str]) -> Path:
    """The exercise template `template` (stubs only) with the student's extra cells appended."""
    nb = nbformat.read(REPO / "exercises" / f"{template}.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(src) for src in extra]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def forger(cell_number: int) -> str:
    """A cell that replaces the child's executor: every call 'returns' the right kind of
    result with nothing in it, and every call that must raise claims a ValueError, with a
    traceback that cites a real `raise ValueError` line of this very cell (line 5)."""
    return f'''import autograder.runtime.execute as _E
from autograder.shared.calls import Outcome

def _g():
    raise ValueError("forged")

def _fake(target, call, *rest):  # (whatever else execute passes)
    if call.expect_error:
        return Outcome(error={{"type": "ValueError", "mro": ["ValueError", "Exception"], "message": "forged",
                              "where": "<cell {cell_number}>, line 5, in _g: raise ValueError(\\"forged\\")"}})
    return Outcome(returned="answer" if call.answer else "Tensor", outputs=[], meta=[])

_E._execute = _fake
'''


@pytest.mark.needs_bwrap
def test_forged_outcomes_score_zero(tmp_path):
    """Before: chapter 5 12/13 and positional encoding's exercises 4/4 from blank templates."""
    paths = []
    for template in ("04_positional_encoding", "05_masks"):
        path = tmp_path / "alice" / f"{template}.ipynb"
        n = len(notebook_cells(notebook_with(path, template, ["pass"])))
        paths.append(notebook_with(path, template, [forger(n)]))
    result = Grader(device="cpu").grade_path(tmp_path / "alice")
    scores = {ch.chapter: sum(t.score for t in ch.tests) for ch in result.chapters}
    assert scores == {"04_positional_encoding": 0.0, "05_masks": 0.0}
    messages = [c.message for ch in result.chapters for t in ch.tests for c in t.cases if not c.passed]
    assert any("returned 0 values, expected 1" in m for m in messages)
    assert any("`raise` statement of your own code" in m for m in messages)  # the forged ValueError


SNOOP = '''import os, sys, torch
FOUND = []  # (the Python installation's own packages are public: not searched)
for top in ("/", "/tmp", "/run"):
    for root, dirs, files in os.walk(top):
        if root.startswith(("/proc", "/sys", "/dev", "/usr/share", "/usr/include", "/usr/lib/python3",
                            sys.prefix, sys.base_prefix)):
            dirs[:] = []
            continue
        for f in files:
            if f.endswith(".ipynb") or f in ("grades.csv", "references.py", "grading.py", "inputs.py", "solutions.py", "grader.py") \\
                    or (os.path.basename(root) == "cases" and f.endswith(".py")):
                FOUND.append(os.path.join(root, f))

def causal_mask(seq_len, device=None):  # a classmate's, if one can be read
    for path in FOUND:
        if path.endswith("05_masks.ipynb"):
            import json
            for cell in json.load(open(path))["cells"]:
                if cell["cell_type"] == "code":
                    exec("".join(cell["source"]), globals())
            return globals()["causal_mask"](seq_len, device)
    raise NotImplementedError()

def found():
    return torch.tensor([len(FOUND)])
'''


@pytest.mark.needs_bwrap
def test_a_course_folder_and_the_class_in_it_are_invisible(tmp_path):
    """`batch`/`grade` run from a course folder that holds the whole class and earlier reports:
    the working folder is no longer mounted (before: a student who walked the file system and
    exec'd a classmate's notebook scored full marks)."""
    course = tmp_path / "course"
    bob = course / "class" / "bob"
    bob.mkdir(parents=True)
    shutil.copy(REPO / "solutions" / "05_masks.ipynb", bob / "05_masks.ipynb")
    (course / "grades.csv").write_text("student,total\nbob,13\n")
    alice = notebook_with(course / "class" / "alice" / "05_masks.ipynb", "05_masks", [SNOOP])
    r = subprocess.run([sys.executable, "-m", "autograder", "grade", str(alice.parent), "--device", "cpu",
                        "--json", str(tmp_path / "alice.json")],
                       cwd=course, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    tests = json.loads((tmp_path / "alice.json").read_text())["tests"]
    assert sum(t["score"] for t in tests if t["extra_data"]["exercise"] == "causal_mask") == 0
    with lone_session([SNOOP], Limits(cell_timeout=30, notebook_timeout=60), sandbox="bubblewrap") as s:
        s.start()
        out = s.run(Call(chapter="t", exercise="found", case="c", target="found"))
    assert out.outputs[0].tolist() == [0]


@pytest.mark.needs_bwrap
def test_an_installed_copy_of_the_grader_is_hidden(tmp_path, monkeypatch):
    """A non-editable install (Gradescope's old setup.sh: `pip install /autograder/source`)
    puts the whole package, cases and hint models included, in site-packages, which the sandbox
    mounts: it is covered there, and the child imports only its own runtime."""
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "autograder", site / "autograder",
                    ignore=shutil.ignore_patterns("__pycache__", "data"))
    real = sandbox.interpreter_dirs()
    monkeypatch.setattr(sandbox, "interpreter_dirs", lambda: real + [str(site)])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(modes._PROBE, "result", probe_bubblewrap())
    assert str(site / "autograder") in sandbox.hidden_paths()
    cells = [f'''import os, sys, torch
SITE = {str(site)!r}
def snoop():
    seen = [int(os.path.isdir(SITE)), len(os.listdir(os.path.join(SITE, "autograder")))]
    sys.path.insert(0, SITE)
    try:
        import autograder.cases, autograder.cases.inputs  # noqa
        seen.append(1)
    except ImportError:
        seen.append(0)
    return torch.tensor(seen)
''']
    with lone_session(cells, Limits(cell_timeout=30, notebook_timeout=60), sandbox="bubblewrap") as s:
        s.start()
        out = s.run(Call(chapter="t", exercise="snoop", case="c", target="snoop"))
    assert out.error is None, out.error
    assert out.outputs[0].tolist() == [1, 0, 0]  # the folder is there, the package is not


@pytest.mark.needs_bwrap
def test_grading_from_a_clone_of_the_project_works(tmp_path):
    """Run from the root of a clone (its folder is the working folder and on sys.path): before,
    the probe saw the grader's folder as an empty mount point and stopped with exit status 3."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for part in ("autograder", "solutions", "exercises"):
        shutil.copytree(REPO / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", clone)
    r = subprocess.run([sys.executable, "-m", "autograder", "grade", "solutions/05_masks.ipynb",
                        "--device", "cpu"], cwd=clone, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Total: 13 / 13" in r.stdout and "sandbox: bubblewrap" in r.stdout


FULL_MATRIX_WITHOUT_RECORDER = '''import math, torch
import autograder.runtime.execute as _E

class _Off:
    def __init__(self, *a, **k):
        self.numel, self.op = 0, ""
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False

_E._Largest = _Off  # the memory recorder, disabled

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    dead = torch.isneginf(s).all(-1, keepdim=True)  # (no NaN, nor NaN gradients, on fully masked rows)
    s = s.masked_fill(dead, 0.0)
    lse = torch.logsumexp(s, -1, keepdim=True)
    w = torch.exp(s - lse).masked_fill(dead, 0.0)
    return w @ v, lse.squeeze(-1).masked_fill(dead.squeeze(-1), float("-inf"))
'''


@pytest.mark.needs_bwrap
def test_a_bypassed_memory_recorder_still_loses_the_memory_cases(tmp_path):
    """Before: disabling the recorder took a full-matrix online softmax from 26.2 to 28/28.
    Now the memory cases run where the kernel caps the child's memory below the score matrix."""
    nb = notebook_with(tmp_path / "07_efficient_attention.ipynb", "07_efficient_attention",
                       [FULL_MATRIX_WITHOUT_RECORDER])
    result = Grader(device="cpu").grade_path(nb)
    (chapter,) = result.chapters
    cpu = next(t for t in chapter.tests if t.exercise == "online_softmax_attention" and t.device == "cpu")
    memory = [c for c in cpu.cases if c.case.startswith("memory")]
    assert len(memory) == 1 and not any(c.passed for c in memory), [(c.case, c.message) for c in memory]
    assert all("ran out of memory" in c.message for c in memory)
    assert all(c.passed for c in cpu.cases if not c.case.startswith("memory"))
    assert cpu.score < cpu.max_score


def test_the_gradescope_image_does_not_install_the_grader(tmp_path):
    """The grader runs from /autograder/source (never shown to the student's code); what
    setup.sh installs into site-packages (shown, read-only) is its dependencies only."""
    import zipfile

    from autograder.integrations.gradescope import build_zip, grader_dependencies

    with zipfile.ZipFile(build_zip(tmp_path / "a.zip", chapters=["05_masks"])) as z:
        setup = z.read("setup.sh").decode()
    installs = [line for line in setup.splitlines() if "pip install" in line]
    assert not any("/autograder/source" in line for line in installs)
    assert all(f'"{d}"' in setup for d in grader_dependencies())


FORBIDDEN_UNWATCHED = '''import torch
import autograder.runtime.execute as _E
_E.WATCHED_OPS = frozenset()        # the dispatch recorder's tables, emptied
_E.WATCHED_FUNCTIONS = frozenset()

def softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)
'''

INPLACE_UNCHECKED = '''import torch
import autograder.runtime.execute as _E
_E._same = lambda a, b: True        # the in-place check, disabled

def fixed_masked_softmax(scores, mask):
    scores.masked_fill_(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)
'''


@pytest.mark.needs_bwrap
def test_bypassed_recorders_change_no_score(tmp_path):
    """Before: emptying the forbidden-op table let torch.softmax score full marks in the
    softmax exercise, and disabling the in-place check took an in-place masked_fill_ on an
    input to full marks. The grader also reads the notebook's source, where no cell can reach."""
    one = notebook_with(tmp_path / "bob" / "01_intuition.ipynb", "01_intuition", [FORBIDDEN_UNWATCHED])
    five = notebook_with(tmp_path / "bob" / "05_masks.ipynb", "05_masks", [INPLACE_UNCHECKED])
    result = Grader(device="cpu").grade_path(tmp_path / "bob")
    tests = {(t.chapter, t.exercise, t.device): t for ch in result.chapters for t in ch.tests}
    softmax = [t for (c, e, d), t in tests.items() if e == "softmax"]
    assert all(t.score == 0 for t in softmax)
    assert "ready-made" in softmax[0].note or "softmax" in softmax[0].note
    assert "cell" in softmax[0].note  # where in the notebook
    fixed = tests[("05_masks", "fixed_masked_softmax", "cpu")]
    assert fixed.score < fixed.max_score
    assert any(c.aspect == "inplace" and "`scores`" in c.message for c in fixed.cases)
    assert one.exists() and five.exists()


CAPTURED_BEFORE_ANY_CALL = '''import torch
import torch.nn.functional as F
_mha = vars(F)["multi_head" + "_attention_forward"]   # taken when the cell runs, before any call

def f(x):
    eye = torch.eye(4, dtype=x.dtype)
    out, weights = _mha(x, x, x, 4, 1, torch.cat([eye, eye, eye]), None, None, None, False, 0.0,
                        eye, None, need_weights=True)   # its slow path: no attention op of aten's
    return out
'''


# The recorder's guard replaced with a no-op by a cell (a reviewer's, stop 45): before, even
# the softmax went unrecorded.
GUARD_REPLACED = '''import torch, contextlib
import torch.nn.functional as F
torch._C._IncludeDispatchKeyGuard = lambda key: contextlib.nullcontext()
_sdpa = vars(F)["scaled_dot_product" + "_attention"]

def f(x):
    return _sdpa(x, x, x)
'''


@pytest.mark.needs_bwrap
@pytest.mark.parametrize("cell, seen", [
    (CAPTURED_BEFORE_ANY_CALL, "multi_head_attention_forward"),
    (CAPTURED_BEFORE_ANY_CALL + '_mha = getattr(_mha, "__wrapped__", _mha)\n', "multi_head_attention_forward"),
    (GUARD_REPLACED, "aten.scaled_dot_product_attention"),
], ids=["taken in a cell", "its __wrapped__ taken", "the guard replaced"])
def test_a_watched_function_taken_in_a_cell_is_still_recorded(cell, seen):
    """Before: the recorder wrapped `F.multi_head_attention_forward` at a chapter's first call,
    so a cell that had taken the function into a name of its own ran torch's, unrecorded (only
    its softmax was seen); the wrapper's `__wrapped__` handed out torch's own; and the guard
    that turns the recording kernels on was looked up in torch._C at each call. Now the recorder
    is in place, and its guard taken, before the first cell runs."""
    with lone_session([cell]) as session:
        session.start()
        out = session.run(Call(chapter="test", exercise="f", case="c", target="f", args=[torch.ones(3, 1, 4)]))
    assert seen in out.forbidden, (out.error, out.forbidden)

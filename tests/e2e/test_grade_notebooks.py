"""Grading whole notebooks end to end: the CLI, the reports, batch grading, and submissions as
students write them (helper cells, plots, magics, reordered cells, other formulas, bugs)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.batch.grade_class import grade_class
from autograder.shared.contract import CHAPTERS
from autograder.grading.grader import Grader
from autograder.references.solutions import load_reference

REPO = Path(__file__).resolve().parents[2]
CH2 = "02_scaled_dot_product_attention"
TOTAL = sum(c.points for c in CHAPTERS.values())


def notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)
    return path


def scores(result) -> dict:
    out = {}
    for ch in result.chapters:
        for t in ch.tests:
            out[t.exercise] = out.get(t.exercise, 0) + t.score
    return out


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO)


def test_cli_solutions_score_full_marks_with_json_and_html(tmp_path):
    r = cli("grade", "solutions", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "f.html"))
    assert r.returncode == 0, r.stderr
    assert f"Total: {TOTAL} / {TOTAL}" in r.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == pytest.approx(TOTAL)
    answers = sum(ex.kind == "answer" for c in CHAPTERS.values() for ex in c.exercises)
    # a CPU and a device row per exercise, but one row for a written answer (a value, not code)
    assert len(data["tests"]) == 2 * sum(len(c.exercises) for c in CHAPTERS.values()) - answers
    assert {t["extra_data"]["device"] for t in data["tests"]} <= {"cpu", "fake-cuda", "cuda"}
    assert "<html" in (tmp_path / "f.html").read_text()


def test_cli_untouched_exercises_score_zero_with_clear_messages(tmp_path):
    r = cli("grade", "exercises", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    assert f"Total: 0 / {TOTAL}" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == 0
    for t in data["tests"]:
        assert t["score"] == 0 and "not implemented yet" in t["output"], t


def test_cli_usage_errors_exit_2():
    assert cli("grade", "no/such/path.ipynb").returncode == 2
    assert cli("grade").returncode == 2
    assert cli("frobnicate").returncode == 2
    r = cli("batch", str(REPO), "--jobs", "0")
    assert r.returncode == 2 and "--jobs: must be at least 1" in r.stderr
    r = cli("grade", "--help")
    assert r.returncode == 0 and "--json" in r.stdout and "--device" in r.stdout


CORRECT_DIFFERENTLY = [
    "%matplotlib inline\nimport math\nimport torch\n!echo installing nothing",
    "def _scores(q, k):\n    return torch.einsum('...qd,...kd->...qk', q, k) / math.sqrt(q.shape[-1])",
    "%%time\ndef scaled_dot_product_attention(q, k, v, mask=None):\n"
    "    s = _scores(q, k)\n"
    "    if mask is not None:\n"
    "        s = s.masked_fill(~mask, float('-inf')) if mask.dtype == torch.bool else s + mask\n"
    "    m = s.amax(dim=-1, keepdim=True)\n"
    "    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))\n"
    "    e = torch.exp(s - m)\n"
    "    z = e.sum(dim=-1, keepdim=True)\n"
    "    w = torch.where(z > 0, e / z.clamp_min(torch.finfo(e.dtype).tiny), torch.zeros_like(e))\n"
    "    return torch.einsum('...qk,...kd->...qd', w, v), w",
    "import matplotlib.pyplot as plt\nx = torch.randn(4, 8)\n"
    "_, w = scaled_dot_product_attention(x, x, x)\nplt.imshow(w)\nplt.show()\nw.sum(-1)",
    "%timeit scaled_dot_product_attention(x, x, x)",
    "class SelfAttention(torch.nn.Module):\n"
    "    def __init__(self, d_model, d_k):\n"
    "        super().__init__()\n"
    "        self.W_q, self.W_k, self.W_v = (torch.nn.Linear(d_model, d_k, bias=False) for _ in range(3))\n"
    "    def forward(self, x, mask=None):\n"
    "        return scaled_dot_product_attention(self.W_q(x), self.W_k(x), self.W_v(x), mask)",
    "predict_equal_keys_output = torch.tensor([[4, 2.001]])  # a written answer, read in the sandbox",
    "def fixed_masked_attention(q, k, v, mask):\n    return scaled_dot_product_attention(q, k, v, mask)",
    "raise RuntimeError('a cell that fails does not stop the grading')",
]


def test_correct_but_different_notebook_gets_full_marks(tmp_path):
    nb = notebook(tmp_path / f"{CH2}.ipynb", *CORRECT_DIFFERENTLY)
    result = Grader(device="cpu").grade_path(nb)
    assert result.score == pytest.approx(CHAPTERS[CH2].points), [
        (t.exercise, t.device, t.first_failure) for c in result.chapters for t in c.tests]
    assert any("RuntimeError" in n for n in result.chapters[0].notes)


IPYTHON_IN_CODE = (
    "from IPython import get_ipython\n"
    "get_ipython().run_line_magic('load_ext', 'autoreload')\n"
    "get_ipython().run_line_magic('autoreload', '2')\n"
    "import IPython\n"
    "IPython.get_ipython().system('echo hello')\n"
    "from IPython.core.getipython import get_ipython as shell\n"
    "shell().run_cell_magic('time', '', 'x = 1')\n"
    "from IPython.display import display\n"
    "display(IPython.__name__)\n"
    "# what a library asks (matplotlib, tqdm): no kernel here\n"
    "import importlib\n"
    "assert importlib.import_module('IPython').get_ipython() is None\n"
    "import tqdm.auto\n"
    "for _ in tqdm.auto.tqdm(range(3)):\n"
    "    pass\n"
    "# the usual \"am I in a notebook?\" tests: not here, as outside a kernel\n"
    "def in_notebook():\n"
    "    try:\n"
    "        if 'IPKernelApp' not in get_ipython().config:\n"
    "            return False\n"
    "    except (ImportError, AttributeError):\n"
    "        return False\n"
    "    return True\n"
    "assert not in_notebook()\n"
    "if IPython.get_ipython() is not None:\n"
    "    IPython.get_ipython().kernel.comm_manager\n"
    "import types\n"
    "assert isinstance(IPython, types.ModuleType) and IPython.__version__\n"
    "import math\n"
    "import torch\n")


def test_ipython_called_from_code_works_as_in_a_kernel(tmp_path):
    """`from IPython import get_ipython` then its methods, as jupytext and nbconvert write magics
    (a kernel runs them; IPython's own get_ipython returns None outside one): the cell runs, and
    the libraries still see no kernel. It cost the imports cell, and 17 of 18 points, before."""
    cells = [IPYTHON_IN_CODE, *CORRECT_DIFFERENTLY[1:]]
    result = Grader(device="cpu").grade_path(notebook(tmp_path / f"{CH2}.ipynb", *cells))
    assert result.score == pytest.approx(CHAPTERS[CH2].points), result.chapters[0].notes
    assert not any("cell 1" in n for n in result.chapters[0].notes), result.chapters[0].notes


def test_buggy_notebook_loses_credit_where_it_breaks_with_a_hint(tmp_path):
    cells = list(CORRECT_DIFFERENTLY)
    cells[1] = "def _scores(q, k):\n    return q @ k.transpose(-2, -1)"  # forgot 1/sqrt(d_k)
    result = Grader(device="cpu").grade_path(notebook(tmp_path / f"{CH2}.ipynb", *cells))
    s = scores(result)
    assert s["scaled_dot_product_attention"] < 10 * 0.8
    sdpa = next(t for t in result.chapters[0].tests if t.exercise == "scaled_dot_product_attention")
    assert "unscaled" in (sdpa.first_failure.hint or "")
    assert sdpa.first_failure.figure is not None  # the feedback page shows the weights


def test_notebook_of_another_chapter_is_named(tmp_path):
    src = nbformat.read(REPO / "solutions" / "03_multi_head_attention.ipynb", as_version=4)
    nbformat.write(src, tmp_path / f"{CH2}.ipynb")
    result = Grader(device="cpu").grade_path(tmp_path / f"{CH2}.ipynb")
    assert result.score == 0
    assert any("wrong notebook" in n and "03_multi_head_attention" in n for n in result.chapters[0].notes)


def test_forbidden_builtin_in_a_notebook_scores_zero_and_says_why(tmp_path):
    nb = notebook(tmp_path / f"{CH2}.ipynb",
                  "import torch\nfrom torch.nn import functional as nnf\nsdpa = nnf.scaled_dot_product_attention",
                  "def scaled_dot_product_attention(q, k, v, mask=None):\n"
                  "    out = sdpa(q, k, v, attn_mask=mask)\n"
                  "    w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1)\n"
                  "    return out, w")
    result = Grader(device="cpu").grade_path(nb)
    t = [t for t in result.chapters[0].tests if t.exercise == "scaled_dot_product_attention"]
    assert all(x.score == 0 for x in t) and all("scaled_dot_product_attention" in x.note for x in t)


def test_batch_grades_a_class_into_a_csv_and_reports(tmp_path):
    cls = tmp_path / "class"
    for name, src in (("alice", "solutions"), ("bob", "exercises")):
        shutil.copytree(REPO / src, cls / name, ignore=shutil.ignore_patterns("0[3-6]*"))
    (cls / "carol").mkdir()
    (cls / "carol" / f"{CH2}.ipynb").write_text("{ this is not json")
    results = grade_class(cls, Grader(device="cpu"), jobs=2, out_dir=tmp_path / "out",
                          csv_path=tmp_path / "grades.csv", chapters=["01_intuition", CH2], progress=False)
    from grading_helpers import read_gradebook
    rows = read_gradebook(tmp_path / "grades.csv")
    full = CHAPTERS["01_intuition"].points + CHAPTERS[CH2].points
    assert float(rows["alice"]["Total"]) == pytest.approx(full)
    assert float(rows["bob"]["Total"]) == 0
    assert float(rows["carol"]["Total"]) == 0 and results["carol"].chapters
    assert rows["carol"][CH2] == "" and "not valid JSON" in rows["carol"]["Notes"]  # blank, with the reason
    carol_ch2 = next(c for c in results["carol"].chapters if c.chapter == CH2)
    assert any("not valid JSON" in n for n in carol_ch2.notes)
    for name in rows:
        assert (tmp_path / "out" / name / "results.json").exists()
        assert (tmp_path / "out" / name / "feedback.html").exists()


def test_a_batch_leaves_nothing_in_the_temporary_folder(tmp_path):
    """Each pool worker stages the child's modules and may start a zygote; workers leave by
    os._exit (no atexit), so on a cluster every batch used to leave its stages in /tmp."""
    import os
    import tempfile

    cls = tmp_path / "class"
    for name in ("ann", "ben", "cy"):
        (cls / name).mkdir(parents=True)
        shutil.copy(REPO / "solutions" / "01_intuition.ipynb", cls / name)
    tmp = Path(tempfile.mkdtemp(prefix="batch-tmpdir-"))  # (under /tmp: the sandbox's nobody reads it)
    try:
        tmp.chmod(0o755)
        r = subprocess.run([sys.executable, "-m", "autograder", "batch", str(cls), "--jobs", "2",
                            "--out", str(tmp_path / "out"), "--csv", str(tmp_path / "g.csv"),
                            "--device", "cpu"],
                           capture_output=True, text=True, timeout=600, cwd=REPO,
                           env={**os.environ, "TMPDIR": str(tmp)})
        assert r.returncode == 0, r.stderr
        assert "graded 3 submissions" in r.stderr + r.stdout
        assert sorted(os.listdir(tmp)) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_batch_workers_take_the_settings_of_each_run(tmp_path, monkeypatch):
    """Workers fork from a long-lived forkserver; each run's working directory and AUTOGRADER_*
    settings must still reach them (here: the sandbox mode, read by the student sessions)."""
    cls = tmp_path / "class"
    for name in ("ann", "ben"):
        (cls / name).mkdir(parents=True)
        shutil.copy(REPO / "solutions" / "01_intuition.ipynb", cls / name)
    monkeypatch.chdir(tmp_path)
    first = grade_class(Path("class"), Grader(device="cpu"), jobs=2, progress=False)
    monkeypatch.setenv("AUTOGRADER_SANDBOX", "none")
    second = grade_class(Path("class"), Grader(device="cpu"), jobs=2, progress=False)
    full = CHAPTERS["01_intuition"].points
    assert [r.score for r in first.values()] == [full, full]
    assert [r.score for r in second.values()] == [full, full]
    assert all(r.sandbox == "fallback" for r in second.values())
    from autograder.sandbox.modes import choose_mode
    monkeypatch.delenv("AUTOGRADER_SANDBOX")
    if choose_mode()[0] == "bubblewrap":  # the first run really used another mode
        assert all(r.sandbox == "bubblewrap" for r in first.values())


# 160 gradings: 340 s at load average 5 on 2 cores, past pytest's 600 s at 10 (its timeout then
# fired inside a graded call, which recorded it as the call's error: see execute's `trusted`)
@pytest.mark.timeout(1800)
def test_grading_is_deterministic_and_solutions_never_flake():
    """The same submission graded twice scores the same; the references score full marks in
    20 repeated runs (in process: the sandboxed path runs the same cases and comparisons)."""
    for chapter in CHAPTERS.values():
        ref = load_reference(chapter.id)
        for _ in range(20):
            tests = Grader(device="cpu").grade_namespace(chapter, ref)
            assert sum(t.score for t in tests) == pytest.approx(chapter.points), [
                (t.exercise, t.device, t.first_failure) for t in tests if t.score < t.max_score]
    a = Grader(device="cpu").grade_path(REPO / "exercises" / f"{CH2}.ipynb")
    b = Grader(device="cpu").grade_path(REPO / "exercises" / f"{CH2}.ipynb")
    assert [t.score for t in a.chapters[0].tests] == [t.score for t in b.chapters[0].tests]


def test_a_grader_fault_zeroes_that_chapter_only_and_says_so(monkeypatch):
    real = Grader.grade_notebook

    def faulty(self, path, chapter, *args, **kwargs):
        if chapter.id == CH2:
            raise RuntimeError("boom")
        return real(self, path, chapter, *args, **kwargs)

    monkeypatch.setattr(Grader, "grade_notebook", faulty)
    result = Grader(device="cpu").grade_path(REPO / "solutions", chapters=["01_intuition", CH2])
    by = {c.chapter: c for c in result.chapters}
    assert by["01_intuition"].score == CHAPTERS["01_intuition"].points
    assert by[CH2].score == 0
    assert any("internal grader error (RuntimeError: boom)" in n for n in by[CH2].notes)
    assert all("grader error: RuntimeError: boom" in t.note for t in by[CH2].tests)


def test_a_notebook_is_read_and_parsed_once_for_every_check_of_its_code(tmp_path, monkeypatch):
    """Chapter 3's solution with a SyntaxError in fixed_heads_attention's cell, graded as batch
    grades a student (`grade_planned`, then the class report's flags): the static checks, the
    trust checks of MultiHeadAttention's required ValueError, the diagnosis of the missing name
    and the identical-code and similarity flags all read one `ParsedSubmission`: each cell is
    parsed once (each reader parsed its own copy before), and the diagnosis still points at
    the cell with the SyntaxError."""
    import ast
    from collections import Counter

    from autograder.report import class_report, similarity
    from autograder.source.submission import ParsedSubmission

    ch3 = "03_multi_head_attention"
    nb = nbformat.read(REPO / "solutions" / f"{ch3}.ipynb", as_version=4)
    broken = next(c for c in nb.cells if c.source.startswith("def fixed_heads_attention("))
    broken.source = broken.source.replace("(q, k, v, num_heads)", "(q, k, v num_heads)", 1)
    path = tmp_path / f"{ch3}.ipynb"
    nbformat.write(nb, path)
    cells = ParsedSubmission.read(path).cells
    for flags in (class_report.identical_to_solutions, similarity.fingerprints):
        flags([(ch3, ParsedSubmission([]))])  # (the published solution's own parse, cached)
    parsed, real = Counter(), ast.parse

    def counting(source, *args, **kwargs):
        parsed[source] += 1
        return real(source, *args, **kwargs)
    monkeypatch.setattr(ast, "parse", counting)

    from autograder.sandbox.modes import resolve_sandbox
    from autograder.sandbox.pool import student_pool

    grader = Grader(device="cpu")
    _, todo = grader.plan(path)
    pool = student_pool(resolve_sandbox("auto"))  # (as a batch worker owns a student's sandboxes)
    try:
        chapters = [grader.grade_planned(chapter, notebook, pool) for chapter, notebook in todo]
    finally:
        if pool is not None:
            pool.close()
    assert not any(ch.error for ch in chapters), [ch.error for ch in chapters]
    sources = Grader.graded_sources(chapters)
    identical = class_report.identical_to_solutions(sources)
    similarity.fingerprints(sources)
    assert {source: parsed[source] for source in cells} == Counter(cells)
    assert [ch3, "MultiHeadAttention"] in identical
    tests = {(t.exercise, t.device): t for t in chapters[0].tests}
    number = cells.index(next(c for c in cells if c.startswith("def fixed_heads_attention("))) + 1
    assert f"It is defined in cell {number}, which failed: SyntaxError" in tests["fixed_heads_attention", "cpu"].note
    assert tests["MultiHeadAttention", "cpu"].score == tests["MultiHeadAttention", "cpu"].max_score


def test_a_batch_lets_each_chapters_parse_go_before_the_next(tmp_path, monkeypatch):
    """A student can make a notebook's parse hundreds of MB (long literals in many cells): the
    batch keeps only what the class report reads of each chapter, before their next chapter is
    read, and those flags are what reading all their notebooks again gives."""
    from autograder.batch import workers

    chapters = ["01_intuition", "05_masks"]
    for ch in chapters:
        shutil.copy(REPO / "solutions" / f"{ch}.ipynb", tmp_path / f"{ch}.ipynb")
    grader = Grader(device="cpu")
    _, todo = grader.plan(tmp_path)
    graded, held = [], []
    real = grader.grade_planned

    def spy(*args, **kwargs):
        held.append([ch.source is not None for ch in graded])  # (parses held as this one starts)
        graded.append(real(*args, **kwargs))
        return graded[-1]

    monkeypatch.setattr(grader, "grade_planned", spy)
    results = workers.grade_student(grader, todo)
    assert [ch.chapter for ch in results] == chapters and held == [[], [False]]
    assert all(ch.source is None and ch.flags is not None for ch in results)
    flags = workers.student_flags(results)
    assert flags == workers.source_flags(todo)  # (the notebooks read again, from their files)
    assert sorted(map(tuple, flags["identical"])) == sorted(
        (ch, ex.name) for ch in chapters for ex in CHAPTERS[ch].exercises
        if ex.task.similarity_compared)

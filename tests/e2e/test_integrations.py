"""nbgrader and Gradescope, end to end with the real tools."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.shared.contract import CHAPTERS
from autograder.grading.grader import Grader
from autograder.integrations.gradescope import build_zip
from autograder.integrations.nbgrader import make_course

REPO = Path(__file__).resolve().parents[2]
CHAPTERS_USED = ["01_intuition", "02_scaled_dot_product_attention"]
UNSCALED = "scores = scores / math.sqrt(d_k)"


def _break_sdpa(nb_path: Path) -> None:
    """Make the scaled dot-product attention of a notebook forget the 1/sqrt(d_k) scaling."""
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "def scaled_dot_product_attention" in cell.source:
            lines = cell.source.splitlines()
            for i, line in enumerate(lines):
                if line.strip().startswith("return") and "def " not in line:
                    indent = line[: len(line) - len(line.lstrip())]
                    # Recompute the result without the scaling, from the same arguments.
                    lines[i] = (f"{indent}_w = torch.softmax((q @ k.transpose(-2, -1)).masked_fill("
                                f"~mask, float('-inf')) if mask is not None and mask.dtype == torch.bool "
                                f"else (q @ k.transpose(-2, -1)) + (0 if mask is None else mask), dim=-1)\n"
                                f"{indent}_w = torch.nan_to_num(_w)\n{indent}return _w @ v, _w")
                    break
            cell.source = "\n".join(lines)
            break
    nbformat.write(nb, nb_path)


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run(["nbgrader", *args], cwd=course, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


# A cell that forges every grade cell's score in the student's kernel: the grade cells end with
# check(...), whose value nbgrader takes as partial credit, and check is the student's to patch.
KERNEL_FORGER = """import autograder.selfcheck as _selfcheck
from autograder.shared.contract import CHAPTERS as _CHAPTERS
_selfcheck.check = lambda chapter, exercise, obj, **kw: _CHAPTERS[chapter].exercise(exercise).points
"""


def _kernel_scores(nb_path: Path) -> float:
    """What nbgrader's own grading would give: the notebook run in a kernel (nbgrader's Execute
    step), each grade cell scored from its outputs (nbgrader's determine_grade)."""
    from nbclient import NotebookClient
    from nbgrader.utils import determine_grade

    nb = nbformat.read(nb_path, as_version=4)
    NotebookClient(nb, timeout=120, allow_errors=True, resources={"metadata": {"path": str(nb_path.parent)}}).execute()
    return sum(determine_grade(c)[0] for c in nb.cells
               if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"))


@pytest.mark.timeout(1200)
def test_nbgrader_round_trip_agrees_with_our_grader_and_a_patched_kernel_changes_nothing(tmp_path):
    """nbgrader autograde gets its scores from the sandboxed grader (SandboxedGrades in place of
    Execute): they equal `grade`'s, and a student whose first cell patches the self-check in the
    kernel (full marks from blank templates when the kernel is believed) gets zero."""
    course = make_course(tmp_path / "course", chapters=CHAPTERS_USED)
    _nbgrader(course, "generate_assignment", "attention", "--force")
    release = course / "release" / "attention"
    assert sorted(p.name for p in release.glob("*.ipynb")) == [f"{c}.ipynb" for c in CHAPTERS_USED]
    released = (release / "02_scaled_dot_product_attention.ipynb").read_text()
    assert "HIDDEN TESTS" not in released and "NotImplementedError" in released
    # a written answer is released as the exercise notebooks have it: `predict_x = ...`
    answer = next(c for c in nbformat.read(release / "02_scaled_dot_product_attention.ipynb", as_version=4).cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "predict_equal_keys_output")
    assert answer.source.startswith("predict_equal_keys_output = ...") and "raise" not in answer.source
    # the config names no absolute path: the course folder can be moved
    assert str(course) not in (course / "nbgrader_config.py").read_text()

    students = {"good": course / "source" / "attention", "stub": release, "buggy": course / "source" / "attention",
                "forger": release}
    for sid, src in students.items():
        _nbgrader(course, "db", "student", "add", sid)
        dest = course / "submitted" / sid / "attention"
        shutil.copytree(src, dest)
        (dest / "timestamp.txt").write_text("2026-01-01 00:00:00.000000 UTC")
    _break_sdpa(course / "submitted" / "buggy" / "attention" / "02_scaled_dot_product_attention.ipynb")
    for nb_path in (course / "submitted" / "forger" / "attention").glob("*.ipynb"):
        nb = nbformat.read(nb_path, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(KERNEL_FORGER))
        nbformat.write(nb, nb_path)
    full = sum(CHAPTERS[c].points for c in CHAPTERS_USED)
    # The attack is real: believed from the kernel, the blank template scores 17 of 18 (all
    # but a written answer whose name the template leaves undefined).
    forged = course / "submitted" / "forger" / "attention" / "02_scaled_dot_product_attention.ipynb"
    assert _kernel_scores(forged) >= 0.9 * CHAPTERS["02_scaled_dot_product_attention"].points

    _nbgrader(course, "autograde", "attention", "--force")
    _nbgrader(course, "export", "--to", str(tmp_path / "grades.csv"))
    with open(tmp_path / "grades.csv") as f:
        nb_scores = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(f)}

    # (the course's own seed: which of a buggy notebook's cases pass by chance depends on the inputs)
    seed = next(int(line.split("=")[1]) for line in (course / "nbgrader_config.py").read_text().splitlines()
                if line.startswith("c.SandboxedGrades.seed"))
    grader = Grader(device="cpu", seed=seed)
    ours = {sid: grader.grade_path(course / "submitted" / sid / "attention", chapters=CHAPTERS_USED).score
            for sid in students}
    assert ours["good"] == pytest.approx(full) and nb_scores["good"] == pytest.approx(full)
    assert ours["stub"] == 0 and nb_scores["stub"] == 0
    assert ours["forger"] == 0 and nb_scores["forger"] == 0
    assert 0 < ours["buggy"] < full
    for sid in students:
        assert nb_scores[sid] == pytest.approx(ours[sid], abs=1e-3), (sid, nb_scores, ours)
    # The autograded notebook (what nbgrader's feedback shows) carries the grader's diagnosis.
    autograded = (course / "autograded" / "buggy" / "attention" / "02_scaled_dot_product_attention.ipynb").read_text()
    assert "sqrt(d_k)" in autograded, autograded[-3000:]


def test_gradescope_zip_runs_in_a_simulated_autograder_tree(tmp_path):
    zip_path = build_zip(tmp_path / "autograder.zip", chapters=["02_scaled_dot_product_attention"])
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zip_path) as z:
        names = z.namelist()
        assert {"setup.sh", "run_autograder"} <= set(names)
        assert "solutions/02_scaled_dot_product_attention.ipynb" in names
        stored = [n for n in names if n.startswith("reference-cache/references-")]
        assert len(stored) == 1
        z.extractall(root / "source")
    stamp = (root / "source" / stored[0]).stat().st_mtime_ns
    run_autograder = root / "source" / "run_autograder"
    run_autograder.chmod(0o755)
    submission = root / "submission"
    submission.mkdir()
    shutil.copy(REPO / "solutions" / "02_scaled_dot_product_attention.ipynb", submission)
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    r = subprocess.run(["bash", str(run_autograder)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == pytest.approx(CHAPTERS["02_scaled_dot_product_attention"].points)
    # the reference outcomes came with the zip: none was computed (or stored) for this run
    assert [n for n in names if n.startswith("reference-cache/")] == stored
    assert sorted(p.name for p in (root / "source" / "reference-cache").iterdir()) == \
        [Path(n).name for n in stored]
    assert (root / "source" / stored[0]).stat().st_mtime_ns == stamp
    assert results["tests"], "no tests in results.json"
    graded = {t["extra_data"]["exercise"] for t in results["tests"]}
    assert {"predict_equal_keys_output", "fixed_masked_attention"} <= graded  # the other kinds too
    for t in results["tests"]:
        assert {"name", "score", "max_score", "output", "extra_data"} <= set(t)
        assert t["extra_data"]["chapter"] == "02_scaled_dot_product_attention"
        assert t["extra_data"]["exercise"] in {ex.name for ex in CHAPTERS["02_scaled_dot_product_attention"].exercises}
        assert t["extra_data"]["device"] in {"cpu", "fake-cuda", "cuda"}
        assert 0 <= t["score"] <= t["max_score"]


def test_gradescope_always_writes_results_even_for_an_empty_submission(tmp_path):
    from autograder.integrations.gradescope import run

    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "submission" / "notes.txt").write_text("I did not do the homework")
    data = run(root, ["02_scaled_dot_product_attention"])
    written = json.loads((root / "results" / "results.json").read_text())
    assert written == data and data["score"] == 0
    assert all(t["score"] == 0 for t in data["tests"]) and data["tests"]


def test_torch_is_pinned_in_pyproject_only_and_every_installer_uses_that_pin(tmp_path):
    import re
    import tomllib

    from autograder.integrations.gradescope import torch_requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d for d in deps if d.startswith("torch")]
    assert pins == [torch_requirement()] and re.fullmatch(r"torch==[\d.]+", pins[0])
    version = pins[0].split("==")[1]
    for path in ("requirements.txt", "tools/install.sh"):
        assert version not in (REPO / path).read_text(), path
    r = subprocess.run(["bash", "-c", "sed -n 's/^ *\"\\(torch==[^\"]*\\)\".*/\\1/p' pyproject.toml"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.stdout.strip() == pins[0]  # what install.sh reads
    assert "sed -n 's/^ *\"\\(torch==[^\"]*\\)\".*/\\1/p' pyproject.toml" in (REPO / "tools/install.sh").read_text()
    with zipfile.ZipFile(build_zip(tmp_path / "a.zip", chapters=["05_masks"])) as z:
        setup = z.read("setup.sh").decode()
    assert f'"{pins[0]}"' in setup and setup.count("torch==") == 1

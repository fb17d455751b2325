"""The container mode, end to end: the Gradescope bundle run the way Gradescope runs it, as root
in a container with Docker's default capabilities (no CAP_SYS_ADMIN, so no namespaces:
simulated with `capsh --drop=cap_sys_admin`). bubblewrap cannot start there; the grader gives
each student's code a uid of its own, and `run_autograder` makes the grader's files unreadable
to it. Before: "The autograder failed on this submission", score 0 for everyone.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.integrations.gradescope import build_zip

REPO = Path(__file__).resolve().parents[2]
CAPSH = shutil.which("capsh")
pytestmark = pytest.mark.skipif(not (CAPSH and os.geteuid() == 0 and sys.platform == "linux"),
                                reason="needs root and capsh (libcap2-bin) to simulate a container")

HOSTILE = '''import glob, json, os
ROOT = os.environ.get("AUTOGRADER_ROOT_GUESS", "{root}")
TRIED = {{}}
for name, action in [
        ("read solutions", lambda: open(ROOT + "/source/solutions/05_masks.ipynb").read()),
        ("list the grader", lambda: os.listdir(ROOT + "/source/autograder")),
        ("write results", lambda: open(ROOT + "/results/results.json", "w").write('{{"score": 100}}')),
        ("leave a file in results", lambda: open(ROOT + "/results/forged", "w").write("x")),
        ("read the reference cache", lambda: os.listdir(ROOT + "/source/reference-cache"))]:
    try:
        action()
        TRIED[name] = "done"
    except OSError as e:
        TRIED[name] = type(e).__name__
print("TRIED", json.dumps(TRIED))

def causal_mask(seq_len, device=None):  # the solution's, if it can be read
    nb = json.load(open(ROOT + "/source/solutions/05_masks.ipynb"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            exec("".join(cell["source"]), globals())
    return globals()["causal_mask"](seq_len, device)
'''


def run_like_gradescope(tmp_path: Path, submission: nbformat.NotebookNode) -> tuple[dict, float, str]:
    root = tmp_path / "autograder"
    with zipfile.ZipFile(build_zip(tmp_path / "autograder.zip", chapters=["05_masks"])) as z:
        z.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    nbformat.write(submission, root / "submission" / "05_masks.ipynb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOGRADER_")}
    env.update(AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable)
    t0 = time.monotonic()
    r = subprocess.run([CAPSH, "--drop=cap_sys_admin", "--", "-c", f"bash {root / 'run_autograder'}"],
                       env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - t0
    results = json.loads((root / "results" / "results.json").read_text())
    return results, seconds, r.stdout + r.stderr


def test_bubblewrap_cannot_start_there():
    code = "from autograder.sandbox.modes import probe_bubblewrap; print(probe_bubblewrap()[0])"
    r = subprocess.run([CAPSH, "--drop=cap_sys_admin", "--", "-c", f"{sys.executable} -c '{code}'"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.stdout.strip() == "False", r.stdout + r.stderr


def test_the_solutions_score_full_marks_in_the_container_mode(tmp_path):
    submission = nbformat.read(REPO / "solutions" / "05_masks.ipynb", as_version=4)
    results, seconds, log = run_like_gradescope(tmp_path, submission)
    assert results["score"] == pytest.approx(13.0), (results.get("output"), log)
    # the sandbox's notes are the instructor's: in the autograder's stdout, not the student's output
    assert "sandbox: container" in log and "sandbox" not in results["output"]
    print(f"Gradescope simulation, one submission: {seconds:.1f} s")


def test_a_student_cannot_read_the_solutions_nor_write_the_results(tmp_path):
    submission = nbformat.read(REPO / "exercises" / "05_masks.ipynb", as_version=4)
    root = tmp_path / "autograder"
    submission.cells.append(nbformat.v4.new_code_cell(HOSTILE.format(root=root)))
    results, _, log = run_like_gradescope(tmp_path, submission)
    assert results["score"] == 0.0, (results, log)
    assert "sandbox: container" in log and "sandbox" not in results["output"]
    causal = [t for t in results["tests"] if t["extra_data"]["exercise"] == "causal_mask"]
    assert causal and all(t["score"] == 0 for t in causal)
    assert "PermissionError" in json.dumps(results["tests"])  # what the stolen read met
    assert not (root / "results" / "forged").exists()  # the results folder is not the student's

"""The runner wherever Python lives, and no silent degradation of the sandbox.

Each test runs the real command line (`python -m autograder grade`) as a fresh process:
- from virtual environments under /tmp, under the home folder and inside the repository, the
  grading is sandboxed and a submission that reads the solutions from disk gets nothing for it;
- bubblewrap installed but broken (a fake `bwrap` that exits 1) stops with exit status 3 and
  grades nothing; bubblewrap absent falls back loudly (stderr and the report);
- in the fallback as root the child runs as `nobody`: it cannot signal the grader or read
  root's files.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from autograder.sandbox.policy import REPO_DIR

ROOT = os.geteuid() == 0
SOLUTION = REPO_DIR / "solutions" / "01_intuition.ipynb"


def _notebook(path: Path, cells: list[str]) -> Path:
    path.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {},
        "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": c, "id": f"c{i}"} for i, c in enumerate(cells)]}))
    return path


def thief(folder: Path) -> Path:
    """A chapter 1 submission that takes its code from the reference solution on disk."""
    cell = textwrap.dedent(f"""
        import json, torch
        try:
            nb = json.load(open({str(SOLUTION)!r}))
            for c in nb["cells"]:
                if c["cell_type"] == "code" and "selfcheck" not in "".join(c["source"]):
                    exec("".join(c["source"]), globals())
        except OSError as e:
            print("no solutions here:", type(e).__name__)
    """)
    return _notebook(folder / "01_intuition.ipynb", [cell])


def grade(python: str, notebook: Path, *extra: str, path_env: str | None = None, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(REPO_DIR)}
    if path_env is not None:
        env["PATH"] = path_env
    out = Path(cwd or notebook.parent) / "results.json"
    r = subprocess.run([python, "-m", "autograder", "grade", str(notebook), "--device", "cpu",
                        "--json", str(out), *extra], capture_output=True, text=True, env=env,
                       cwd=cwd or notebook.parent, timeout=600)
    results = json.loads(out.read_text()) if out.exists() else None
    return r, results


def _venv(where: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(where)], check=True, timeout=300)
    return str(where / "bin" / "python")


def _venv_places():
    yield pytest.param("tmp", id="venv-under-tmp")
    yield pytest.param("home", id="venv-under-home")
    yield pytest.param("repo", id="venv-inside-the-repository")


@pytest.mark.needs_bwrap
@pytest.mark.parametrize("place", _venv_places())
def test_grading_from_a_venv_is_sandboxed(place, tmp_path):
    base = {"tmp": Path("/tmp"), "home": Path.home(), "repo": REPO_DIR}[place]
    folder = Path(tempfile.mkdtemp(prefix=".autograder-venv-test-", dir=base))
    try:
        python = _venv(folder / "venv")
        r, results = grade(python, thief(tmp_path), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "sandbox: bubblewrap" in r.stdout, r.stdout + r.stderr
        assert "WARNING" not in r.stderr
        assert results is not None and results["score"] == 0, results
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _fake_bwrap(folder: Path) -> Path:
    folder.mkdir()
    fake = folder / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def test_broken_bubblewrap_stops_with_exit_3_and_grades_nothing(tmp_path):
    fake = _fake_bwrap(tmp_path / "bin")
    nb = thief(tmp_path)
    for extra in ((), ("--sandbox", "auto"), ("--sandbox", "bubblewrap")):
        r, results = grade(sys.executable, nb, *extra, path_env=f"{fake}:{os.environ['PATH']}")
        assert r.returncode == 3, (extra, r.returncode, r.stdout, r.stderr)
        assert results is None and r.stdout == ""
        assert "bubblewrap" in r.stderr and "cannot start" in r.stderr and "Fix:" in r.stderr
        assert "Permission denied" in r.stderr  # the cause, as bwrap gave it


def test_explicit_none_grades_loudly_even_with_broken_bubblewrap(tmp_path):
    fake = _fake_bwrap(tmp_path / "bin")
    r, results = grade(sys.executable, _notebook(tmp_path / "01_intuition.ipynb", ["x = 1"]),
                       "--sandbox", "none", path_env=f"{fake}:{os.environ['PATH']}")
    assert r.returncode == 0, r.stderr
    assert "WARNING" in r.stderr and "without namespaces" in r.stderr
    assert "sandbox: fallback" in r.stdout
    # (the sandbox's notes are the instructor's: the terminal, never the student's Gradescope output)
    assert "without namespaces" not in results["output"]


def test_absent_bubblewrap_falls_back_loudly(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    r, results = grade(sys.executable, _notebook(tmp_path / "01_intuition.ipynb", ["x = 1"]),
                       path_env=str(empty))
    assert r.returncode == 0, r.stderr
    assert "WARNING" in r.stderr and "not installed" in r.stderr
    assert "sandbox: fallback" in r.stdout
    assert "not installed" not in results["output"]


@pytest.mark.skipif(not ROOT, reason="the grader runs as root only in containers and CI")
def test_fallback_as_root_cannot_signal_the_grader_or_read_roots_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root only")
    secret.chmod(0o600)
    tmp_path.chmod(0o755)
    cell = textwrap.dedent(f"""
        import os, signal
        print("uid", os.getuid())
        try:
            open({str(secret)!r}).read()
            print("read the secret")
        except OSError as e:
            print("secret:", type(e).__name__)
        os.kill(os.getppid(), signal.SIGKILL)
    """)
    script = tmp_path / "grader.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_DIR)!r})
        from autograder.session.student_session import StudentSession
        with StudentSession([{cell!r}], sandbox="none") as s:
            report = s.start()
        print("GRADER ALIVE", report.sandbox, report.cells[0].error["type"])
        print(report.cells[0].output)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "GRADER ALIVE fallback PermissionError" in r.stdout, r.stdout + r.stderr
    assert "uid 65534" in r.stdout and "secret: PermissionError" in r.stdout
    assert "read the secret" not in r.stdout

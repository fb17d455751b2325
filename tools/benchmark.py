"""Benchmark the grader (prints figures; not a test).

    python tools/benchmark.py [--students 20] [--skip-nbgrader]

1. wall time to grade the six solution notebooks as one submission (CPU);
2. `nbgrader autograde` of the same six notebooks, in the same run;
3. a batch of N submissions with --jobs 1 and --jobs 2;
4. the time of each self-check (the student-side check) on the reference.
Targets (issue 3): (1) <= 15 s and <= half of (2); each self-check < 1 s; jobs 2 >= 1.7x jobs 1.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder.contract import CHAPTERS  # noqa: E402
from autograder.grading import Grader  # noqa: E402
from autograder.references import load_reference  # noqa: E402


def grade_solutions() -> float:
    start = time.perf_counter()
    result = Grader(device="cpu").grade_path(REPO / "solutions")
    seconds = time.perf_counter() - start
    print(f"[1] six solution notebooks, one submission: {seconds:.1f} s, "
          f"score {result.score:g}/{result.max_score:g}, sandbox: {result.sandbox or 'n/a'}")
    return seconds


def nbgrader_autograde(tmp: Path) -> float | None:
    from autograder.integrations.nbgrader import make_course

    course = make_course(tmp / "course")
    run = lambda *a: subprocess.run(["nbgrader", *a], cwd=course, capture_output=True, text=True)  # noqa: E731
    for step in (("generate_assignment", "attention", "--force"), ("db", "student", "add", "bench")):
        r = run(*step)
        if r.returncode:
            print(f"[2] nbgrader {' '.join(step)} failed:\n{r.stderr[-2000:]}")
            return None
    sub = course / "submitted" / "bench" / "attention"
    shutil.copytree(course / "source" / "attention", sub)
    (sub / "timestamp.txt").write_text("2026-01-01 00:00:00.000000 UTC")
    start = time.perf_counter()
    r = run("autograde", "attention", "--force")
    seconds = time.perf_counter() - start
    if r.returncode:
        print(f"[2] nbgrader autograde failed:\n{r.stderr[-2000:]}")
        return None
    print(f"[2] nbgrader autograde, same six notebooks: {seconds:.1f} s")
    return seconds


def batch(tmp: Path, n: int) -> None:
    class_dir = tmp / "class"
    for i in range(n):
        d = class_dir / f"student{i:02d}"
        d.mkdir(parents=True)
        src = REPO / ("solutions" if i % 2 == 0 else "exercises")
        for nb in sorted(src.glob("*.ipynb")):
            shutil.copy(nb, d / nb.name)
    times = {}
    for jobs in (1, 2):
        # Each in a fresh process, as an instructor runs it: imports and start-up included.
        cmd = [sys.executable, "-m", "autograder", "batch", str(class_dir), "--device", "cpu",
               "--jobs", str(jobs), "--no-progress", "--csv", str(tmp / f"grades-{jobs}.csv")]
        start = time.perf_counter()
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        times[jobs] = time.perf_counter() - start
        if r.returncode != 0:
            print(f"[3] batch --jobs {jobs} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
            return
        print(f"[3] batch of {n} submissions, --jobs {jobs}: {times[jobs]:.1f} s")
    print(f"[3] speed-up --jobs 2 vs --jobs 1: {times[1] / times[2]:.2f}x")


def self_checks() -> None:
    import contextlib
    import io

    from autograder.selfcheck import check

    worst = 0.0
    for chapter in CHAPTERS.values():
        ref = load_reference(chapter.id)
        for ex in chapter.exercises:
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                check(chapter.id, ex.name, ref[ex.target])
            seconds = time.perf_counter() - start
            worst = max(worst, seconds)
            print(f"[4] self-check {chapter.id}/{ex.name}: {seconds * 1000:.0f} ms")
    print(f"[4] slowest self-check: {worst * 1000:.0f} ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--students", type=int, default=20)
    p.add_argument("--skip-nbgrader", action="store_true")
    args = p.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, sandbox={os.environ.get('AUTOGRADER_SANDBOX', 'auto')}")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        ours = grade_solutions()
        theirs = None if args.skip_nbgrader else nbgrader_autograde(tmp)
        if theirs:
            print(f"[1/2] ratio ours / nbgrader autograde: {ours / theirs:.2f}")
        self_checks()
        batch(tmp, args.students)
    return 0


if __name__ == "__main__":
    sys.exit(main())

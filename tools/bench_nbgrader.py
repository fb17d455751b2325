#!/usr/bin/env python
"""nbgrader autograde against `batch`, per student, on the same class (issue 30: within 1.5x).

    python tools/bench_nbgrader.py [--students 4] [--chapters 01,02,05]

Builds a class (the solutions and the exercise stubs, alternately), grades it once untimed to
fill the reference cache, then times `python -m autograder batch CLASS --jobs 1` and `nbgrader
autograde` of an nbgrader course holding the same submissions, and prints seconds per student.
Both grade on the same device plan (--device auto) and on the same warm reference cache.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


LOG: list[str] = []  # the last command's output


def run(cmd: list[str], cwd=None) -> float:
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode not in (0,):
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    LOG[:] = [r.stdout + r.stderr]
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--students", type=int, default=4)
    p.add_argument("--chapters", default="01,02,05")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from autograder.shared.contract import CHAPTER_IDS
    from autograder.integrations.nbgrader import make_course

    chapters = [c for part in args.chapters.split(",") for c in CHAPTER_IDS if c[:2] == part.strip()]
    py = [sys.executable, "-m", "autograder"]
    with tempfile.TemporaryDirectory(prefix="bench-nbgrader-") as tmp:
        tmp = Path(tmp)
        cls = tmp / "class"
        students = [f"s{i}" for i in range(args.students)]
        for i, sid in enumerate(students):
            (cls / sid).mkdir(parents=True)
            for c in chapters:
                shutil.copy(REPO / ("solutions" if i % 2 == 0 else "exercises") / f"{c}.ipynb", cls / sid)
        course = make_course(tmp / "course", chapters=chapters)
        # Both grade with the course's seed (made by make_course), on a reference cache warmed for it.
        seed = re.search(r"SandboxedGrades\.seed = (\d+)", (course / "nbgrader_config.py").read_text())[1]
        run(py + ["batch", str(cls), "--csv", str(tmp / "warm.csv"), "--no-progress", "--only", students[0],
                  "--seed", seed])
        run(["nbgrader", "generate_assignment", "attention", "--force"], cwd=course)
        for sid in students:
            run(["nbgrader", "db", "student", "add", sid], cwd=course)
            dest = course / "submitted" / sid / "attention"
            shutil.copytree(cls / sid, dest)
            (dest / "timestamp.txt").write_text("2026-01-01 00:00:00.000000 UTC")

        batch = run(py + ["batch", str(cls), "--csv", str(tmp / "grades.csv"), "--no-progress", "--jobs", "1",
                          "--seed", seed])
        nbg = run(["nbgrader", "autograde", "attention", "--force"], cwd=course)
    grading = sum(float(t) for t in re.findall(r"graded \S+'s \d+ notebooks in ([\d.]+) s", LOG[0]))
    n = len(students)
    print(f"class: {n} students x {len(chapters)} chapters ({', '.join(chapters)})")
    print(f"batch --jobs 1:     {batch:7.1f} s, {batch / n:6.1f} s per student")
    print(f"nbgrader autograde: {nbg:7.1f} s, {nbg / n:6.1f} s per student")
    print(f"  of which grading: {grading:7.1f} s (SandboxedGrades), the rest nbgrader's own steps and start")
    print(f"nbgrader / batch:   {nbg / batch:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark the grader (prints figures; not a test).

    python tools/benchmark.py [--students 20] [--runs 5] [--skip-nbgrader] [--only-grade]
                              [--only-batch] [--only-devices] [--before DIR]

1. what a user waits for: the wall time of `python -m autograder grade solutions` as a fresh
   process, as a ratio to `python -c "import torch"` measured in the same run (alternating
   runs, medians), and the sandbox mode it reported; with an empty reference-outcome cache
   (cold) and with the one an earlier run left (warm);
2. `nbgrader autograde` of the same six notebooks, in the same run;
3. a batch of N submissions with --jobs 1 and --jobs 2;
4. the time of each self-check (the student-side check) on the reference;
5. where a GPU is present, `grade solutions --device cuda` against `--device cpu`, alternating.
With --before DIR, [1] and [3] also time another checkout in the same alternation
(before/after figures on the same machine and load). Every run uses one fixed course seed
($AUTOGRADER_SEED, else BENCH_SEED), as a graded deployment must have one.
Targets (issue 29, 2 cores): (1) warm cache <= 2x import torch, cold <= 3x, sandbox:
bubblewrap; (3) 20 students (half solutions, half stubs) --jobs 2 <= 12 s; each self-check
< 1 s; (5) --device cuda <= 1.3x --device cpu (issue 26).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder.shared.contract import CHAPTERS  # noqa: E402
from autograder.references.solutions import load_reference  # noqa: E402


BENCH_SEED = "20261126"  # (a course seed: batch refuses the public built-in one)


def _wall(cmd: list[str], cwd: Path = REPO, cache: Path | None = None
          ) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    env.setdefault("AUTOGRADER_SEED", BENCH_SEED)
    if cache is not None:
        env["AUTOGRADER_CACHE_DIR"] = str(cache)
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, r


def grade_solutions(runs: int, tmp: Path, before: Path | None = None) -> float:
    """Whole-process wall time of `grade solutions` and of `import torch`, alternating; with
    `before` (another checkout, e.g. the previous commit), its `grade solutions` too.

    Each checkout is timed twice per run: "cold", with an empty reference-outcome cache (the
    first run after installing or changing the grader or solutions), and "warm", with the
    cache an earlier run left (every later run). A checkout without the cache shows the same
    figure twice."""
    checkouts = {"this checkout": REPO}
    if before:
        checkouts = {f"before ({before})": before, **checkouts}
    cmd = [sys.executable, "-m", "autograder", "grade", "solutions", "--device", "cpu"]
    warm_cache = {name: tmp / ("cache-this" if where == REPO else "cache-before")
                  for name, where in checkouts.items()}
    for name, where in checkouts.items():  # fills the warm caches (not timed)
        _wall(cmd, where, warm_cache[name])
    torch_times: list[float] = []
    times: dict[tuple, list[float]] = {}
    modes: dict[str, set] = {name: set() for name in checkouts}
    totals: dict[str, set] = {name: set() for name in checkouts}
    for run in range(runs):
        seconds, _ = _wall([sys.executable, "-c", "import torch"])
        torch_times.append(seconds)
        for name, where in checkouts.items():
            for state in ("cold", "warm"):
                cache = tmp / f"cold-{run}-{len(times)}" if state == "cold" else warm_cache[name]
                seconds, r = _wall(cmd, where, cache)
                if r.returncode != 0:
                    print(f"[1] {name}: grade solutions failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
                    return float("nan")
                times.setdefault((name, state), []).append(seconds)
                found = re.search(r"Total: (\S+ / \S+) .*sandbox: (\w+)", r.stdout)
                if found:
                    totals[name].add(found.group(1))
                    modes[name].add(found.group(2))
    t = statistics.median(torch_times)
    print(f"[1] python -c 'import torch': {' '.join(f'{x:.2f}' for x in torch_times)} s "
          f"(median {t:.2f} s)")
    for (name, state), ts in times.items():
        g = statistics.median(ts)
        print(f"[1] {name}, {state} cache: python -m autograder grade solutions: "
              f"{' '.join(f'{x:.2f}' for x in ts)} s (median {g:.2f} s = {g / t:.1f}x import "
              f"torch; target {'<= 2x' if state == 'warm' else '<= 3x'}), score {', '.join(sorted(totals[name]))}, sandbox: "
              f"{', '.join(sorted(modes[name]))}")
    return statistics.median(times[("this checkout", "warm")])


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


def batch(tmp: Path, n: int, before: Path | None = None) -> None:
    """A class of n (half solutions, half stubs) with --jobs 1 and 2, each in a fresh process
    as an instructor runs it (imports and start-up included), with the reference-outcome cache
    that [1] left (warm, as for an instructor's second command); with `before`, that
    checkout's batch too, alternating."""
    class_dir = tmp / "class"
    shutil.rmtree(class_dir, ignore_errors=True)
    for i in range(n):
        d = class_dir / f"student{i:02d}"
        d.mkdir(parents=True)
        src = REPO / ("solutions" if i % 2 == 0 else "exercises")
        for nb in sorted(src.glob("*.ipynb")):
            shutil.copy(nb, d / nb.name)
    checkouts = {"this checkout": (REPO, tmp / "cache-this")}
    if before:
        checkouts = {f"before ({before})": (before, tmp / "cache-before"), **checkouts}
    times: dict[tuple, float] = {}
    for jobs in (1, 2):
        for name, (where, cache) in checkouts.items():
            cmd = [sys.executable, "-m", "autograder", "batch", str(class_dir), "--device", "cpu",
                   "--jobs", str(jobs), "--no-progress", "--csv", str(tmp / f"grades-{jobs}.csv")]
            busy = _busy_cpu_seconds()
            seconds, r = _wall(cmd, where, cache)
            busy = _busy_cpu_seconds() - busy
            if r.returncode != 0:
                print(f"[3] {name}: batch --jobs {jobs} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
                return
            times[(name, jobs)] = seconds
            cores = os.cpu_count() or 1
            print(f"[3] {name}: batch of {n} submissions, --jobs {jobs}: {seconds:.1f} s "
                  f"(the machine's CPUs busy {busy:.0f} s of {cores * seconds:.0f} s: "
                  f"{busy / (cores * seconds):.0%}; target for --jobs 2: <= 12 s)")
    for name in checkouts:
        print(f"[3] {name}: speed-up --jobs 2 vs --jobs 1: "
              f"{times[(name, 1)] / times[(name, 2)]:.2f}x (target >= 1.7x)")


def cpu_vs_cuda(runs: int, tmp: Path) -> None:
    """`grade solutions` with --device cuda against --device cpu, alternating (warm cache each)."""
    import torch

    if not torch.cuda.is_available():
        print("[5] no GPU here: CPU vs CUDA not measured")
        return
    times: dict[str, list[float]] = {"cpu": [], "cuda": []}
    cache = tmp / "cache-devices"
    for device in times:  # fills the caches (not timed)
        _wall([sys.executable, "-m", "autograder", "grade", "solutions", "--device", device], REPO, cache)
    for _ in range(runs):
        for device in times:
            seconds, r = _wall([sys.executable, "-m", "autograder", "grade", "solutions", "--device", device],
                               REPO, cache)
            found = re.search(r"Total: (\S+ / \S+)", r.stdout)
            times[device].append(seconds)
            print(f"[5] grade solutions --device {device}: {seconds:.2f} s, "
                  f"score {found.group(1) if found else '?'} (exit {r.returncode})")
    cpu, cuda = statistics.median(times["cpu"]), statistics.median(times["cuda"])
    print(f"[5] --device cuda {cuda:.2f} s vs --device cpu {cpu:.2f} s: {cuda / cpu:.2f}x (target <= 1.3x)")


def _busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (/proc/stat; 0 where there is none): the
    sandboxes' processes are not this process's children, so its own rusage misses them."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


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
    p.add_argument("--runs", type=int, default=5, help="runs of [1] (medians are printed)")
    p.add_argument("--skip-nbgrader", action="store_true")
    p.add_argument("--only-grade", action="store_true", help="only [1]")
    p.add_argument("--only-batch", action="store_true", help="only [3] (after filling the cache)")
    p.add_argument("--only-devices", action="store_true", help="only [5] (CPU vs CUDA, where a GPU is)")
    p.add_argument("--before", type=Path, default=None,
                   help="another checkout (e.g. `git archive` of the previous commit) whose "
                        "`grade solutions` [1] also times, alternating with this one")
    args = p.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, sandbox={os.environ.get('AUTOGRADER_SANDBOX', 'auto')}")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if args.only_devices:
            cpu_vs_cuda(args.runs, tmp)
            return 0
        if args.only_batch:
            cmd = [sys.executable, "-m", "autograder", "grade", "solutions", "--device", "cpu"]
            _wall(cmd, REPO, tmp / "cache-this")
            if args.before:
                _wall(cmd, args.before, tmp / "cache-before")
            batch(tmp, args.students, args.before)
            return 0
        ours = grade_solutions(args.runs, tmp, args.before)
        if args.only_grade:
            return 0
        theirs = None if args.skip_nbgrader else nbgrader_autograde(tmp)
        if theirs:
            print(f"[1/2] ratio ours / nbgrader autograde: {ours / theirs:.2f}")
        self_checks()
        batch(tmp, args.students, args.before)
        cpu_vs_cuda(args.runs, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())

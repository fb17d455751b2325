"""Wall-clock bounds that hold on a loaded machine (the suite shares 2 cores with other work).

A bound on how long something takes is what it takes on an idle machine plus what the load
adds at that moment, measured in the same test: `child_start(mode)` is how long starting a
child (Python, torch imported, one cell) and closing it takes right now, so a bound that
counts k child starts adds k * child_start(). CPU-bound checks compare with a workload of the
same kind timed beside them (tests/unit/test_wire.py, tests/unit/test_static_check.py), and a
wait for something to happen (a daemon to appear, processes to die) polls under a generous
deadline: it ends as soon as that happens, and what it waits against lives far longer.
"""
from __future__ import annotations

import time


def child_start(mode: str = "none") -> float:
    """Seconds to start and close a child with one cell that imports torch, in `mode`
    ("bubblewrap", "none", or "auto": what the grader chooses), measured now."""
    from autograder.sandbox.limits import Limits
    from session_helpers import lone_session

    t0 = time.monotonic()
    with lone_session(["import torch"], Limits(cell_timeout=600, notebook_timeout=600), sandbox=mode) as s:
        assert s.start().cells[0].status == "ok"
    return time.monotonic() - t0


def best_of(n: int, work) -> float:
    """The shortest of n timings of work() (the one least disturbed by other processes)."""
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best

"""One GPU shared by the students of a batch: no student can take it from another.

- Each student's CUDA work is bounded: their children set `Limits.gpu_share` (the device's
  memory divided among the batch's workers) as torch's per-process memory fraction before any
  student code runs (`autograder.runtime.child`, at CUDA's first use). That bounds torch's caching
  allocator only: code that raises the fraction again or allocates past torch is stopped by
  what follows, not by it.
- After a student, every process of their uid is killed and the driver is asked (nvidia-smi)
  until it holds no GPU memory for any of them (`release`): the next student of that worker
  starts on a GPU that the one before has left.
- A student whose CUDA case failed with out-of-memory is graded again alone (nothing else
  running, the GPU checked free of every other student's memory) once the rest of the batch
  is done (`hold_back` and `regrade_alone`). If the GPU is still held by someone else then,
  the chapters that failed so are a grader `error` in the CSV, never a silent loss of points.

The driver is read through `nvidia-smi --query-compute-apps` (host PIDs and MiB per process);
where it is missing nothing is checked and the regrade still happens.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

from ..runtime import procs

OOM_WORDS = ("out of memory", "OutOfMemoryError")
NOBODY = 65534
RELEASE_WAIT = 30.0  # seconds for the driver to give back a killed student's memory


def holders() -> dict[int, int] | None:
    """pid -> MiB of GPU memory, for every process the driver lists; None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    table = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        try:
            table[int(pid)] = int(float(mib.strip() or 0))
        except ValueError:
            continue
    return table


def uid_of(pid: int) -> int | None:
    """The process's real uid (None if it is gone), whatever name it gave itself."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return int(procs.status_field(f.read(), b"Uid").split()[0])
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")
    except (OSError, ValueError):
        return False


def release(uid: int, wait: float = RELEASE_WAIT) -> bool:
    """After a student's sandboxes are closed: kill whatever of their uid is left and wait until
    the driver holds no GPU memory for their processes, nor for any process that is gone (a
    killed process's memory comes back late, and one reaped already has no uid to tell whose it
    was). Whether it did (True without a GPU)."""
    # (a uid shared with others, `nobody` or the grader's own, is never killed wholesale here)
    own = uid not in (0, NOBODY, os.getuid())
    table = holders()
    theirs = {pid for pid in table or () if own and uid_of(pid) == uid}
    if own:
        procs.kill_uid(uid)
    if table is None:
        return True
    deadline = time.monotonic() + wait
    while True:
        now = holders() or {}
        if not any(pid in theirs or (own and uid_of(pid) == uid) or not _alive(pid) for pid in now):
            return True
        if time.monotonic() >= deadline:
            return False
        if own:
            procs.kill_uid(uid)
        time.sleep(0.2)


def held_by_others() -> list[int]:
    """The processes that hold GPU memory and are not this grader's own (its process and its
    children's trees run no student code after a student's release)."""
    table = holders() or {}
    mine = {os.getpid()}
    return [pid for pid in table if pid not in mine and uid_of(pid) != os.getuid()]


def oom(chapter_results) -> list[str]:
    """The chapters in which a CUDA case failed with out-of-memory."""
    out = []
    for ch in chapter_results:
        if any(t.device == "cuda" and any(not c.passed and any(w in (c.message or "") for w in OOM_WORDS)
                                          for c in t.cases) for t in ch.tests):
            out.append(ch.chapter)
    return out


def fraction(jobs: int) -> float:
    """Each of `jobs` students at once may have this share of the device's memory."""
    return round(max(0.05, 0.9 / max(1, jobs)), 3)


def configure(grader, jobs: int, chapters) -> None:
    """For a batch graded with CUDA: each student's children get `fraction(jobs)` of the GPU's
    memory, and the grader computes its CUDA reference outcomes now, before any student code
    runs (worker processes receive them)."""
    import dataclasses

    from ..references.cache import REFERENCES

    grader.limits = dataclasses.replace(grader.limits, gpu_share=fraction(jobs))
    try:
        REFERENCES.warm(chapters, ["cuda"], grader.seed, grader.quick)
    except Exception:  # not fatal: what is missing is computed when asked for
        pass


def hold_back(done, grader, held: dict):
    """`done` for a batch, except that a student with a CUDA out-of-memory failure is kept in
    `held` (name -> their results) to be graded again alone (`regrade_alone`)."""
    if "cuda" not in grader.devices:
        return done

    def wrapped(name, chapter_results, *more):
        if oom(chapter_results):
            held[name] = (chapter_results, more)
        else:
            done(name, chapter_results, *more)
    return wrapped


def regrade_alone(held: dict, work: dict, grade_student, grader, done) -> None:
    """Grade each held student again, one at a time, with nothing else on the GPU. A chapter
    that fails with out-of-memory again while another process holds the GPU becomes a grader
    error (`error` in the CSV); alone on it, the failure is the student's own."""
    for name in list(held):
        busy = held_by_others()
        first, more = held[name]
        try:
            results = grade_student(grader, work[name]) if not busy else first
        except Exception as e:  # the grader failed on this student: their error
            results = [grader.failed_chapter(c, nb, e) for c, nb in work[name]]
        busy = busy or held_by_others()
        if busy:
            failing = set(oom(results))
            why = RuntimeError(f"a CUDA case ran out of GPU memory while other processes held the GPU "
                               f"(pids {', '.join(map(str, busy[:5]))}); graded again, it could not run alone")
            plan = dict(work[name])
            results = [grader.failed_chapter(r.chapter, plan.get(r.chapter), why) if r.chapter in failing else r
                       for r in results]
        done(name, results, *more)

"""The batch's worker processes: each grades one student at a time (in the student's own sandbox,
forked from the worker's zygote where there is one), hands the result back through a capped
file, and is killed by the watchdog here when a student outlasts their budget plus a margin;
a pool whose worker died is replaced and its students graded again, alone."""
from __future__ import annotations

import contextlib
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor


from . import first_zygote, forkserver
from .. import settings as _settings
from ..shared.contract import CHAPTERS
from ..references.cache import REFERENCES
from ..grading.grader import Grader
from ..report import class_report
from ..grading.results import ChapterResult, SubmissionResult
from ..sandbox.modes import SandboxMode, resolve_sandbox
from ..sandbox import scratch
from ..sandbox.pool import SandboxPool, pooled, student_pool
from ..report.untrusted_text import capped
from ..runtime import procs


_SPARES = None  # this worker's fresh sandbox for its next student (used by no one yet)
_ZYGOTE = None  # this worker's zygote (False where it cannot be used)
_CLONE_AT = None  # (a worker's) that address


def _zygote(grader: Grader):
    """This worker's zygote (`sandbox.Zygote`), on its first student: forked by the batch's first
    zygote where the command started one, else started here; None where there is none (not
    root, or it did not start: students then get sandboxes started from scratch)."""
    global _ZYGOTE
    from ..sandbox.limits import time_now
    from ..sandbox.warm import Zygote
    from ..sandbox.policy import hidden_paths

    if _ZYGOTE is None:
        _ZYGOTE = False
        if Zygote.usable(SandboxMode.BUBBLEWRAP):
            import atexit
            from multiprocessing import util

            limits = grader.limits
            for cloned in ([True] if _CLONE_AT else []) + [False]:  # (a clone that fails: one of its own)
                workdir = None if cloned else scratch.mkdtemp("autograder-zygote-")
                try:
                    zygote = Zygote.cloned(limits, _CLONE_AT) if cloned else Zygote(limits, hidden_paths(), workdir)
                except OSError:
                    if workdir:
                        os.rmdir(workdir)
                    continue

                def end(zygote=zygote, workdir=workdir) -> None:
                    zygote.kill()
                    if workdir:
                        shutil.rmtree(workdir, ignore_errors=True)
                atexit.register(end)
                util.Finalize(None, end, exitpriority=10)  # a pool worker skips atexit
                if zygote.wait_ready(time_now() + limits.startup_timeout) is None and _try(zygote):
                    _ZYGOTE = zygote
                    break
                zygote.kill()
    return _ZYGOTE if _ZYGOTE and _ZYGOTE.usable_now() else None


def _try(zygote) -> bool:
    """Whether a student's sandbox started by the zygote comes up (namespaces, mounts and the
    drop to nobody all work on this machine)."""
    from ..sandbox.warm import _SpawnedBox
    from ..sandbox.limits import time_now

    with SandboxPool(zygote.limits, zygote=zygote) as pool:
        box = pool.acquire()  # (a sandbox of its own if the zygote could not start one)
        ok = (isinstance(box.proc, _SpawnedBox) and zygote.usable_now()
              and box.wait_ready(time_now() + zygote.limits.startup_timeout) is None)
        pool.release(box)
    return ok


def grade_student(grader: Grader, todo: list) -> list[ChapterResult]:
    """One student's chapters, one after another in the student's own warm sandbox (torch is
    imported there once, or once per worker where a zygote forks the students' sandboxes; each
    chapter's child is forked fresh)."""
    global _SPARES
    pool = None  # the student's sandboxes: this function owns them, and closes them below
    try:  # (from their first sandbox on: a stop may come at any point)
        if any(nb is not None for _, nb in todo) and pooled((sandbox := resolve_sandbox(grader.sandbox)).mode):
            # (started only where the student's pool will fork from it: bubblewrap, not containers)
            zygote = _zygote(grader) if sandbox.mode == SandboxMode.BUBBLEWRAP else None
            pool = student_pool(sandbox, grader.limits, zygote=zygote)
            # A spare sandbox started during the previous student: only without root, where every
            # student runs as the grader's own uid (as root each student has a uid of their own).
            if zygote is None and os.geteuid() != 0:
                if _SPARES is None:
                    import atexit
                    from multiprocessing import util

                    _SPARES = SandboxPool(grader.limits)
                    atexit.register(_SPARES.close)
                    util.Finalize(None, _SPARES.close, exitpriority=10)  # a pool worker skips atexit
                spare = _SPARES.take_fresh()
                if spare is not None:
                    pool.adopt(spare)  # started during the previous student: torch already imported
                else:
                    pool.prestart()
                _SPARES.prestart(1)  # the next student's, importing while this one is graded
        deadline = grader.student_deadline()  # (Limits.student_budget for all their chapters)
        results = []
        for chapter_id, notebook in todo:
            chapter = grader.grade_planned(chapter_id, notebook, pool, deadline)
            # What the class report reads of the chapter's code, now: its parse (which a student
            # can make hundreds of MB) is let go before their next chapter is read.
            chapter.flags = source_flags(Grader.graded_sources([chapter]))
            chapter.source = None
            results.append(chapter)
        return results
    finally:
        if pool is not None:  # (with CUDA: the next student starts on a GPU this one has left)
            pool.close(release_gpu="cuda" in grader.devices)


def _start_worker(snapshot: bytes, threads: int, cwd: str, settings: _settings.Settings, counter,
                  clone_at: str | None = None, spool: str | None = None) -> None:
    import signal

    import torch

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # (a group's SIGTERM reaches workers too)
        if sig == signal.SIGINT or signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _stop_worker)

    global _CLONE_AT
    _CLONE_AT = clone_at  # (the batch's first zygote, where the command started one)
    # Each worker gets its own `threads` cores where the machine has enough: the worker and
    # its student processes take turns on them, and stay off the other workers' caches.
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    mine = cores[index * threads:(index + 1) * threads]
    if len(mine) == threads:
        os.sched_setaffinity(0, mine)

    # The forkserver was started earlier, perhaps from elsewhere: take this run's working
    # directory and settings (`settings.Settings`: the entry point's, handed over as an object,
    # not through the environment) from the parent.
    os.chdir(cwd)
    _settings.install(settings)
    if spool:  # (the folders it makes, listed for `run_all` to remove if it is killed)
        scratch.keep_ledger(os.path.join(spool, f"ledger-{os.getpid()}"))

    # As many torch threads as its cores: idle OpenMP threads spin for a while after each
    # operation, and more threads than cores would take CPU from the other workers' students.
    torch.set_num_threads(threads)
    REFERENCES.adopt(snapshot)


def _worker_pool(grader: Grader, jobs: int, chapters, spool: str | None = None) -> ProcessPoolExecutor:
    """Worker processes, started warm.

    Processes, not threads: the grader's own work (comparisons, reference runs) holds the GIL.
    They fork from a forkserver that has imported torch and the grader once (a spawned worker
    would import them again, ~2 s each), and they receive the reference outcomes computed here,
    while the server imports, instead of each computing them again.
    """
    ctx = forkserver.context()  # (already started by the command line: it imports meanwhile)
    try:
        REFERENCES.warm(chapters or list(CHAPTERS), grader.devices, grader.seed, grader.quick)
    except Exception:  # not fatal: each worker then computes what it needs itself
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // jobs)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_start_worker,
                               initargs=(REFERENCES.snapshot(cuda=True), threads, os.getcwd(), grader.settings,
                                         ctx.Value("i", 0), first_zygote.address(), spool))


@contextlib.contextmanager
def _removing_what_workers_left(spool: str):
    """When the batch ends, however it ends: the temporary folders of workers that were killed
    before they could remove their own (`sandbox.scratch`: each worker lists what it makes in
    the spool)."""
    try:
        yield
    finally:
        scratch.remove_listed(spool)


def student_flags(chapters: list[ChapterResult]) -> dict:
    """`source_flags` of a student's graded chapters: each chapter's as `grade_student` kept it,
    or read from its notebook where it has none (a chapter the grader failed on)."""
    flags: dict = {"identical": [], "code": {}}
    for ch in chapters:
        mine = ch.flags if ch.flags is not None else source_flags(Grader.graded_sources([ch]))
        flags["identical"] += mine["identical"]
        flags["code"].update(mine["code"])
    return flags


def source_flags(todo) -> dict:
    """What the class report reads from the student's code, computed where their notebooks are
    parsed (the worker, under the watchdog): the identical-to-solution flags ("identical") and
    the normalised token streams for comparing students ("code", `report.similarity`)."""
    from ..report import similarity

    flags: dict = {"identical": [], "code": {}}
    try:
        flags["identical"] = class_report.identical_to_solutions(todo)
    except Exception:
        pass
    try:
        flags["code"] = similarity.fingerprints(todo)
    except Exception:
        pass
    return flags


MAX_ROUNDS = 3  # times a student is graded again after a worker process died under them
ZYGOTE_DIED = 75  # a worker's exit status when its zygote died under a student (graded again)
MAX_RESULT_BYTES = 4 << 20  # one student's result as the worker hands it back (JSON)


def watchdog_seconds(grader: Grader) -> float:
    """How long a worker may spend on one student before the batch kills it: the student's
    budget (their cells and calls) plus a margin for what the budget does not count (start-up,
    reference outcomes, comparisons, the static check, reports)."""
    return grader.limits.student_budget + grader.limits.watchdog_margin


_STOPPING = False  # the batch is being stopped: this worker begins no other student
_GRADING = False   # a student is being graded here (`_grade_student_to`)
STOPPED = 76       # a worker's exit status when the batch was stopped


def _stop_worker(signum, frame) -> None:
    """SIGINT, SIGTERM or SIGHUP in a worker: the batch is stopped (Ctrl-C and a scheduler's
    SIGTERM reach every process of the group, the forkserver included; `run_all` passes its own
    stop on as SIGINT). A worker grading a student drops them, closes their sandboxes on the way
    out (`grade_student`'s finally) and ends (`_grade_student_to`); an idle one ends at once.
    Only the first signal counts: a second would cut that closing short."""
    global _STOPPING
    first = not _STOPPING
    _STOPPING = True
    if first and _GRADING:
        raise KeyboardInterrupt
    if first:
        _end_stopped()


def _end_stopped() -> None:
    """End this worker now, its own clean-up done (multiprocessing's finalizers: its zygote, its
    staged runtime), without waiting for the pool to say so: its forkserver may be gone."""
    from multiprocessing import util

    try:
        util._exit_function()
    finally:
        os._exit(STOPPED)


def _grade_student_to(grader: Grader, todo: list, spool: str, key: str) -> str:
    """In a worker: one student graded (`grade_student`, then the identical-code flag, so that
    every parse of their code happens here, under the watchdog), the result written to
    spool/key.json (capped: `_shrunk`). Returns the key alone: a worker that dies while handing
    back a large result would leave the pool's reader waiting for the rest."""

    from ..report import atomic

    global _GRADING
    if _STOPPING:  # (a student the pool had queued before it was stopped)
        _end_stopped()
    atomic.write_text(os.path.join(spool, key + ".pid"), str(os.getpid()))
    _settings.install(grader.settings)  # (the grader's, pickled with it: as the worker's start had them)
    dead_before = bool(_ZYGOTE) and _ZYGOTE.dead
    _GRADING = True
    try:
        if _STOPPING:  # (stopped between the check above and `_GRADING`: `_stop_worker` did not raise)
            raise KeyboardInterrupt
        chapters = grade_student(grader, todo)
    except Exception as e:
        chapters = [grader.failed_chapter(c, nb, e) for c, nb in todo]
    except KeyboardInterrupt:  # (stopped: the student's sandboxes are closed)
        _end_stopped()
    finally:
        _GRADING = False
    if _ZYGOTE and _ZYGOTE.dead and not dead_before:  # it died under the student, taking their
        # sandboxes with it (no student can reach it: not their doing): this worker ends, and
        # `run_all` grades them again
        os._exit(ZYGOTE_DIED)
    data = {"chapters": [_capped_plain(SubmissionResult("", [c]).to_plain()["chapters"][0]) for c in chapters],
            "source": student_flags(chapters)}
    atomic.write_text(os.path.join(spool, key + ".json"), _shrunk(data))
    return key


def _capped_plain(x):
    """Every string of a result capped (`untrusted_text.capped`): messages, notes and outputs
    hold what the student's code printed or named."""
    if isinstance(x, str):
        return capped(x)
    if isinstance(x, dict):
        return {k: _capped_plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_capped_plain(v) for v in x]
    return x


def _shrunk(data: dict) -> str:
    """The result as JSON within MAX_RESULT_BYTES: without figures and outputs if need be, then
    with every message cut short, then without case details at all (scores kept)."""
    import json

    text = json.dumps(data)
    steps = [("figure", None), ("output", ""), ("message", None), ("cases", [])]
    for field, value in steps:
        if len(text) <= MAX_RESULT_BYTES:
            break
        for ch in data["chapters"]:
            if field == "output":
                ch["output"] = "(left out: this student's results were too large)"
            for t in ch["tests"]:
                if field == "cases":
                    t["cases"] = []
                    t["note"] = capped(t["note"], 200)
                for c in t["cases"]:
                    if field == "figure":
                        c["figure"] = None
                    elif field == "message":
                        c["message"], c["hint"] = capped(c["message"], 200), capped(c["hint"], 200)
            if field == "message":
                ch["notes"] = [capped(n, 200) for n in ch["notes"][:20]]
        text = json.dumps(data)
    return text


def _read_result(spool: str, key: str, todo: list, grader: Grader) -> tuple[list, dict]:
    """(chapter results, source flags: `source_flags`) a worker left in spool/key.json."""
    import json

    path = os.path.join(spool, key + ".json")
    with open(path, "rb") as f:
        raw = f.read(MAX_RESULT_BYTES + 1)
    if len(raw) > MAX_RESULT_BYTES:
        raise ValueError("the student's result is larger than the batch accepts")
    data = json.loads(raw)
    chapters = SubmissionResult.from_plain({"path": "", "chapters": data["chapters"]}).chapters
    source = data.get("source")
    return chapters, source if isinstance(source, dict) else {}


def _watchdog(running: list[str], spool: str, keys: dict, started: dict, killed: dict, limit: float) -> None:
    """Kill the worker of every running student it has been at for more than `limit` seconds
    (its pid is in the spool once it starts them), and say why in `killed`."""
    import signal

    now = time.monotonic()
    for name in running:
        pidfile = os.path.join(spool, keys[name] + ".pid")
        if name not in started and os.path.exists(pidfile):
            started[name] = now
        if name in started and name not in killed and now - started[name] > limit:
            try:
                with open(pidfile) as f:
                    os.kill(int(f.read()), signal.SIGKILL)
            except (OSError, ValueError):
                continue
            killed[name] = (f"grading this student took longer than {limit:g} s (the "
                            "student's time budget plus a margin): stopped")


STOP_SECONDS = 10  # a stopped worker's time to close its student's sandboxes before it is killed


@contextlib.contextmanager
def _stopping_workers(pool: ProcessPoolExecutor):
    """Where the batch is stopped (KeyboardInterrupt: Ctrl-C, or the SIGTERM or SIGHUP that
    `__main__` turns into one) or fails (a full disk), no student is begun and each worker is told (SIGINT:
    `_stop_worker`), given STOP_SECONDS to close its student's sandboxes, then killed. Without
    this the pool's exit would wait for every queued student to be graded."""
    try:
        yield
    except BaseException:  # (a stop; or a report the disk had no room for: `cli` says so)
        import signal

        pids = [p.pid for p in (pool._processes or {}).values()]  # (concurrent.futures keeps no public list)
        pool.shutdown(wait=False, cancel_futures=True)
        for pid in pids:
            procs.send(pid, signal.SIGINT)
        # (by pid: a worker is its forkserver's child, and a group's SIGTERM ends that server)
        deadline = time.monotonic() + STOP_SECONDS
        while time.monotonic() < deadline and any(map(procs.running, pids)):
            time.sleep(0.05)
        for pid in filter(procs.running, pids):
            procs.send(pid, signal.SIGKILL)
        raise


def run_all(grader: Grader, work: dict, jobs: int, chapters, done) -> None:
    """Grade every student of `work` (name -> plan), calling `done(name, chapter_results,
    identical)` for each, in worker processes. A worker process that dies breaks its whole pool
    (every student still pending in it fails with BrokenProcessPool, whoever killed it): the
    pool is replaced and the students it had not finished are graded again. From the second
    round on they are graded one at a time in a worker of their own, so a student who kills
    their worker again costs no one else; after MAX_ROUNDS such rounds, a student's chapters are
    grader errors (`error` in the CSV). A student whose worker is still at it `watchdog_seconds`
    after starting them is killed there and is an error at once (not graded again)."""
    import tempfile
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    limit = watchdog_seconds(grader)
    keys = {name: f"s{i}" for i, name in enumerate(work)}
    pending, rounds = dict(work), 0
    claimed = scratch.claimed_spool()  # (the command's: `sweep_abandoned` finds it if the command is killed)
    with tempfile.TemporaryDirectory(prefix="run-" if claimed else scratch.SPOOL_PREFIX, dir=claimed) as spool, \
            _removing_what_workers_left(spool):
        while pending:
            solo = rounds > 0
            batches = [[name] for name in pending] if solo else [list(pending)]
            failed: dict[str, BaseException] = {}
            for names in batches:
                pool = _worker_pool(grader, 1 if solo else jobs, chapters, spool)
                killed: dict[str, str] = {}
                started: dict[str, float] = {}
                with pool, _stopping_workers(pool):
                    futures = {pool.submit(_grade_student_to, grader, pending[n], spool, keys[n]): n
                               for n in names}
                    waiting = set(futures)
                    while waiting:
                        finished, waiting = wait(waiting, timeout=1.0, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            name = futures[fut]
                            todo = pending[name]
                            try:
                                fut.result()
                                chapter_results, source = _read_result(spool, keys[name], todo, grader)
                            except BrokenProcessPool as e:  # a worker died: graded again, below
                                if name in killed:
                                    why = RuntimeError(killed[name])
                                    done(name, [grader.failed_chapter(c, nb, why) for c, nb in todo])
                                else:
                                    failed[name] = e
                                continue
                            except Exception as e:  # the grader failed on this student: their error
                                chapter_results, source = [grader.failed_chapter(c, nb, e) for c, nb in todo], {}
                            done(name, chapter_results, source)
                        _watchdog([futures[fut] for fut in waiting], spool, keys, started, killed, limit)
            rounds += 1
            pending = {n: pending[n] for n in failed}
            if rounds >= MAX_ROUNDS:
                for name, e in failed.items():
                    why = RuntimeError(f"the grading worker died {rounds} times while grading this student ({e})")
                    done(name, [grader.failed_chapter(c, nb, why) for c, nb in pending[name]])
                return

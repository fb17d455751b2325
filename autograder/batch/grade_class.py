"""Grade a whole class: one folder per student, in parallel, with a progress bar and a CSV."""
from __future__ import annotations

import csv
import io
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from . import forkserver
from ..sandbox import gpu_share
from ..shared.contract import CHAPTERS
from ..references.cache import REFERENCES
from ..grading.grader import Grader
from ..report import class_report, gradebook, gradescope, html
from ..report.csv_safe import row as safe_row
from ..report.text import plural
from ..grading.results import ChapterResult, SubmissionResult
from ..sandbox.modes import SandboxMode, resolve_sandbox
from ..sandbox.pool import SandboxPool
from ..report.untrusted_text import capped, printable


def student_folders(class_dir: Path) -> list[Path]:
    return sorted(p for p in class_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def shard_of(student: str, count: int) -> int:
    """The shard (0 ... count-1) a student belongs to: from a hash of the folder's name alone, so
    every machine of an array job agrees, and a student added later moves no one else."""
    import hashlib

    return int(hashlib.sha256(student.encode()).hexdigest(), 16) % count


def parse_shard(text: str) -> tuple[int, int]:
    """"K/N" (1 <= K <= N) -> (K, N); ValueError otherwise."""
    k, _, n = text.partition("/")
    k, n = int(k), int(n)
    if not 1 <= k <= n:
        raise ValueError(f"shard {text!r}: K/N with 1 <= K <= N")
    return k, n


def class_chapters(grader: Grader, folders: list[Path]) -> list[str]:
    """Every chapter that some student of the class handed in, in contract order: the one
    maximum every student is graded out of when no --chapters are given."""
    found: set = set()
    for folder in folders:
        try:
            found |= set(grader.find_notebooks(folder)[0])
        except Exception:  # an unreadable folder: planning it reports the problem
            pass
    return [c for c in CHAPTERS if c in found]


_SPARES = None  # this worker's fresh sandbox for its next student (used by no one yet)
_ZYGOTE = None  # this worker's zygote (False where it cannot be used)


def _zygote(grader: Grader):
    """This worker's zygote (`sandbox.Zygote`), started on its first student; None where there
    is none (not root, or it did not start: students then get sandboxes started from scratch)."""
    global _ZYGOTE
    from ..sandbox.limits import Limits, time_now
    from ..sandbox.warm import Zygote
    from ..sandbox.policy import hidden_paths

    if _ZYGOTE is None:
        _ZYGOTE = False
        if Zygote.usable(SandboxMode.BUBBLEWRAP):
            import atexit
            import tempfile
            from multiprocessing import util

            limits = grader.limits or Limits.from_env()
            workdir = tempfile.mkdtemp(prefix="autograder-zygote-")
            try:
                zygote = Zygote(limits, hidden_paths(), workdir)
            except OSError:
                os.rmdir(workdir)
                return None

            def end() -> None:
                zygote.kill()
                shutil.rmtree(workdir, ignore_errors=True)
            atexit.register(end)
            util.Finalize(None, end, exitpriority=10)  # a pool worker skips atexit
            if zygote.wait_ready(time_now() + limits.startup_timeout) is None and _try(zygote):
                _ZYGOTE = zygote
            else:
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


def _grade_student(grader: Grader, todo: list) -> list[ChapterResult]:
    """One student's chapters, one after another in the student's own warm sandbox (torch is
    imported there once, or once per worker where a zygote forks the students' sandboxes; each
    chapter's child is forked fresh)."""
    global _SPARES
    pool = None
    if any(nb is not None for _, nb in todo) and resolve_sandbox(grader.sandbox).mode == SandboxMode.BUBBLEWRAP:
        zygote = _zygote(grader)
        pool = SandboxPool(grader.limits, zygote=zygote)
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
    try:
        return [grader.grade_planned(chapter_id, notebook, pool, deadline) for chapter_id, notebook in todo]
    finally:
        if pool is not None:
            pool.close()
            if "cuda" in grader.devices:  # the next student starts on a GPU this one has left
                gpu_share.release(pool.uid)


def _start_worker(snapshot: bytes, threads: int, cwd: str, settings: dict, counter) -> None:
    import torch

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
    # directory and AUTOGRADER_* settings (limits, sandbox mode, hidden paths) from the parent.
    os.chdir(cwd)
    for key in [k for k in os.environ if k.startswith("AUTOGRADER_")]:
        del os.environ[key]
    os.environ.update(settings)

    # As many torch threads as its cores: idle OpenMP threads spin for a while after each
    # operation, and more threads than cores would take CPU from the other workers' students.
    torch.set_num_threads(threads)
    REFERENCES.adopt(snapshot)


def _worker_pool(grader: Grader, jobs: int, chapters) -> ProcessPoolExecutor:
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
    settings = {k: v for k, v in os.environ.items() if k.startswith("AUTOGRADER_")}
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_start_worker,
                               initargs=(REFERENCES.snapshot(cuda=True), threads, os.getcwd(), settings,
                                         ctx.Value("i", 0)))


def grade_class(class_dir, grader: Grader, jobs: int = 1, out_dir=None, csv_path=None,
                chapters: list[str] | None = None, progress: bool = True,
                shard: tuple[int, int] | None = None, only: list[str] | None = None,
                in_process: bool = False) -> dict[str, SubmissionResult]:
    """Grade every student folder (with `shard` (K, N): those of shard K of N, `shard_of`; with
    `only`: those folders alone, whose rows replace theirs in an existing CSV), up to `jobs`
    students at once. A student is the unit of work: their chapters run one after another in
    one sandbox of their own, whose warm worker imports torch once and forks a fresh child per
    chapter, in a worker process that a watchdog here kills when the student takes longer than
    their budget plus a margin (`error`). A worker process that dies is replaced and its
    students graded again (`_run_all`); a student whose grading cannot finish gets
    `SubmissionResult.error`.

    Nothing is lost (`Journal`): each student's result goes to CSV_PATH.journal, and with
    `out_dir` their reports and saved results to out_dir/<student>/, as soon as they are graded;
    a run that stops half-way is resumed from the journal by the next run with the same CSV.
    The CSV (every cell `report.csv_safe.cell`) and the class report are written at the
    end, whole or not at all (`atomic`), keeping the rows of students this run did not grade; a
    run with nothing gradable writes nothing. `in_process`: grade in this process, without the
    watchdog (tests)."""
    class_dir = Path(class_dir)
    start = time.perf_counter()
    folders = student_folders(class_dir)
    if only:
        unknown = sorted(set(only) - {f.name for f in folders})
        if unknown:
            raise ValueError(f"no student folder {', '.join(map(repr, unknown))} in {class_dir.name}")
    if not chapters:  # (from the whole class, so every shard grades out of the same chapters)
        chapters = class_chapters(grader, folders)
        if progress:
            print(f"grading every student out of chapters {', '.join(chapters) or '(none)'} (every chapter "
                  "any student handed in; a missing notebook scores zero)")
    if shard is not None:
        k, n = shard
        folders = [f for f in folders if shard_of(f.name, n) == k - 1]
        if progress:
            print(f"shard {k}/{n}: {plural(len(folders), 'student')}")
    if only:  # (after the chapters: a regraded student keeps the class's columns)
        folders = [f for f in folders if f.name in only]
    plans: dict[str, tuple[SubmissionResult, list]] = {}
    for folder in folders:
        try:
            plans[folder.name] = grader.plan(folder, chapters)
        except Exception as e:  # never lose the rest of the class to one submission
            r = SubmissionResult(str(folder))
            r.notes.append(capped(f"internal grader error ({type(e).__name__}: {e})"))
            plans[folder.name] = (r, [])
    if not any(nb is not None for _, todo in plans.values() for _, nb in todo):
        return {name: Grader.assemble(r, [], 0.0) for name, (r, _) in sorted(plans.items())}  # writes nothing

    from .journal import Journal, fingerprint

    journal = Journal(Path(csv_path).with_name(Path(csv_path).name + ".journal") if csv_path and not only else None,
                      chapters, grader.seed, grader.devices)
    prints = {name: fingerprint(todo) for name, (_, todo) in plans.items()}
    earlier = journal.resume(prints)
    if earlier and progress:
        print(f"resuming an interrupted run: {plural(len(earlier), 'student')} already graded "
              f"({journal.path}; delete it to grade everyone again)")
    results: dict[str, SubmissionResult] = {}
    bar = tqdm(total=len(plans), desc="grading", unit="student", disable=not progress)

    def done(name: str, chapter_results: list, source=None) -> None:
        result, todo = plans[name]
        results[name] = r = Grader.assemble(result, chapter_results, sum(c.seconds for c in chapter_results))
        source = source if isinstance(source, dict) else {}
        identical = [list(x) for x in source.get("identical") or []]
        journal.add(name, prints[name], r, identical)
        if out_dir:
            _write_reports(Path(out_dir), name, r, class_dir, identical, source.get("code") or {})
        bar.set_postfix_str(printable(name))  # (a folder's name is the student's text)
        bar.update()

    work = {}
    for name, (result, todo) in plans.items():
        if name in earlier:  # (its reports were written by the run that graded it)
            prior, _identical_flags = earlier[name]
            results[name] = Grader.assemble(result, prior.chapters, prior.seconds)
            bar.update()
        elif any(nb is not None for _, nb in todo):
            work[name] = todo
        else:
            done(name, [grader.grade_planned(c, None) for c, _ in todo])

    if "cuda" in grader.devices:  # a share of the GPU each; the grader's CUDA runs before any student's
        gpu_share.configure(grader, jobs, chapters or list(CHAPTERS))
    held: dict = {}  # students with a CUDA out-of-memory failure, graded again alone below
    finish = gpu_share.hold_back(done, grader, held)
    if in_process:
        for name, todo in work.items():
            try:
                chapter_results = _grade_student(grader, todo)
            except Exception as e:
                chapter_results = [grader.failed_chapter(c, nb, e) for c, nb in todo]
            finish(name, chapter_results, _source_flags(todo))
    else:
        _run_all(grader, work, jobs, chapters, finish)
    gpu_share.regrade_alone(held, work, _grade_student, grader, done)
    bar.close()
    kept = []
    if csv_path:
        kept = write_csv(results, csv_path, class_dir, keep_others=not only, only=bool(only))
        if kept and progress:
            print(f"kept the rows of {plural(len(kept), 'student')} this run did not grade: "
                  f"{', '.join(printable(k) for k in kept[:10])}{' ...' if len(kept) > 10 else ''}")
    if out_dir:
        page = class_report.write(out_dir)
        if progress:
            print(f"wrote the class report {page}")
    journal.finish()
    if progress:
        print(f"graded {plural(len(results), 'submission')} in {time.perf_counter() - start:.1f} s with --jobs {jobs}")
    return dict(sorted(results.items()))


def _write_reports(out: Path, name: str, r: SubmissionResult, class_dir, identical, code: dict) -> None:
    """out/<student>/: results.json, feedback.html and grading.json (the class report's), each
    written whole (`atomic`) as soon as the student is graded."""
    import json

    from ..report import atomic

    atomic.write_text(out / name / "results.json", json.dumps(gradescope.results_json(r), indent=2))
    atomic.write_text(out / name / "feedback.html", html.render(r))
    class_report.save(out, name, r, class_dir, identical, code)


def _source_flags(todo) -> dict:
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
MAX_RESULT_BYTES = 4 << 20  # one student's result as the worker hands it back (JSON)


def watchdog_seconds(grader: Grader) -> float:
    """How long a worker may spend on one student before the batch kills it: the student's
    budget (their cells and calls) plus a margin for what the budget does not count (start-up,
    reference outcomes, comparisons, the static check, reports)."""
    from ..sandbox.limits import Limits

    limits = grader.limits or Limits.from_env()
    return limits.student_budget + limits.watchdog_margin


def _grade_student_to(grader: Grader, todo: list, spool: str, key: str) -> str:
    """In a worker: one student graded (`_grade_student`, then the identical-code flag, so that
    every parse of their code happens here, under the watchdog), the result written to
    spool/key.json (capped: `_shrunk`). Returns the key alone: a worker that dies while handing
    back a large result would leave the pool's reader waiting for the rest."""
    import json

    from ..report import atomic

    atomic.write_text(os.path.join(spool, key + ".pid"), str(os.getpid()))
    try:
        chapters = _grade_student(grader, todo)
    except Exception as e:
        chapters = [grader.failed_chapter(c, nb, e) for c, nb in todo]
    data = {"chapters": [_capped_plain(SubmissionResult("", [c]).to_plain()["chapters"][0]) for c in chapters],
            "source": _source_flags(todo)}
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
    """(chapter results, source flags: `_source_flags`) a worker left in spool/key.json."""
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


def _run_all(grader: Grader, work: dict, jobs: int, chapters, done) -> None:
    """Grade every student of `work` (name -> plan), calling `done(name, chapter_results,
    identical)` for each, in worker processes. A worker process that dies breaks its whole pool
    (every student still pending in it fails with BrokenProcessPool, whoever killed it): the
    pool is replaced and the students it had not finished are graded again. From the second
    round on they are graded one at a time in a worker of their own, so a student who kills
    their worker again costs no one else; after MAX_ROUNDS such rounds, a student's chapters are
    grader errors (`error` in the CSV). A student whose worker is still at it `watchdog_seconds`
    after starting them is killed there and is an error at once (not graded again)."""
    import signal
    import tempfile
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    limit = watchdog_seconds(grader)
    keys = {name: f"s{i}" for i, name in enumerate(work)}
    pending, rounds = dict(work), 0
    with tempfile.TemporaryDirectory(prefix="autograder-batch-") as spool:
        while pending:
            solo = rounds > 0
            batches = [[name] for name in pending] if solo else [list(pending)]
            failed: dict[str, BaseException] = {}
            for names in batches:
                pool = _worker_pool(grader, 1 if solo else jobs, chapters)
                killed: dict[str, str] = {}
                started: dict[str, float] = {}
                with pool:
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
                        now = time.monotonic()
                        for fut in waiting:  # the watchdog
                            name = futures[fut]
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
            rounds += 1
            pending = {n: pending[n] for n in failed}
            if rounds >= MAX_ROUNDS:
                for name, e in failed.items():
                    why = RuntimeError(f"the grading worker died {rounds} times while grading this student ({e})")
                    done(name, [grader.failed_chapter(c, nb, why) for c, nb in pending[name]])
                return


def _cells(rows: list[list]) -> list[list[str]]:
    """Every cell of the gradebook as written: student text shown (`printable`) and never a
    spreadsheet formula (`csv_safe.row`)."""
    return [safe_row(row) for row in rows]


def write_csv(results: dict[str, SubmissionResult], path, class_dir=None, keep_others: bool = False,
              only: bool = False) -> list[str]:
    """The gradebook CSV (`report.gradebook`: Canvas's import format, documented in the README),
    written whole or not at all (`atomic`). An existing CSV is never shortened by a run that did
    not regrade its rows: with `keep_others` (or `only`) the rows of students not in `results`
    are kept (by the ID column). ValueError, writing nothing, where such rows exist under other
    columns (another class's or other chapters' CSV). Returns the names in the kept rows."""
    from ..report import atomic

    new = _cells(gradebook.rows(results, class_dir))
    old = []
    if (keep_others or only) and Path(path).is_file():
        with open(path, newline="", encoding="utf-8") as f:
            old = list(csv.reader(f))
    ids = {row[1] for row in new[2:]}
    others = [row for row in old[2:] if len(row) >= 2 and row[1] not in ids]
    if others and old[:2] != new[:2]:
        raise ValueError(f"{path} holds {plural(len(others), 'student')} this run did not grade, under other "
                         "columns (other chapters or another class): it is left as it was; write this run's "
                         "grades to another --csv, or regrade with the class's --chapters")
    out = io.StringIO()
    csv.writer(out).writerows(new[:2] + sorted(new[2:] + others, key=gradebook.row_key))
    atomic.write_text(path, out.getvalue())
    return [row[0] for row in others]


def update_csv(results: dict[str, SubmissionResult], path, class_dir=None) -> None:
    """Replace these students' rows (by the ID column) in an existing gradebook CSV, or add
    them, keeping every other row: regrading a few students (`batch --only`). ValueError if the
    CSV's columns differ from theirs (it was graded out of other chapters)."""
    write_csv(results, path, class_dir, only=True)


def merge_csvs(paths: list, out) -> int:
    """Join the CSVs of a class graded in shards (`batch --shard K/N`) into one, as one batch
    would have written it: the same header (the shards must grade the same chapters), every
    student's row once, sorted by student. Returns the number of students; ValueError if the
    headers differ or a student appears twice."""
    header, rows = None, {}
    for path in paths:
        with open(path, newline="") as f:
            lines = list(csv.reader(f))
        if not lines:
            raise ValueError(f"{path}: empty")
        head = [row for row in lines[:2] if row and (row is lines[0] or row[0] == gradebook.POINTS_POSSIBLE)]
        if header is None:
            header = head
        elif head != header:
            raise ValueError(f"{path}: its columns differ from {paths[0]}'s (grade every shard with the "
                             "same --chapters, or let batch take them from the whole class)")
        for row in lines[len(head):]:
            key = gradebook.row_key(row)
            if key in rows:
                raise ValueError(f"{path}: student {row[0]!r} ({row[1] if len(row) > 1 else ''}) is in two shards")
            rows[key] = row
    from ..report import atomic

    text = io.StringIO()
    w = csv.writer(text)
    w.writerows(header)
    for name in sorted(rows):
        w.writerow(rows[name])
    atomic.write_text(out, text.getvalue())
    return len(rows)


def merge_reports(folders: list, out) -> int:
    """Copy the per-student report folders of every shard (`batch --out`) into one."""
    count = 0
    for folder in folders:
        for student in sorted(Path(folder).iterdir()):
            if student.is_dir():
                if (Path(out) / student.name).exists():
                    raise ValueError(f"{student}: student {student.name!r} is in two shards")
                shutil.copytree(student, Path(out) / student.name)
                count += 1
    return count




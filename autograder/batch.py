"""Grade a whole class: one folder per student, in parallel, with a progress bar and a CSV."""
from __future__ import annotations

import csv
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from . import forkserver, gpu_share
from .contract import CHAPTERS
from .grading import REFERENCES, Grader
from .report import class_report, gradebook, gradescope, html
from .report.text import plural
from .results import ChapterResult, SubmissionResult
from .sandbox import SandboxMode, SandboxPool, choose_mode
from .untrusted_text import printable


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
    from .sandbox import Limits, Zygote, hidden_paths, time_now

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
    from .sandbox import _SpawnedBox, time_now

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
    if any(nb is not None for _, nb in todo) and choose_mode(
            None if grader.sandbox == "auto" else grader.sandbox)[0] == SandboxMode.BUBBLEWRAP:
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
                shard: tuple[int, int] | None = None, only: list[str] | None = None
                ) -> dict[str, SubmissionResult]:
    """Grade every student folder (with `shard` (K, N): those of shard K of N, `shard_of`; with
    `only`: those folders alone, whose rows replace theirs in an existing CSV), up to `jobs`
    students at once. A student is the unit of work: their chapters run one after another in
    one sandbox of their own, whose warm worker imports torch once and forks a fresh child per
    chapter. A worker process that dies is replaced and its students graded again
    (`_run_all`); a student whose grading cannot finish gets `SubmissionResult.error`. With
    `out_dir`, each student's reports and saved results go to out_dir/<student>/, and the class
    report (`report.class_report`) is rebuilt from every student saved there."""
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
            r.notes.append(f"internal grader error ({type(e).__name__}: {e})")
            plans[folder.name] = (r, [])
    results: dict[str, SubmissionResult] = {}
    bar = tqdm(total=len(plans), desc="grading", unit="student", disable=not progress)
    work = {}
    for name, (result, todo) in plans.items():
        if todo:
            work[name] = todo
        else:
            results[name] = Grader.assemble(result, [], 0.0)
            bar.update()

    def done(name: str, chapter_results: list) -> None:
        result, todo = plans[name]
        results[name] = Grader.assemble(result, chapter_results, sum(c.seconds for c in chapter_results))
        bar.set_postfix_str(printable(name))  # (a folder's name is the student's text)
        bar.update()

    if "cuda" in grader.devices:  # a share of the GPU each; the grader's CUDA runs before any student's
        gpu_share.configure(grader, jobs, chapters or list(CHAPTERS))
    held: dict = {}  # students with a CUDA out-of-memory failure, graded again alone below
    _run_all(grader, work, jobs, chapters, gpu_share.hold_back(done, grader, held))
    gpu_share.regrade_alone(held, work, _grade_student, grader, done)
    bar.close()
    if out_dir:
        out = Path(out_dir)
        for name, r in results.items():
            gradescope.write(r, out / name / "results.json")
            html.write(r, out / name / "feedback.html")
            class_report.save(out, name, r, class_dir, class_report.identical_to_solutions(plans[name][1]))
    if csv_path:
        if only and Path(csv_path).is_file():
            update_csv(results, csv_path, class_dir)
        else:
            write_csv(results, csv_path, class_dir)
    if out_dir:
        page = class_report.write(out_dir)
        if progress:
            print(f"wrote the class report {page}")
    if progress:
        print(f"graded {plural(len(results), 'submission')} in {time.perf_counter() - start:.1f} s with --jobs {jobs}")
    return dict(sorted(results.items()))


MAX_ROUNDS = 3  # times a student is graded again after a worker process died under them


def _run_all(grader: Grader, work: dict, jobs: int, chapters, done) -> None:
    """Grade every student of `work` (name -> plan), calling `done(name, chapter_results)` for
    each. A worker process that dies breaks its whole pool (every student still pending in it
    fails with BrokenProcessPool, whoever killed it): the pool is replaced and the students it
    had not finished are graded again. From the second round on they are graded one at a time
    in a worker of their own, so a student who kills their worker again costs no one else; after
    MAX_ROUNDS such rounds, a student's chapters are grader errors (`error` in the CSV)."""
    from concurrent.futures.process import BrokenProcessPool

    pending, rounds = dict(work), 0
    while pending:
        solo = rounds > 0
        batches = [[name] for name in pending] if solo else [list(pending)]
        failed: dict[str, BaseException] = {}
        for names in batches:
            size = 1 if solo else jobs
            pool = _worker_pool(grader, size, chapters) if size > 1 or solo and jobs > 1 \
                else ThreadPoolExecutor(max_workers=1)
            with pool:
                futures = {pool.submit(_grade_student, grader, pending[n]): n for n in names}
                for fut in as_completed(futures):
                    name = futures[fut]
                    try:
                        chapter_results = fut.result()
                    except BrokenProcessPool as e:  # a worker died: graded again, below
                        failed[name] = e
                        continue
                    except Exception as e:  # the grader failed on this student: their error
                        chapter_results = [grader.failed_chapter(c, nb, e) for c, nb in pending[name]]
                    done(name, chapter_results)
        rounds += 1
        pending = {n: pending[n] for n in failed}
        if rounds >= MAX_ROUNDS:
            for name, e in failed.items():
                why = RuntimeError(f"the grading worker died {rounds} times while grading this student ({e})")
                done(name, [grader.failed_chapter(c, nb, why) for c, nb in pending[name]])
            return


def write_csv(results: dict[str, SubmissionResult], path, class_dir=None) -> None:
    """The gradebook CSV (`report.gradebook`: Canvas's import format, documented in the README),
    every cell through `untrusted_text.printable`: names, notes and file names are the students'."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([printable(str(c)) for c in row] for row in gradebook.rows(results, class_dir))


def update_csv(results: dict[str, SubmissionResult], path, class_dir=None) -> None:
    """Replace these students' rows (by the ID column) in an existing gradebook CSV, or add
    them, keeping every other row: regrading a few students (`batch --only`). ValueError if the
    CSV's columns differ from theirs (it was graded out of other chapters)."""
    new = [[printable(str(c)) for c in row] for row in gradebook.rows(results, class_dir)]
    with open(path, newline="", encoding="utf-8") as f:
        old = list(csv.reader(f))
    if old[:2] != new[:2]:
        raise ValueError(f"{path}: its columns differ from this grading's (regrade with the class's --chapters)")
    ids = {row[1] for row in new[2:]}
    rows = [row for row in old[2:] if len(row) < 2 or row[1] not in ids] + new[2:]
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(new[:2] + sorted(rows, key=gradebook.row_key))


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
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerows(header)
        for name in sorted(rows):
            w.writerow(rows[name])
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




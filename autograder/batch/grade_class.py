"""Grade a whole class: one folder per student, in parallel, with a progress bar and a CSV."""
from __future__ import annotations


import os
import time
from pathlib import Path

from tqdm import tqdm

from ..sandbox import gpu_share
from ..shared.contract import CHAPTERS
from ..grading.grader import Grader
from ..report import class_report, gradescope, html
from ..report.text import plural
from ..grading.results import SubmissionResult
from ..report.untrusted_text import capped, printable
from .workers import grade_student, run_all, student_flags
from .grades_csv import read_run, run_path, write_csv, write_run


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


def _students_and_chapters(class_dir: Path, grader: Grader, chapters, shard, only):
    """The student folders this run grades (a shard's, or `only` those) and the chapters every
    student is graded out of (those the whole class handed in, unless given)."""
    folders = student_folders(class_dir)
    if only:
        unknown = sorted(set(only) - {f.name for f in folders})
        if unknown:
            raise ValueError(f"no student folder {', '.join(map(repr, unknown))} in {class_dir.name}")
    if not chapters:  # (from the whole class, so every shard grades out of the same chapters)
        chapters = class_chapters(grader, folders)
        if chapters:
            print(f"grading every student out of chapters {', '.join(chapters)} (every chapter "
                  "any student handed in; a missing notebook scores zero)")
    if shard is not None:
        k, n = shard
        folders = [f for f in folders if shard_of(f.name, n) == k - 1]
        print(f"shard {k}/{n}: {plural(len(folders), 'student')}")
    if only:  # (after the chapters: a regraded student keeps the class's columns)
        folders = [f for f in folders if f.name in only]
    return folders, chapters


def _plans(grader: Grader, folders, chapters) -> dict[str, tuple[SubmissionResult, list]]:
    """Each student's plan (`Grader.plan`); one that cannot be planned is a note, not a crash."""
    plans: dict[str, tuple[SubmissionResult, list]] = {}
    for folder in folders:
        try:
            plans[folder.name] = grader.plan(folder, chapters)
        except Exception as e:  # never lose the rest of the class to one submission
            r = SubmissionResult(str(folder))
            r.notes.append(capped(f"internal grader error ({type(e).__name__}: {e})"))
            plans[folder.name] = (r, [])
    return plans


def _write_outputs(results: dict, csv_path, class_dir: Path, only, out_dir, run: dict) -> None:
    """The CSV (keeping the rows of students this run did not grade), how they were graded
    beside it (`grades_csv.write_run`) and the class report."""
    if csv_path:
        kept = write_csv(results, csv_path, class_dir, keep_others=not only, only=bool(only))
        write_run(csv_path, run)
        if kept:
            print(f"kept the rows of {plural(len(kept), 'student')} this run did not grade: "
                  f"{', '.join(printable(k) for k in kept[:10])}{' ...' if len(kept) > 10 else ''}")
    if out_dir:
        page = class_report.write(out_dir)
        print(f"wrote the class report {page}")


def _grade_students(grader: Grader, work: dict, jobs: int, chapters, done, in_process: bool) -> None:
    """Every student of `work` graded, each result handed to `done`: in worker processes under
    the watchdog (`run_all`), or in this process (`in_process`, tests); on a GPU, each worker
    with a share of it, and a student whose CUDA ran out of memory graded again alone."""
    if "cuda" in grader.devices:  # a share of the GPU each; the grader's CUDA runs before any student's
        gpu_share.configure(grader, jobs, chapters or list(CHAPTERS))
    held: dict = {}  # students with a CUDA out-of-memory failure, graded again alone below
    finish = gpu_share.hold_back(done, grader, held)
    if in_process:
        for name, todo in work.items():
            try:
                chapter_results = grade_student(grader, todo)
            except Exception as e:
                chapter_results = [grader.failed_chapter(c, nb, e) for c, nb in todo]
            finish(name, chapter_results, student_flags(chapter_results))
    else:
        run_all(grader, work, jobs, chapters, finish)
    gpu_share.regrade_alone(held, work, grade_student, grader, done)


def _resume(journal, prints: dict) -> dict:
    """The students an interrupted run with this CSV graded already (from its journal)."""
    earlier = journal.resume(prints)
    if earlier:
        print(f"resuming an interrupted run: {plural(len(earlier), 'student')} already graded "
              f"({journal.path}; delete it to grade everyone again)")
    return earlier


def _to_grade(grader: Grader, plans: dict, earlier: dict, results: dict, bar, done) -> dict:
    """The students left to grade (name -> plan): those an interrupted run graded take its
    results (and its reports, written then); one with no notebook scores zero at once."""
    work = {}
    for name, (result, todo) in plans.items():
        if name in earlier:
            prior, _identical_flags = earlier[name]
            results[name] = Grader.assemble(result, prior.chapters, prior.seconds)
            bar.update()
        elif any(nb is not None for _, nb in todo):
            work[name] = todo
        else:
            done(name, [grader.grade_planned(c, None) for c, _ in todo])
    return work


# Why `--only` refuses to mix its rows with another run's (`class_report.run_of`).
_OTHER_RUN = ("graded with another seed or other devices{why}: grade with the class's --seed and --device, "
              "or grade the whole class again")


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
    students graded again (`run_all`); a student whose grading cannot finish gets
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
    folders, chapters = _students_and_chapters(class_dir, grader, chapters, shard, only)
    run = class_report.run_of(grader.seed, grader.devices)
    if only and out_dir and (differ := class_report.other_runs(out_dir, run, only)):
        raise ValueError(f"{', '.join(printable(d) for d in differ[:5])}{' ...' if len(differ) > 5 else ''} "
                         f"in {out_dir} {'was' if len(differ) == 1 else 'were'} {_OTHER_RUN.format(why='')}")
    if only and csv_path and read_run(csv_path) not in (None, run):
        why = f" (its {run_path(csv_path).name} says so)"
        raise ValueError(f"{printable(str(csv_path))} was {_OTHER_RUN.format(why=why)}")
    plans = _plans(grader, folders, chapters)
    if not any(nb is not None for _, todo in plans.values() for _, nb in todo):
        return {name: Grader.assemble(r, [], 0.0) for name, (r, _) in sorted(plans.items())}  # writes nothing

    from .journal import Journal, fingerprint, journal_path

    journal = Journal(journal_path(csv_path) if csv_path and not only else None,
                      chapters, grader.seed, grader.devices)
    prints = {name: fingerprint(todo) for name, (_, todo) in plans.items()}
    earlier = _resume(journal, prints)
    results: dict[str, SubmissionResult] = {}
    bar = tqdm(total=len(plans), desc="grading", unit="student", disable=not progress)

    def done(name: str, chapter_results: list, source=None) -> None:
        result, todo = plans[name]
        results[name] = r = Grader.assemble(result, chapter_results, sum(c.seconds for c in chapter_results))
        source = source if isinstance(source, dict) else {}
        identical = [list(x) for x in source.get("identical") or []]
        if out_dir:  # (before the journal says the student is done: a run killed between the
            # two grades them again when resumed, instead of resuming without their reports)
            _write_reports(Path(out_dir), name, r, class_dir, identical, source.get("code") or {}, run)
        journal.add(name, prints[name], r, identical)
        bar.set_postfix_str(printable(name))  # (a folder's name is the student's text)
        bar.update()

    work = _to_grade(grader, plans, earlier, results, bar, done)

    try:
        _grade_students(grader, work, jobs, chapters, done, in_process)
    finally:  # (stopped: the bar's last line before what the command says)
        bar.close()
    _write_outputs(results, csv_path, class_dir, only, out_dir, run)
    journal.finish()
    resumed = f" ({len(earlier)} more from the interrupted run)" if earlier else ""
    print(f"graded {plural(len(results) - len(earlier), 'submission')}{resumed} in "
          f"{time.perf_counter() - start:.1f} s with --jobs {jobs}")
    return dict(sorted(results.items()))


def _write_reports(out: Path, name: str, r: SubmissionResult, class_dir, identical, code: dict,
                   run: dict) -> None:
    """out/<student>/: results.json, feedback.html and grading.json (the class report's), each
    written whole (`atomic`) as soon as the student is graded. The grading.json of an earlier run
    goes first and this run's comes last, so that a folder with one holds one run's three
    files: a run stopped between them leaves none, and the class report and `export` count
    the student as not graded, instead of reading an older grade beside newer feedback."""
    import json

    from ..report import atomic

    saved = out / name / class_report.SAVED
    try:
        os.unlink(saved)
    except FileNotFoundError:
        pass
    except OSError as e:  # (`cli` names what could not be written)
        raise atomic.WriteFailed.of(e, saved) from e
    atomic.write_text(out / name / "results.json", json.dumps(gradescope.results_json(r), indent=2))
    atomic.write_text(out / name / "feedback.html", html.render(r))
    class_report.save(out, name, r, class_dir, identical, code, run)

"""Grade chapter notebooks: run every case against the student and the reference, score, diagnose.

The student's code runs elsewhere (a sandboxed child through `session.StudentSession`, or the
student's own kernel for nbgrader); the grading package only sees Outcomes, so comparisons and
scores are made in the trusted process.

`Grader` (here) grades a submission chapter by chapter; `judge.py` grades one exercise, with
the runs `variants.py` plans (the CPU, then CUDA where present, else the device check once per
code path) against the reference outcomes of `references/cache.py`; `scoring.py` turns verdicts
into points (80% CPU, 20% device; a forbidden built-in zeroes the exercise); `diagnose.py`
points a failure at the foundation it builds on.
"""
from __future__ import annotations


import contextlib
import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable


from ..shared.calls import Call, Outcome
from ..shared.contract import CHAPTERS, Chapter, chapter_for_filename
from ..runtime.execute import execute
from ..cases.inputs import grading_seed
from .results import ChapterResult, SubmissionResult, TestResult
from ..sandbox.modes import SandboxMode
from .variants import device_plan
from ..references.cache import REFERENCES
from .scoring import zero_chapter
from .judge import grade_exercise
from .diagnose import failing_exercises, point_to_failing_foundations


def grade_chapter(chapter: Chapter, run: Callable[[Call], Outcome], devices: list[str], seed: int,
                  quick: bool = False, exercises: list[str] | None = None, cells=None, references=None
                  ) -> list[TestResult]:
    """Every exercise of a chapter; with the notebook's `cells` (its `ParsedSubmission`, or the
    cells as they run), the static check of its source too (`source/findings.py`). references:
    the reference outcomes (default the process's REFERENCES)."""
    references = REFERENCES if references is None else references
    static, notebook = _static_findings(chapter, cells, seed, quick, references)
    tests = []
    for ex in chapter.exercises:  # (in order: an exercise builds on earlier ones only)
        if exercises is None or ex.name in exercises:
            tests += grade_exercise(chapter, ex, run, devices, seed, quick, static.get(ex.name), notebook,
                                    references, failing=failing_exercises(tests))
    point_to_failing_foundations(chapter, tests)
    return tests


def _static_findings(chapter: Chapter, cells, seed: int, quick: bool, references) -> tuple[dict, object]:
    """exercise -> `findings.ExerciseFindings` of the notebook's source, and its
    `ParsedSubmission` ({} and None without cells, or if the check itself fails: it never costs
    a grade)."""
    if cells is None:
        return {}, None
    from ..source import in_place
    from ..source.findings import findings as static_findings
    from ..source.submission import ParsedSubmission

    try:
        notebook = ParsedSubmission.of(cells)
        calls = [c for ex in chapter.exercises for c in references.cases(chapter.id, ex.name, seed, quick)]
        return static_findings(notebook, chapter, in_place.tensor_params_from_cases(calls, notebook)), notebook
    except Exception:
        return {}, None


def _other_chapter_note(chapter: Chapter, defined: set) -> str | None:
    mine = {ex.target for ex in chapter.exercises}
    if mine & defined:
        return None
    for other in CHAPTERS.values():
        theirs = {ex.target for ex in other.exercises}
        if other.id != chapter.id and theirs & defined and not theirs <= mine:
            return (f"this notebook defines names of chapter {other.id} ({', '.join(sorted(theirs & defined))}) "
                    f"but none of {chapter.id}: was the wrong notebook submitted?")
    return None


class Grader:
    """Grades submissions; one instance can grade many (reference outcomes are shared)."""

    def __init__(self, device: str = "auto", seed: int | None = None, sandbox: str = "auto",
                 limits=None, jobs: int | None = None, quick: bool = False, settings=None, references=None):
        """settings: the entry point's `settings.Settings` (default `settings.current()`), for
        what is not given here: the seed ($AUTOGRADER_SEED, else the public one: an entry point
        of a graded deployment passes `cases.inputs.course_seed`'s) and the limits. They travel
        with the grader (to the batch's workers too). references: the reference outcomes
        (`references.cache.ReferenceCache`; default the process's REFERENCES, which the batch's
        workers receive from the parent)."""
        from ..settings import current

        self.settings = settings or current()
        self.devices = device_plan(device)
        self.seed = grading_seed(self.settings) if seed is None else seed
        self.sandbox = sandbox
        self.limits = limits if limits is not None else self.settings.limits
        self.jobs = jobs or min(2, os.cpu_count() or 1)
        self.quick = quick
        self._references = references

    @property
    def references(self):
        """The reference outcomes this grader judges against (the process's REFERENCES unless
        one was given: not pickled with the grader, a worker uses its own)."""
        return REFERENCES if self._references is None else self._references

    def __getstate__(self):
        return {**self.__dict__, "_references": None}

    # -- one notebook -------------------------------------------------------------------------
    def memory_cases(self, cells: list[str], chapter: Chapter, sandboxes=None, deadline: float | None = None):
        """The chapter's memory cases (`Call.capped_memory`: chapter 7), to run first in a
        memory-capped child of their own (autograder.session.memory_case)."""
        from ..session.memory_case import MemoryCases

        return MemoryCases(cells, self.memory_calls(chapter), limits=self.limits, sandbox=self.sandbox,
                           sandboxes=sandboxes, deadline=deadline)

    def memory_calls(self, chapter: Chapter) -> list:
        """The chapter's cases that run in the memory-capped child (`Call.capped_memory`)."""
        return [c for ex in chapter.exercises for c in
                self.references.cases(chapter.id, ex.name, self.seed, self.quick) if c.capped_memory]

    def _memory_first(self, todo, sandboxes, deadline) -> dict:
        """chapter id -> its memory cases, already run, for every submitted chapter that has
        some: before any other chapter of the student starts, so that no process of theirs
        runs beside the capped child (one that could compute for it, through /tmp, beyond its
        cap). Their cells are the notebook's `ParsedSubmission`, which its chapter's grading
        reads from them. A notebook that cannot be read is left to that grading to report.
        The capped child has one torch thread, as every child: with two (tried, stop 40), each
        of its thousands of parallel regions waited for the other thread wherever the machine
        was busy, and the reference's case passed its 10 s timeout."""
        from ..source.submission import ParsedSubmission

        first = {}
        for chapter_id, notebook in todo:
            chapter = CHAPTERS[chapter_id]
            if notebook is None or not self.memory_calls(chapter):
                continue
            try:
                memory = self.memory_cases(ParsedSubmission.read(notebook), chapter, sandboxes, deadline)
                memory.run_first()
            except Exception:  # (not fatal: the chapter runs them itself then)
                continue
            first[chapter_id] = memory
        return first

    def grade_notebook(self, path: Path, chapter: Chapter, sandboxes=None, deadline: float | None = None,
                       memory=None) -> ChapterResult:
        from ..source.notebook import NotebookError
        from ..source.submission import ParsedSubmission
        from ..session.student_session import StudentSession

        start = time.perf_counter()
        result = ChapterResult(chapter.id, str(path))
        try:  # (read and parsed once, for every check of its code: `ParsedSubmission`)
            cells = ParsedSubmission.of(memory.cells) if memory is not None else ParsedSubmission.read(path)
        except NotebookError as e:
            result.notes.append(str(e))
            result.not_graded = str(e)
            result.tests = zero_chapter(chapter, self.devices, f"not graded: {e}")
            result.seconds = time.perf_counter() - start
            return result
        # Memory cases run first, in a memory-capped child of their own (`memory_cases`; already
        # run where `grade_path` ran them before the student's other chapters); the chapter's
        # other cases in uncapped children.
        memory = memory or self.memory_cases(cells, chapter, sandboxes, deadline)
        memory.run_first()
        with StudentSession(cells, limits=self.limits, sandbox=self.sandbox, sandboxes=sandboxes,
                            deadline=deadline) as session:
            info = session.start()
            result.sandbox = session.mode
            result.notes.extend(_start_notes(info))
            result.output = info.output
            result.tests = grade_chapter(chapter, memory.route(session.run), self.devices, self.seed,
                                         self.quick, cells=cells, references=self.references)
            _failed_definitions(chapter, result.tests, cells, info)
            note = _other_chapter_note(chapter, set(info.defined))
            if note:
                result.notes.append(note)
        result.source = cells  # (for the class report's flags: `graded_sources`)
        result.seconds = time.perf_counter() - start
        return result

    def grade_namespace(self, chapter: Chapter, namespace: dict, exercises: list[str] | None = None
                        ) -> list[TestResult]:
        """Grade objects already defined in this process (tests, a trusted kernel): no sandbox,
        so no child whose memory the kernel could cap: memory cases record the largest tensor
        created instead (`Call.measure_memory`), which this process can be trusted to do."""
        def run(c: Call) -> Outcome:
            return execute(namespace, dataclasses.replace(c, measure_memory=True) if c.capped_memory else c,
                           trusted=True)
        return grade_chapter(chapter, run, self.devices, self.seed, self.quick, exercises,
                             references=self.references)

    # -- a file or folder -----------------------------------------------------------------------
    def find_notebooks(self, path: Path) -> tuple[dict, list]:
        """Chapter id -> notebook for a file or folder, and notes on what was skipped."""
        from ..source.notebook import submission_problem

        notes, found = [], {}
        if path.is_dir() and path.is_symlink():  # (nothing in a linked submission folder is read)
            return {}, [f"{path.name} is a symbolic link, not a folder of the submission; refused."]
        files = [path] if not path.is_dir() else sorted(p for p in path.rglob("*.ipynb")
                                                        if ".ipynb_checkpoints" not in p.parts)
        for f in files:
            ch = chapter_for_filename(f.name)
            # A regular file inside the submission only: a link (to the solutions, to a
            # classmate's notebook, to a pipe that never ends) is refused, with the reason.
            why = submission_problem(f, None if f is path else path)
            if why and ch is not None:
                notes.append(why)
            elif ch is None:
                notes.append(f"{f.name}: not a chapter notebook (expected a name like "
                             f"02_scaled_dot_product_attention.ipynb); skipped.")
            elif ch.id in found:
                notes.append(f"{f.name}: a second notebook for {ch.id}; graded {found[ch.id].name} only.")
            else:
                found[ch.id] = f
        return found, notes

    def plan(self, path, chapters: list[str] | None = None) -> tuple[SubmissionResult, list]:
        """What grading a notebook or a folder of them involves: the result to fill (with notes on
        what was skipped) and the (chapter id, notebook or None) pairs to grade, in order. With
        `chapters`, those chapters are graded and any without a notebook score zero; otherwise
        the chapters found are graded."""
        path = Path(path)
        result = SubmissionResult(str(path))
        if not path.exists():
            result.notes.append(f"{path}: no such file or folder.")
            found = {}
        else:
            found, result.notes = self.find_notebooks(path)
        wanted = chapters or [c for c in CHAPTERS if c in found]
        if not wanted and path.exists():
            result.notes.append("no chapter notebook found.")
        return result, [(c, found.get(c)) for c in wanted]

    def student_deadline(self) -> float:
        """When the budget of a student whose grading starts now runs out (time.monotonic)."""
        return time.monotonic() + self.limits.student_budget

    def grade_planned(self, chapter_id: str, notebook: Path | None, sandboxes=None,
                      deadline: float | None = None, memory=None) -> ChapterResult:
        """One chapter of a plan. Never raises: a grader fault zeroes this chapter only.
        sandboxes: the student's `sandbox.SandboxPool` (warm sandboxes), if any; deadline: when
        the student's time budget runs out (`student_deadline`)."""
        ch = CHAPTERS[chapter_id]
        if notebook is None:
            return ChapterResult(chapter_id, None, zero_chapter(ch, self.devices, "no notebook submitted"))
        if deadline is not None and time.monotonic() >= deadline:
            from ..session.student_session import budget_message

            why = budget_message(self.limits)
            return ChapterResult(chapter_id, str(notebook), zero_chapter(ch, self.devices, why), notes=[why])
        try:
            return self.grade_notebook(notebook, ch, sandboxes, deadline, memory)
        except Exception as e:
            return self.failed_chapter(chapter_id, notebook, e)

    def failed_chapter(self, chapter_id: str, notebook: Path | None, error: Exception) -> ChapterResult:
        """A chapter at zero because the grader itself failed on it (not the student's doing)."""
        why = f"{type(error).__name__}: {error}"
        return ChapterResult(chapter_id, str(notebook) if notebook else None,
                             zero_chapter(CHAPTERS[chapter_id], self.devices, f"grader error: {why}"),
                             notes=[f"internal grader error ({why}); please report it"], error=why)

    @staticmethod
    def assemble(result: SubmissionResult, chapters: list[ChapterResult], seconds: float) -> SubmissionResult:
        result.chapters = list(chapters)
        for ch in result.chapters:  # (a parse is large: held only until `graded_sources` is read)
            ch.source = None
        modes = {ch.sandbox for ch in result.chapters if ch.sandbox}
        result.sandbox = SandboxMode.FALLBACK if SandboxMode.FALLBACK in modes else next(iter(modes), None)
        result.seconds = seconds
        return result

    @staticmethod
    def graded_sources(chapters: list[ChapterResult]) -> list[tuple]:
        """(chapter id, the notebook's `ParsedSubmission` from its grading, or its path where it
        was not read) for each chapter result, before `assemble`: what the class report's
        flags read (`report.class_report.identical_to_solutions`, `report.similarity.fingerprints`)."""
        return [(ch.chapter, ch.source if ch.source is not None else ch.notebook) for ch in chapters]

    def grade_path(self, path, chapters: list[str] | None = None, jobs: int | None = None,
                   sandboxes=None) -> SubmissionResult:
        """Grade a notebook or a folder of them (see `plan`), `jobs` chapters at once, in this
        student's own warm sandboxes (`sandboxes`, a `sandbox.SandboxPool`; if None, made and
        closed here: `sandbox.pool.student_pool`)."""
        from ..sandbox.modes import resolve_sandbox
        from ..sandbox.pool import student_pool

        start = time.perf_counter()
        result, todo = self.plan(path, chapters)
        jobs = max(1, jobs or self.jobs)
        own = None
        if sandboxes is None:
            sandboxes = own = student_pool(resolve_sandbox(self.sandbox), self.limits, size=jobs)
        submitted = [ch for ch, notebook in todo if notebook is not None]
        deadline = self.student_deadline()
        try:
            if "cuda" in self.devices:  # the grader's own CUDA runs before any student code, never beside it
                with contextlib.suppress(Exception):  # (not fatal: the grading loop computes what is missing)
                    self.references.warm(submitted, ["cuda"], self.seed, self.quick)
            pool = ThreadPoolExecutor(max_workers=jobs)
            with self.references.warming(submitted, self.devices, self.seed, self.quick):
                try:
                    first = self._memory_first(todo, sandboxes, deadline) if jobs > 1 else {}
                    # Later chapters first: they build on the earlier ones and take longest, so
                    # the short ones fill in at the end instead of one long chapter running alone.
                    done = list(pool.map(lambda item: self.grade_planned(*item, sandboxes, deadline,
                                                                          first.get(item[0])),
                                         todo[::-1]))[::-1]
                except BaseException:  # (Ctrl-C, SIGTERM) the chapters' children killed with the
                    # sandboxes: their threads, joined at exit, end at once (where there are none,
                    # the fallback, the command kills them: `cli`, `child_slot.stop_children`)
                    pool.shutdown(wait=False, cancel_futures=True)
                    if sandboxes is not None:
                        sandboxes.close()
                    raise
                pool.shutdown()
        finally:
            if own is not None:
                own.close()
        return self.assemble(result, done, time.perf_counter() - start)


def _failed_definitions(chapter: Chapter, tests: list[TestResult], cells, info) -> None:
    """A name the notebook does not define because the cell that defines it failed (a
    SyntaxError, an error raised before the definition, a timeout): that cell's error goes into
    the exercise's own note too, not only among the notebook's notes above its table.
    cells: the notebook's `ParsedSubmission` (which cell defines a name: `defining_cells`);
    info: the session's `NotebookRun`."""
    failed = {c.cell: c.message or c.status for c in info.cells if c.status not in ("ok", "skipped")}
    if not failed:
        return
    for t in tests:
        first = t.cases[0] if t.cases else None
        if not (t.note and first is not None and first.aspect == "missing"):
            continue
        where = [n for n in cells.defining_cells(chapter.exercise(t.exercise).target) if n in failed]
        if where:
            t.note += f" It is defined in cell {where[-1]}, which failed: {failed[where[-1]]}"


def _start_notes(info) -> list[str]:
    """The notes a `session.notebook_run.NotebookRun` gives: the sandbox, and each cell that
    did not run cleanly."""
    notes = [f"sandbox: {info.sandbox}"] if info.sandbox else []
    if info.sandbox_note:
        notes.append(info.sandbox_note)
    notes += [f"cell {cell.cell}: {cell.message}" for cell in info.cells if cell.status != "ok"]
    return notes

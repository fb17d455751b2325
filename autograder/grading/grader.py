"""Grade chapter notebooks: run every case against the student and the reference, score, diagnose.

The student's code runs elsewhere (a sandboxed child through `session.StudentSession`, or the
student's own kernel for nbgrader); this module only sees Outcomes, so comparisons and scores
are made in the trusted process.

Scoring: each exercise's points are split between a CPU test (80%) and a device-portability
test (20%): on CUDA (float32, float16 and bfloat16) where `torch.cuda.is_available()`, else the
device check (`device_check`: the code run on fake CUDA tensors, shapes, dtypes and devices only,
which catches tensors created on a fixed device), once per code path (`code_path`); a written answer ("predict the output") is one CPU test for all its points. Within a
test, credit is the fraction of cases passed; a portability case counts only where the same case
passes on the CPU. Use of a forbidden built-in anywhere in an exercise zeroes the exercise.
Every case is judged by `judge`, which the self-check and nbgrader use too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import cases as case_registry
from ..shared.calls import Call, Outcome
from .compare import FLOAT32_NOTE, PRECISION_HINT, Mismatch, compare_meta
from ..shared.contract import CHAPTERS, Chapter, Exercise, chapter_for_filename
from ..runtime.device_check import DEVICE_CHECKS, FAKE_CUDA, UNCHECKED_NOTE, unchecked
from ..runtime.execute import at_float32, execute
from ..cases.inputs import grading_seed
from ..references.solutions import load_reference
from .results import CaseResult, ChapterResult, SubmissionResult, TestResult
from ..sandbox.modes import SandboxMode
from ..report.untrusted_text import capped

CPU_SHARE = 0.8
HALF_DTYPES = ("float16", "bfloat16")
HALF_CASES = 3  # how many cases also run in half precision on CUDA


def device_plan(requested: str = "auto") -> list[str]:
    """The devices to grade on: always the CPU, then CUDA where present, else the device check
    (fake CUDA)."""
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        raise RuntimeError("--device cuda was requested but torch.cuda.is_available() is False")
    if requested == "cpu":
        return ["cpu", FAKE_CUDA]
    return ["cpu", "cuda" if cuda else FAKE_CUDA]


class ReferenceCache:
    """Reference outcomes, computed once per (call, device, dtype) and shared across submissions."""

    def __init__(self):
        self._lock = threading.Lock()
        self._outcomes: dict = {}
        self._pending: dict = {}  # key -> Event, while one thread computes that outcome
        self._cases: dict = {}

    def cases(self, chapter: str, exercise: str, seed: int, quick: bool) -> list[Call]:
        key = (chapter, exercise, seed, quick)
        with self._lock:
            if key not in self._cases:
                self._cases[key] = case_registry.build_cases(
                    chapter, exercise, load_reference(chapter), seed=seed, quick=quick)
            return self._cases[key]

    def expected(self, call: Call, key: tuple) -> Outcome:
        """The reference's outcome of `call`, computed once: a thread that asks while another
        computes the same outcome (`warm_in_background` and the grading loop) waits for it."""
        while True:
            with self._lock:
                hit = self._outcomes.get(key)
                if hit is not None:
                    return hit
                pending = self._pending.get(key)
                if pending is None:
                    pending = self._pending[key] = threading.Event()
                    break  # this thread computes it
            pending.wait()
        try:
            hit = execute(load_reference(call.chapter), call)
            with self._lock:
                self._outcomes[key] = hit
        finally:
            with self._lock:
                self._pending.pop(key, None)
            pending.set()
        return hit

    def with_float32(self, call: Call, key: tuple, expected: Outcome) -> Outcome:
        """`expected` with the reference's float32 run of the same case (Outcome.at_float32),
        computed only where a float64 result failed (most never need it) and kept with it."""
        if expected.at_float32 is not None or expected.error:
            return expected
        low = at_float32(load_reference(call.chapter), call)
        if low is None:
            return expected
        hit = dataclasses.replace(expected, at_float32=low)
        with self._lock:
            self._outcomes[key] = hit
        return hit

    @contextlib.contextmanager
    def warming(self, chapter_ids, devices: list[str], seed: int, quick: bool):
        """`warm` in a thread for the duration of the block: the grader computes reference
        outcomes while the student's sandbox starts and runs the notebooks (time it would
        otherwise spend waiting). The thread stops and is joined when the block ends (a thread
        still inside torch at interpreter exit aborts the process). A failure there costs
        nothing: the grading loop computes what is missing itself."""
        stop = threading.Event()

        def run():
            try:
                self.warm(chapter_ids, devices, seed, quick, stop)
            except Exception:
                pass
        thread = threading.Thread(target=run, name="reference-warm")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def warm(self, chapter_ids, devices: list[str], seed: int, quick: bool,
             stop: threading.Event | None = None) -> None:
        """Compute every reference outcome the grading of these chapters will ask for (until
        `stop` is set)."""
        for chapter_id in chapter_ids:
            for ex in CHAPTERS[chapter_id].exercises:
                cases = self.cases(chapter_id, ex.name, seed, quick)
                for device in devices:
                    for index, c in variants(cases, device):
                        if stop is not None and stop.is_set():
                            return
                        self.expected(c, reference_key(chapter_id, ex.name, seed, quick, index, c))

    def export(self, seed: int | None = None, quick: bool | None = None, cuda: bool = False) -> dict:
        """The cases and CPU/meta outcomes (of one seed and quick setting, or all), as plain
        data for `wire`. CUDA outcomes stay out (they belong to one machine's device) unless
        `cuda` (for worker processes on this machine)."""
        def wanted(s, q):
            return (seed is None or s == seed) and (quick is None or q == quick)
        with self._lock:
            cases = [[list(k), [c.to_plain() for c in calls]] for k, calls in self._cases.items()
                     if wanted(k[2], k[3])]
            outcomes = [[list(k), o.to_plain()] for k, o in self._outcomes.items()
                        if (cuda or k[-2] != "cuda") and wanted(k[2], k[3])]
        return {"cases": cases, "outcomes": outcomes}

    def merge(self, plain: dict) -> int:
        """Add what `export` gave (read back); how many outcomes were added. Data that does not
        fit adds nothing (it is then computed again)."""
        try:
            cases = {tuple(k): [Call.from_plain(c) for c in calls] for k, calls in plain["cases"]}
            outcomes = {tuple(k): Outcome.from_plain(o) for k, o in plain["outcomes"]}
        except (TypeError, ValueError, KeyError):
            return 0
        with self._lock:
            for k, calls in cases.items():
                self._cases.setdefault(k, calls)
            # new outcomes, and ones that now carry the reference's float32 run (with_float32)
            added = [k for k, o in outcomes.items() if k not in self._outcomes
                     or (o.at_float32 is not None and self._outcomes[k].at_float32 is None)]
            for k in added:
                self._outcomes[k] = outcomes[k]
        return len(added)

    def complete(self, chapter_ids, devices: list[str], seed: int, quick: bool) -> bool:
        """Whether every reference outcome these chapters need is here already."""
        with self._lock:
            for chapter_id in chapter_ids:
                for ex in CHAPTERS[chapter_id].exercises:
                    cases = self._cases.get((chapter_id, ex.name, seed, quick))
                    if cases is None:
                        return False
                    for device in devices:
                        for index, c in variants(cases, device):
                            if reference_key(chapter_id, ex.name, seed, quick, index, c) not in self._outcomes:
                                return False
        return True

    def count(self) -> int:
        with self._lock:
            return len(self._outcomes)

    def held(self) -> int:
        """How much there is to store: outcomes, and the float32 runs attached to them (so that
        one added by with_float32 counts as new)."""
        with self._lock:
            return len(self._outcomes) + sum(o.at_float32 is not None for o in self._outcomes.values())

    def snapshot(self, cuda: bool = False) -> bytes:
        """Everything `export` gives, as one `wire` frame for worker processes of this grader."""
        from ..shared import wire

        return wire.encode(self.export(cuda=cuda))

    def adopt(self, data: bytes) -> None:
        from ..shared import wire

        self.merge(wire.decode(data))


REFERENCES = ReferenceCache()


def reference_key(chapter_id: str, exercise: str, seed: int, quick: bool, index: int, call: Call) -> tuple:
    return (chapter_id, exercise, seed, quick, index, call.device, call.dtype)


STOPPING_ASPECTS = ("timeout", "crash", "missing")


def _path_of(x):
    """What of an argument can send code down another path: its kind, not its numbers."""
    if isinstance(x, torch.Tensor):
        kind = "bool" if x.dtype == torch.bool else "float" if x.is_floating_point() else "int"
        tags = (kind, x.dim())  # (unbatched and batched inputs often take different branches)
        if x.numel() and x.dim() and x.dtype == torch.bool:
            tags += (bool((~x).all(-1).any()),)  # a fully masked row
        elif x.numel() and x.is_floating_point():
            tags += (bool(torch.isinf(x).any()),)  # an additive -inf mask
        return tags
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, float):
        return ("float", x == 0)  # (dropout=0.0 vs 0.1)
    if isinstance(x, int):
        return "int"
    if isinstance(x, (list, tuple)):
        return tuple(_path_of(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _path_of(v)) for k, v in x.items()))
    return type(x).__name__


def code_path(call: Call) -> tuple:
    """The code path a case takes, as far as its inputs decide it: which arguments are given,
    of which kind (no mask, a boolean or a float mask, fully masked rows, a KV cache), the
    module's options, train mode, an expected error. A device mistake depends on the path, not
    on the values, so the device check runs one case of each path (`variants`)."""
    return (call.method, _path_of(call.init), call.train, call.as_default, call.expect_error,
            bool(call.grad), _path_of(call.args), _path_of(call.kwargs))


def device_check_groups(cases: list[Call]) -> dict[int, int]:
    """index of each case the device check covers -> index of the case run for its code path
    (the first case of that path). A memory case checks memory, which fake and meta tensors
    have none of; a train-mode case draws dropout, which they cannot compare."""
    first: dict = {}
    groups = {}
    for i, c in enumerate(cases):
        if c.answer or c.train or c.capped_memory:
            continue
        groups[i] = first.setdefault(code_path(c), i)
    return groups


def variants(cases: list[Call], device: str) -> list[tuple[int, Call]]:
    """The calls of one device test, each with the index of the case it comes from. A written
    answer (`Call.answer`) is a value, not code: it has no device variant. The device check
    runs one case per code path (`device_check_groups`); the other cases of a path take its
    verdict (`grade_exercise`)."""
    if device == "cpu":
        return list(enumerate(cases))
    code = [(i, c) for i, c in enumerate(cases) if not c.answer]
    if device in DEVICE_CHECKS:
        groups = device_check_groups(cases)
        return [(i, cases[i].on(device, "float32")) for i, rep in groups.items() if i == rep]
    out = [(i, c.on("cuda", "float32")) for i, c in code]
    for dt in HALF_DTYPES:
        halves = [(i, c) for i, c in code
                  if not (c.expect_error or c.as_default or c.train or c.capped_memory)]
        out += [(i, c.on("cuda", dt)) for i, c in halves[:HALF_CASES]]
    return out


def _figure(call: Call, student: Outcome, expected: Outcome, m: Mismatch) -> dict | None:
    """A 2-D slice of expected vs submitted attention weights, when the weights differ."""
    if m.aspect not in ("values", "nonfinite") or len(student.outputs) < 2 or len(expected.outputs) < 2:
        return None
    s, e = student.outputs[1], expected.outputs[1]
    if s is None or e is None or s.shape != e.shape or e.dim() < 2 or not e.is_floating_point():
        return None
    if torch.allclose(torch.nan_to_num(s.double()), e.double(), rtol=1e-5, atol=1e-7):
        return None
    while e.dim() > 2:
        s, e = s[0], e[0]
    return {"expected": e.double().tolist(), "submitted": torch.nan_to_num(s.double()).tolist()}


@dataclass
class Verdict:
    """The diagnosis of one case: the first failing aspect (with its hint), the forbidden
    built-ins the call used, and a note on a pass (float32 rounding in a float64 case)."""

    mismatch: Mismatch | None
    forbidden: set = field(default_factory=set)
    note: str = ""


def judge(ex: Exercise, call: Call, student: Outcome, expected: Outcome) -> Verdict:
    """The one grading rule, used by the grader, the self-check and nbgrader alike: compare the
    student's outcome of `call` with the expected one (on the meta device: shapes, dtypes and
    devices only), name the likely mistake, and record forbidden built-ins."""
    notes: list = []
    try:
        if call.device in DEVICE_CHECKS and not call.answer:  # (an answer is a value: compared as on the CPU)
            m = compare_meta(call, student, expected)
        else:
            m = case_registry.compare(call, student, expected, notes)
    except Exception as e:  # an outcome that no rule foresaw: the case fails, the grading goes on
        m = Mismatch("returned", f"the result could not be compared with the reference "
                     f"({type(e).__name__}: {str(e)[:200]}).")
        return Verdict(m, ex.forbidden.used_in(student.forbidden))
    if m:
        try:
            m.hint = m.hint or case_registry.hint(call, student, expected, m)
        except Exception:
            m.hint = None
        if not m.hint and m.aspect == "grads" and FLOAT32_NOTE in notes:
            m.hint = case_registry.small_difference_hint(call, student, expected) or PRECISION_HINT
    return Verdict(m, ex.forbidden.used_in(student.forbidden), notes[0] if notes and m is None else "")


def _credit_cpu_only(device: str, result: CaseResult, cpu_passed: bool) -> None:
    if device != "cpu" and result.passed and not cpu_passed:
        result.passed, result.aspect = False, "cpu"
        result.message = ("not credited: this case fails on the CPU, and device portability "
                          "counts only for cases that are correct there.")


def _same_path(cases: list[Call], groups: dict, index: int, result: CaseResult, name: str,
               cpu_passed: dict) -> list[CaseResult]:
    """The device check's results of the cases that take the same code path as case `index`
    (run for them all, `device_check_groups`): its verdict, each credited on its own CPU result."""
    out = []
    for member, rep in groups.items():
        if rep == index and member != index:
            c = cases[member]
            twin = dataclasses.replace(result, case=c.case, used=list(result.used), figure=None)
            if not twin.passed:  # (a pass says nothing: the path passed)
                twin.message += f" (the device check of case \"{name}\", which takes the same code path)"
            _credit_cpu_only(result.device, twin, cpu_passed.get(member, True))
            out.append(twin)
    return out


def forbidden_message(ex: Exercise, names) -> str:
    return (f"uses {ex.forbidden.what} ({', '.join(sorted(names))}); this exercise asks you to write "
            "the computation yourself, so it scores zero.")


def _static_inplace(static, notebook, call: Call) -> Mismatch | None:
    """The in-place change of one of this call's tensor inputs that the notebook's source shows
    (`source/findings.py`): measured in the grader, so no student code can hide it."""
    from ..source import in_place

    if not static or not static.inplace:
        return None
    try:
        receiving = in_place.tensor_params_from_cases([call], notebook).get(call.exercise, {})
    except Exception:
        return None
    for change in static.inplace:
        if change.param in receiving.get(change.method, set()):
            return Mismatch("inplace", f"the call modifies its input `{change.param}` in place "
                            f"({change.describe()}); work on a copy or use out-of-place ops "
                            "(masked_fill, not masked_fill_).")
    return None


def exercise_tests(ex: Exercise, devices: list[str]) -> list[tuple[str, float]]:
    """(device, share of the exercise's points) of each test of one exercise: 80% CPU and 20%
    device portability, except a written answer ("answer" kind), which is a value and not code:
    one test, read on the CPU, for all its points."""
    if ex.kind == "answer":
        return [("cpu", 1.0)]
    return [(device, CPU_SHARE if device == "cpu" else 1 - CPU_SHARE) for device in devices]


def grade_exercise(chapter: Chapter, ex: Exercise, run: Callable[[Call], Outcome], devices: list[str],
                   seed: int, quick: bool = False, static=None, notebook=None) -> list[TestResult]:
    """Every test of one exercise; `run` executes a Call on the student's side. A portability
    case (meta, CUDA) earns credit only where the same case is correct on the CPU. `static`:
    what the notebook's source shows (`findings.ExerciseFindings` of this exercise, with
    the parsed `notebook`), where the grader has the source: forbidden built-ins and in-place
    changes of inputs, which the student's process cannot hide from it."""
    cases = REFERENCES.cases(chapter.id, ex.name, seed, quick)
    tests, forbidden_seen = [], set(static.forbidden_names if static else ())
    cpu_passed: dict[int, bool] = {}
    groups = device_check_groups(cases)  # (the device check's code paths: computed once per exercise)
    for device, share in exercise_tests(ex, devices):
        test = TestResult(chapter.id, ex.name, device, 0.0, round(ex.points * share, 4))
        stop = None  # after a timeout/crash/missing name, the remaining cases are not run
        for index, c in variants(cases, device):
            if stop:
                skipped = CaseResult(c.case, device, c.dtype, False, stop.aspect, f"not run: {stop.message}")
                test.cases.append(skipped)
                if device in DEVICE_CHECKS:
                    test.cases += _same_path(cases, groups, index, skipped, c.case, cpu_passed)
                continue
            key = reference_key(chapter.id, ex.name, seed, quick, index, c)
            expected = REFERENCES.expected(c, key)
            student = run(c)
            verdict = judge(ex, c, student, expected)
            if c.device == FAKE_CUDA and verdict.mismatch and unchecked(student):
                verdict = Verdict(None, verdict.forbidden, UNCHECKED_NOTE + f" ({student.error['message'][:160]})")
            if verdict.mismatch and verdict.mismatch.aspect in ("values", "grads") and c.dtype == "float64":
                # the float32 policy: judged again against the reference's own float32 run
                if (low := REFERENCES.with_float32(c, key, expected)) is not expected:
                    expected, verdict = low, judge(ex, c, student, low)
            forbidden_seen |= verdict.forbidden
            m = verdict.mismatch
            if m is None and device == "cpu":
                m = _static_inplace(static, notebook, c)
            result = CaseResult(c.case, device, c.dtype, m is None, note=verdict.note, used=student.called)
            if m:  # (capped: a message can list what the student's code holds, e.g. its names)
                result.aspect, result.message, result.hint = m.aspect, capped(m.message), capped(m.hint)
                result.not_implemented = m.not_implemented
                result.figure = _figure(c, student, expected, m)
                if m.aspect in STOPPING_ASPECTS:
                    stop = m
            if student.device_note and not result.note:
                result.note = (f"run on the meta device: fake CUDA tensors have no values "
                               f"({student.device_note})")
            twins = _same_path(cases, groups, index, result, c.case, cpu_passed) if device in DEVICE_CHECKS else []
            _credit_cpu_only(device, result, cpu_passed.get(index, True))
            if device == "cpu":
                cpu_passed[index] = result.passed
            test.cases.append(result)
            test.cases += twins
        if stop and stop.aspect == "missing":
            test.note = stop.message
        total = len(test.cases)
        test.score = round(test.max_score * test.passed / total, 4) if total else 0.0
        tests.append(test)
    if forbidden_seen:
        note = forbidden_message(ex, forbidden_seen)
        if static and static.forbidden:
            note += " Found in the notebook: " + "; ".join(f.describe() for f in static.forbidden[:3]) + "."
        for t in tests:
            t.score, t.note = 0.0, note
    return tests


def grade_chapter(chapter: Chapter, run: Callable[[Call], Outcome], devices: list[str], seed: int,
                  quick: bool = False, exercises: list[str] | None = None, cells: list[str] | None = None
                  ) -> list[TestResult]:
    """Every exercise of a chapter; with the notebook's `cells`, the static check of its source
    too (`source/findings.py`)."""
    static, notebook = _static_findings(chapter, cells, seed, quick)
    tests = []
    for ex in chapter.exercises:
        if exercises is None or ex.name in exercises:
            tests += grade_exercise(chapter, ex, run, devices, seed, quick, static.get(ex.name), notebook)
    _point_to_failing_foundations(chapter, tests)
    return tests


def _static_findings(chapter: Chapter, cells: list[str] | None, seed: int, quick: bool) -> tuple[dict, object]:
    """exercise -> `findings.ExerciseFindings` of the notebook's source, and the parsed
    notebook ({} and None without cells, or if the check itself fails: it never costs a grade)."""
    if cells is None:
        return {}, None
    from ..source import in_place, symbols
    from ..source.findings import findings as static_findings

    try:
        notebook = symbols.parse(cells)
        calls = [c for ex in chapter.exercises for c in REFERENCES.cases(chapter.id, ex.name, seed, quick)]
        return static_findings(notebook, chapter, in_place.tensor_params_from_cases(calls, notebook)), notebook
    except Exception:
        return {}, None


# The aspects a wrong prerequisite can cause in the exercise that calls it (not, e.g., its
# parameter names or its own signature); an error only where it was raised inside the prerequisite.
PREREQUISITE_ASPECTS = ("values", "nonfinite", "shape", "dtype", "device", "grads", "inplace")


def _blamed(c: CaseResult, name: str) -> bool:
    if name not in c.used:
        return False
    return c.aspect in PREREQUISITE_ASPECTS or (c.aspect == "error" and f", in {name}" in c.message)


def _point_to_failing_foundations(chapter: Chapter, tests: list[TestResult]) -> None:
    """Where a case fails without a hint, and an exercise it builds on fails its own tests and
    was called by this case (and can cause this kind of failure), say so: the mistake is most
    likely there (e.g. SelfAttention over a wrong scaled_dot_product_attention)."""
    failing = {t.exercise for t in tests if t.device == "cpu" and t.score < t.max_score}
    for t in tests:
        candidates = [b for b in chapter.exercise(t.exercise).builds_on if b in failing]
        for c in t.cases:
            if c.passed or c.hint or c.not_implemented:
                continue
            foundations = [b for b in candidates if _blamed(c, b)]
            if foundations:
                c.hint = _foundation_hint(t.exercise, foundations)


def _foundation_hint(exercise: str, foundations: list) -> str:
    names = " and ".join(f"`{b}`" for b in foundations)
    plural = len(foundations) > 1
    it = "them" if plural else "it"
    return (f"{names} {'fail their' if plural else 'fails its'} own tests too, and `{exercise}` "
            f"calls {it}: fix {it} first (see the hint there), then check this one again")


def zero_chapter(chapter: Chapter, devices: list[str], note: str) -> list[TestResult]:
    """Every test of a chapter at zero, with one message (unreadable notebook, ...)."""
    tests = []
    for ex in chapter.exercises:
        for device, share in exercise_tests(ex, devices):
            tests.append(TestResult(chapter.id, ex.name, device, 0.0, round(ex.points * share, 4), note=note))
    return tests


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
                 limits=None, jobs: int | None = None, quick: bool = False):
        self.devices = device_plan(device)
        self.seed = grading_seed() if seed is None else seed
        self.sandbox = sandbox
        self.limits = limits
        self.jobs = jobs or min(2, os.cpu_count() or 1)
        self.quick = quick

    # -- one notebook -------------------------------------------------------------------------
    def grade_notebook(self, path: Path, chapter: Chapter, sandboxes=None, deadline: float | None = None
                       ) -> ChapterResult:
        from ..session.memory_case import MemoryCases
        from ..source.notebook import NotebookError, notebook_cells
        from ..session.student_session import StudentSession

        start = time.perf_counter()
        result = ChapterResult(chapter.id, str(path))
        try:
            cells = notebook_cells(path)
        except NotebookError as e:
            result.notes.append(str(e))
            result.not_graded = str(e)
            result.tests = zero_chapter(chapter, self.devices, f"not graded: {e}")
            result.seconds = time.perf_counter() - start
            return result
        # Memory cases (`Call.capped_memory`: chapter 7) run first, in a memory-capped child of
        # their own (autograder.session.memory_case); the chapter's other cases in uncapped children.
        memory = MemoryCases(cells, [c for ex in chapter.exercises for c in
                                     REFERENCES.cases(chapter.id, ex.name, self.seed, self.quick)],
                             limits=self.limits, sandbox=self.sandbox, sandboxes=sandboxes, deadline=deadline)
        memory.run_first()
        with StudentSession(cells, limits=self.limits, sandbox=self.sandbox, sandboxes=sandboxes,
                            deadline=deadline) as session:
            info = session.start()
            result.sandbox = session.mode
            result.notes.extend(_start_notes(info))
            result.output = info.get("output", "")
            result.tests = grade_chapter(chapter, memory.route(session.run), self.devices, self.seed,
                                         self.quick, cells=cells)
            _failed_definitions(chapter, result.tests, cells, info)
            defined = set(info.get("defined", []))
            note = _other_chapter_note(chapter, defined) if "defined" in info else None
            if note:
                result.notes.append(note)
        result.seconds = time.perf_counter() - start
        return result

    def grade_namespace(self, chapter: Chapter, namespace: dict, exercises: list[str] | None = None
                        ) -> list[TestResult]:
        """Grade objects already defined in this process (tests, a trusted kernel): no sandbox,
        so no child whose memory the kernel could cap: memory cases record the largest tensor
        created instead (`Call.measure_memory`), which this process can be trusted to do."""
        def run(c: Call) -> Outcome:
            return execute(namespace, dataclasses.replace(c, measure_memory=True) if c.capped_memory else c)
        return grade_chapter(chapter, run, self.devices, self.seed, self.quick, exercises)

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
        from ..sandbox.limits import Limits

        return time.monotonic() + (self.limits or Limits.from_env()).student_budget

    def grade_planned(self, chapter_id: str, notebook: Path | None, sandboxes=None,
                      deadline: float | None = None) -> ChapterResult:
        """One chapter of a plan. Never raises: a grader fault zeroes this chapter only.
        sandboxes: the student's `sandbox.SandboxPool` (warm sandboxes), if any; deadline: when
        the student's time budget runs out (`student_deadline`)."""
        ch = CHAPTERS[chapter_id]
        if notebook is None:
            return ChapterResult(chapter_id, None, zero_chapter(ch, self.devices, "no notebook submitted"))
        if deadline is not None and time.monotonic() >= deadline:
            from ..sandbox.limits import Limits
            from ..session.student_session import budget_message

            why = budget_message(self.limits or Limits.from_env())
            return ChapterResult(chapter_id, str(notebook), zero_chapter(ch, self.devices, why), notes=[why])
        try:
            return self.grade_notebook(notebook, ch, sandboxes, deadline)
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
        modes = {ch.sandbox for ch in result.chapters if ch.sandbox}
        result.sandbox = SandboxMode.FALLBACK if SandboxMode.FALLBACK in modes else next(iter(modes), None)
        result.seconds = seconds
        return result

    def grade_path(self, path, chapters: list[str] | None = None, jobs: int | None = None,
                   sandboxes=None) -> SubmissionResult:
        """Grade a notebook or a folder of them (see `plan`), `jobs` chapters at once, in this
        student's own warm sandboxes (`sandboxes`, a `sandbox.SandboxPool`; made here if None)."""
        from ..sandbox.modes import SandboxMode, choose_mode
        from ..sandbox.pool import SandboxPool

        start = time.perf_counter()
        result, todo = self.plan(path, chapters)
        jobs = max(1, jobs or self.jobs)
        own = None
        if sandboxes is None and choose_mode(None if self.sandbox == "auto" else self.sandbox)[0] \
                == SandboxMode.BUBBLEWRAP:
            sandboxes = own = SandboxPool(self.limits, size=jobs)
        submitted = [ch for ch, notebook in todo if notebook is not None]
        deadline = self.student_deadline()
        try:
            if "cuda" in self.devices:  # the grader's own CUDA runs before any student code, never beside it
                with contextlib.suppress(Exception):  # (not fatal: the grading loop computes what is missing)
                    REFERENCES.warm(submitted, ["cuda"], self.seed, self.quick)
            with REFERENCES.warming(submitted, self.devices, self.seed, self.quick), \
                    ThreadPoolExecutor(max_workers=jobs) as pool:
                # Later chapters first: they build on the earlier ones and take longest, so
                # the short ones fill in at the end instead of one long chapter running alone.
                done = list(pool.map(lambda item: self.grade_planned(*item, sandboxes, deadline),
                                     todo[::-1]))[::-1]
        finally:
            if own is not None:
                own.close()
        return self.assemble(result, done, time.perf_counter() - start)


def _failed_definitions(chapter: Chapter, tests: list[TestResult], cells: list[str], info: dict) -> None:
    """A name the notebook does not define because the cell that defines it failed (a
    SyntaxError, an error raised before the definition, a timeout): that cell's error goes into
    the exercise's own note too, not only among the notebook's notes above its table."""
    import re

    failed = {c.get("cell"): c.get("message") or c.get("status") for c in info.get("cells", [])
              if c.get("status") not in (None, "ok", "skipped")}
    if not failed:
        return
    for t in tests:
        first = t.cases[0] if t.cases else None
        if not (t.note and first is not None and first.aspect == "missing"):
            continue
        name = re.escape(chapter.exercise(t.exercise).target)
        defines = re.compile(rf"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+{name}\b|^{name}[ \t]*(?::[^=\n]*)?=(?!=)",
                             re.MULTILINE)
        where = [n for n in sorted(failed) if isinstance(n, int) and 0 < n <= len(cells) and defines.search(cells[n - 1])]
        if where:
            t.note += f" It is defined in cell {where[-1]}, which failed: {failed[where[-1]]}"


def _start_notes(info: dict) -> list[str]:
    notes = []
    mode = info.get("sandbox")
    if mode:
        notes.append(f"sandbox: {mode}")
    if info.get("sandbox_note"):
        notes.append(info["sandbox_note"])
    for cell in info.get("cells", []):
        status = cell.get("status")
        if status and status != "ok":
            notes.append(f"cell {cell.get('cell')}: {cell.get('message', status)}")
    return notes

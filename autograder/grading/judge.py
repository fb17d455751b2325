"""Judging one exercise: every case run against the student and the reference, each variant
compared (`judge`: the rule the self-check and nbgrader use too, `verdict.judge_by`), forbidden built-ins and in-place
changes found in the source taken into account, and the exercise scored."""
from __future__ import annotations


from dataclasses import replace
from typing import Callable

import torch

from .. import cases as case_registry
from ..shared.calls import Call, Outcome
from .compare import Mismatch
from ..shared.contract import Chapter, Exercise
from ..runtime.device_check import DEVICE_CHECKS, FAKE_CUDA, UNCHECKED_NOTE, unchecked
from .results import CaseResult, TestResult
from ..report.untrusted_text import capped
from .variants import device_check_groups, variants
from ..references.cache import REFERENCES, reference_key
from .scoring import credit_cpu_only, exercise_tests, not_run_for_cpu, path_failed_on_cpu, same_path
from ..selfcheck.verdict import Verdict, forbidden_message, judge_by  # (one definition, the student package's)


STOPPING_ASPECTS = ("timeout", "crash", "missing")


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


def judge(ex: Exercise, call: Call, student: Outcome, expected: Outcome) -> Verdict:
    """The one grading rule (`verdict.judge_by`, which the self-check and nbgrader use too), with
    the comparisons and the live mistake models of `autograder/cases`."""
    return judge_by(case_registry, ex, call, student, expected)


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


def grade_exercise(chapter: Chapter, ex: Exercise, run: Callable[[Call], Outcome], devices: list[str],
                   seed: int, quick: bool = False, static=None, notebook=None,
                   references=None, failing: set | None = None) -> list[TestResult]:
    """Every test of one exercise; `run` executes a Call on the student's side. A portability
    case (meta, CUDA) earns credit only where the same case is correct on the CPU. `static`:
    what the notebook's source shows (`findings.ExerciseFindings` of this exercise, with
    the parsed `notebook`), where the grader has the source: forbidden built-ins and in-place
    changes of inputs, which the student's process cannot hide from it. references: the
    reference outcomes (`references.cache.ReferenceCache`; default the process's REFERENCES).
    failing: the chapter's exercises that failed their CPU tests so far, the only ones of
    those this one builds on whose use the student's side records (`Call.watch`; None: all).
    The device check of a code path none of whose cases is correct on the CPU is not run: it
    could earn nothing, and the CPU's failure is the feedback."""
    references = REFERENCES if references is None else references
    cases = references.cases(chapter.id, ex.name, seed, quick)
    tests, forbidden_seen = [], set(static.forbidden_names if static else ())
    cpu_passed: dict[int, bool] = {}
    cpu_rows: dict[int, CaseResult] = {}  # (what a device row uses is its CPU row's: `execute` records none)
    groups = device_check_groups(cases)  # (the device check's code paths: computed once per exercise)
    missing = False  # the CPU test stopped on a name the notebook does not define
    watch = None if failing is None or not ex.builds_on else [b for b in ex.builds_on if b in failing]
    stubs: dict[tuple, Outcome] = {}  # a call's shape (`_entry_shape`) -> the stub's outcome (`_stub_outcome`)
    for device, share in exercise_tests(ex, devices):
        test = TestResult(chapter.id, ex.name, device, 0.0, round(ex.points * share, 4))
        stop = None  # after a timeout/crash/missing name, the remaining cases are not run
        for index, c in variants(cases, device):
            if stop:
                skipped = CaseResult(c.case, device, c.dtype, False, stop.aspect, f"not run: {stop.message}")
                test.cases.append(skipped)
                if device == "cpu":
                    cpu_passed[index] = False  # (not run there: a device row of it earns nothing)
                if device in DEVICE_CHECKS:
                    test.cases += same_path(cases, groups, index, skipped, c.case, cpu_passed)
                continue
            if device in DEVICE_CHECKS and not missing and path_failed_on_cpu(groups, index, cpu_passed):
                test.cases += not_run_for_cpu(cases, groups, index, device, c.dtype, cpu_rows)
                continue
            key = reference_key(chapter.id, ex.name, seed, quick, index, c)
            stub = stubs.get(_entry_shape(c)) if not c.capped_memory else None  # (on CUDA too)
            verdict = None
            if stub is not None:  # (the stub's error, whatever the inputs: judged, never run)
                student = stub
                verdict, expected = _judge_case(ex, c, key, student, references)
                if not (verdict.mismatch and verdict.mismatch.not_implemented):
                    verdict = None  # (it could only ever fail: if not, the case runs after all)
            if verdict is None:
                student = run(replace(c, watch=watch) if watch is not None and device == "cpu" else c)
                verdict, expected = _judge_case(ex, c, key, student, references)
                if device == "cpu" and _stub_outcome(student, verdict):
                    stubs[_entry_shape(c)] = student
            forbidden_seen |= verdict.forbidden
            m = verdict.mismatch
            if m is None and device == "cpu":
                m = _static_inplace(static, notebook, c)
            result = _case_result(c, device, student, expected, verdict, m)
            if device == "cpu":
                cpu_rows[index] = result
            else:
                result.used = list(cpu_rows[index].used if index in cpu_rows else result.used)
            if m and m.aspect in STOPPING_ASPECTS and not c.capped_memory:
                stop = m  # (a memory case ran in a capped child of its own: the others are not stopped)
            twins = same_path(cases, groups, index, result, c.case, cpu_passed) if device in DEVICE_CHECKS else []
            credit_cpu_only(device, result, cpu_passed.get(index, True))
            if device == "cpu":
                cpu_passed[index] = result.passed
            test.cases.append(result)
            test.cases += twins
        if stop and stop.aspect == "missing":
            test.note = stop.message
            missing = missing or device == "cpu"  # (the device tests then say so too, as before)
        total = len(test.cases)
        test.score = round(test.max_score * test.passed / total, 4) if total else 0.0
        tests.append(test)
    if forbidden_seen:
        _zero_for_forbidden(ex, tests, forbidden_seen, static)
    return tests


def _stub_outcome(student: Outcome, verdict: Verdict) -> bool:
    """Whether a CPU case's outcome is the exercise's stub raising (`execute.stub_raise`: code that
    raises NotImplementedError before it reads any input), judged "not implemented": the
    exercise's other cases that enter the same code with arguments of the same names (a
    function's calls, or the module's construction: `_entry_shape`) would raise the same error, on the CPU as on CUDA, and are judged on this
    outcome without a run. The child's claim is believed only where it fails the student's own
    cases. (The device check runs none of them: `path_failed_on_cpu`.)"""
    err = student.error
    return bool(err and err.get("stub") is True and err.get("type") == "NotImplementedError"
                and verdict.mismatch and verdict.mismatch.not_implemented)


def _entry_shape(c: Call) -> tuple:
    """What decides whether a call gets into the code it enters first, whatever the values: the
    arguments' number and names (a stub whose parameter is `attn_mask` raises TypeError, with
    its hint, where a case passes `mask=`)."""
    if c.init is not None:
        return ("init", tuple(sorted(c.init)))
    return ("call", len(c.args), tuple(sorted(c.kwargs)))


def _judge_case(ex: Exercise, c: Call, key, student: Outcome, references) -> tuple[Verdict, Outcome]:
    """The verdict on one case and the reference it was judged against: a device-check failure
    for want of values is waved through with a note, and a float64 value/gradient mismatch
    is judged again against the reference's own float32 run (the float32 policy)."""
    expected = references.expected(c, key)
    verdict = judge(ex, c, student, expected)
    if c.device == FAKE_CUDA and verdict.mismatch and unchecked(student):
        verdict = Verdict(None, verdict.forbidden, UNCHECKED_NOTE + f" ({student.error['message'][:160]})")
    if verdict.mismatch and verdict.mismatch.aspect in ("values", "grads") and c.dtype == "float64":
        if (low := references.with_float32(c, key, expected)) is not expected:
            expected, verdict = low, judge(ex, c, student, low)
    return verdict, expected


def _case_result(c: Call, device: str, student: Outcome, expected: Outcome, verdict: Verdict,
                 m: Mismatch | None) -> CaseResult:
    """One case's result as reported: passed, or the mismatch's message, hint and figure."""
    result = CaseResult(c.case, device, c.dtype, m is None, note=verdict.note, used=student.called)
    if m:  # (capped: a message can list what the student's code holds, e.g. its names)
        result.aspect, result.message, result.hint = m.aspect, capped(m.message), capped(m.hint)
        result.not_implemented = m.not_implemented
        result.figure = _figure(c, student, expected, m)
    if student.device_note and not result.note:
        result.note = f"not checked: the device check has no values ({student.device_note})"
    return result


def _zero_for_forbidden(ex: Exercise, tests: list[TestResult], forbidden_seen: set, static) -> None:
    """A forbidden built-in used anywhere in the exercise: every test of it scores 0, saying why."""
    note = forbidden_message(ex, forbidden_seen)
    if static and static.forbidden:
        note += " Found in the notebook: " + "; ".join(f.describe() for f in static.forbidden[:3]) + "."
    for t in tests:
        t.score, t.note = 0.0, note

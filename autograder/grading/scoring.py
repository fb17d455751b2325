"""How verdicts become points. Each exercise's points split between a CPU test (80%) and a device-portability test
(20%); within a test, credit is the fraction of cases passed, and a portability case counts
only where the same case passes on the CPU. A written answer is one CPU test for all its
points. A chapter that cannot be graded scores zero with its reason."""
from __future__ import annotations


import dataclasses


from ..shared.calls import Call
from ..shared.contract import Chapter, Exercise
from .results import CaseResult, TestResult


CPU_SHARE = 0.8
CPU_FIRST = "this case fails on the CPU, and device portability counts only for cases that are correct there."


def credit_cpu_only(device: str, result: CaseResult, cpu_passed: bool) -> None:
    if device != "cpu" and result.passed and not cpu_passed:
        result.passed, result.aspect = False, "cpu"
        result.message = f"not credited: {CPU_FIRST}"


def path_failed_on_cpu(groups: dict, index: int, cpu_passed: dict) -> bool:
    """Whether every case of the code path that case `index` is run for (`device_check_groups`)
    failed on the CPU, or was not run there: its device check could credit none of them."""
    members = [m for m, rep in groups.items() if rep == index]
    return bool(members) and all(cpu_passed.get(m) is False for m in members)


def not_run_for_cpu(cases: list[Call], groups: dict, index: int, device: str, dtype: str,
                    cpu_rows: dict) -> list[CaseResult]:
    """The device check's results of a code path that failed on the CPU (`path_failed_on_cpu`),
    not run: one for each of its cases, in the order a run gives them. A case whose code is
    still the exercise's stub says so, as its CPU row does."""
    out = []
    for m, rep in groups.items():
        if rep != index:
            continue
        cpu = cpu_rows.get(m)
        row = CaseResult(cases[m].case, device, dtype, False, "cpu", f"not run: {CPU_FIRST}",
                         used=list(cpu.used) if cpu else [])
        if cpu is not None and cpu.not_implemented:
            row.aspect, row.message, row.not_implemented = cpu.aspect, cpu.message, True
        out.append(row)
    return out


def same_path(cases: list[Call], groups: dict, index: int, result: CaseResult, name: str,
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
            credit_cpu_only(result.device, twin, cpu_passed.get(member, True))
            out.append(twin)
    return out


def exercise_tests(ex: Exercise, devices: list[str]) -> list[tuple[str, float]]:
    """(device, share of the exercise's points) of each test of one exercise: 80% CPU and 20%
    device portability, except for a task that is not portable code (a written answer, a value):
    one test, read on the CPU, for all its points."""
    if not ex.task.portable:
        return [("cpu", 1.0)]
    return [(device, CPU_SHARE if device == "cpu" else 1 - CPU_SHARE) for device in devices]


def zero_chapter(chapter: Chapter, devices: list[str], note: str) -> list[TestResult]:
    """Every test of a chapter at zero, with one message (unreadable notebook, ...)."""
    tests = []
    for ex in chapter.exercises:
        for device, share in exercise_tests(ex, devices):
            tests.append(TestResult(chapter.id, ex.name, device, 0.0, round(ex.points * share, 4), note=note))
    return tests

"""The device check runs only where it can earn something: a code path none of whose cases is
correct on the CPU (or run there: after a timeout) is not run on the device, its cases say
why, and a device row of a case the CPU never ran is never credited."""
from __future__ import annotations

from autograder.grading.grader import Grader
from autograder.grading.judge import grade_exercise
from autograder.grading.variants import device_check_groups
from autograder.references.cache import REFERENCES
from autograder.runtime.execute import execute
from autograder.shared.calls import Outcome
from autograder.shared.contract import CHAPTERS
from grading_helpers import exercise_namespace, namespace_of

CH = "02_scaled_dot_product_attention"
EX = "scaled_dot_product_attention"
GRADER = Grader(device="cpu")

# Right without a mask, wrong with one (the mask ignored).
NO_MASK = '''
_ref = scaled_dot_product_attention
def scaled_dot_product_attention(q, k, v, mask=None):
    return _ref(q, k, v)
'''


def _grade(ns: dict, cpu_outcome=None):
    """The exercise's two tests, and the device variants actually run, by case index."""
    chapter = CHAPTERS[CH]
    ex = next(e for e in chapter.exercises if e.name == EX)
    cases = REFERENCES.cases(CH, EX, GRADER.seed, GRADER.quick)
    ran: list[int] = []

    def run(c):
        index = next(i for i, x in enumerate(cases) if x.case == c.case)
        if c.device != "cpu":
            ran.append(index)
        elif cpu_outcome is not None and (forced := cpu_outcome(index)) is not None:
            return forced
        return execute(ns, c, trusted=True)

    tests = grade_exercise(chapter, ex, run, GRADER.devices, GRADER.seed, GRADER.quick)
    return cases, {t.device: t for t in tests}, ran


def test_a_code_path_that_fails_on_the_cpu_is_not_run_on_the_device():
    cases, tests, ran = _grade(namespace_of(CH, NO_MASK))
    cpu, device = tests["cpu"], tests["fake-cuda"]
    groups = device_check_groups(cases)
    passed = {r.case: r.passed for r in cpu.cases}
    assert any(passed.values()) and not all(passed.values())  # (both kinds of path are here)
    for rep in set(groups.values()):
        members = [cases[m].case for m, r in groups.items() if r == rep]
        if any(passed[m] for m in members):
            assert rep in ran, members
        else:
            assert rep not in ran, members
            rows = [r for r in device.cases if r.case in members]
            assert len(rows) == len(members)
            assert all(not r.passed and r.aspect == "cpu" and r.message.startswith("not run: this case fails on the CPU")
                       for r in rows), rows
    # every case still has its device row, in the order a full run gives (each path's run case,
    # then the cases that take its result)
    order = [m for rep in dict.fromkeys(groups.values()) for m, r in groups.items() if r == rep]
    assert [r.case for r in device.cases] == [cases[i].case for i in order]
    # what was run is credited as before: the passing paths' cases, and only those
    assert all(r.passed == passed[r.case] for r in device.cases)


def test_the_device_check_still_runs_a_path_with_one_case_correct_on_the_cpu():
    """One case of a path right on the CPU is enough: the path is run for it."""
    cases, tests, _ = _grade(namespace_of(CH, ""))
    groups = device_check_groups(cases)
    rep = next(r for r in set(groups.values()) if sum(1 for x in groups.values() if x == r) > 1)
    members = [m for m, r in groups.items() if r == rep]
    first_fails = lambda i: Outcome.failure("ValueError", "wrong") if i == rep else None  # noqa: E731
    cases, tests, ran = _grade(namespace_of(CH, ""), first_fails)
    assert rep in ran
    rows = {r.case: r for r in tests["fake-cuda"].cases}
    assert not rows[cases[rep].case].passed and rows[cases[rep].case].message.startswith("not credited")
    assert all(rows[cases[m].case].passed for m in members if m != rep)


def test_cases_the_cpu_never_ran_earn_no_device_credit():
    """After a timeout on the CPU, the remaining cases are not run there: their device rows earn
    nothing (before, the device check credited them), and paths wholly among them are not run."""
    cases, tests, ran = _grade(namespace_of(CH, ""), lambda i: Outcome.failure("Timeout", "too slow") if i == 1 else None)
    cpu, device = tests["cpu"], tests["fake-cuda"]
    assert [r.passed for r in cpu.cases][:2] == [True, False]
    assert all(r.message.startswith("not run") for r in cpu.cases[2:])
    rows = {r.case: r for r in device.cases}
    assert rows[cases[0].case].passed
    assert not any(rows[c.case].passed for c in cases[1:] if c.case in rows)
    groups = device_check_groups(cases)
    assert all(rep == groups[0] or rep not in ran for rep in ran)


def test_a_stub_runs_no_device_check_and_its_rows_say_it_is_the_stub():
    """Untouched, the exercise raises NotImplementedError: nothing runs on the device, and its
    device rows say what its CPU rows say (as the rows of a run did)."""
    cases, tests, ran = _grade(exercise_namespace(CH))
    assert ran == []
    cpu = {r.case: r for r in tests["cpu"].cases}
    assert all(r.not_implemented and "NotImplementedError" in r.message for r in cpu.values())
    device = tests["fake-cuda"].cases
    assert len(device) == len(device_check_groups(cases))
    assert all(r.not_implemented and not r.passed and r.message == cpu[r.case].message for r in device)


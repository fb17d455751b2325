"""Shared by the tests/chapters/test_grading_chNN.py suites: grade the reference namespace of a chapter
with some names redefined by a (buggy or merely different) implementation, in process."""
from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat

from autograder.shared.contract import CHAPTERS
from autograder.grading.grader import Grader
from autograder.references.solutions import load_reference, reference_cells
from autograder.selfcheck import run_checks

REPO = Path(__file__).resolve().parent.parent

GRADER = Grader(device="cpu")


def namespace_of(chapter: str, src: str = "") -> dict:
    """The reference namespace with `src` (redefining some exercises) executed on top of it.
    The reference objects keep their own globals, so only the redefined names change."""
    ns = dict(load_reference(chapter))
    exec(textwrap.dedent(src), ns)
    return ns


def affected_exercises(chapter: str, ns: dict) -> list[str]:
    """The exercises whose grade a namespace made by `namespace_of` can change: those whose
    target it redefines, and those that build on them (`Exercise.builds_on`, transitively).
    Every other exercise is graded on the reference's own object, whose globals are the
    reference's (so it never calls a redefined name): it scores as the reference does, which
    tests/chapters/test_references.py grades in full."""
    ref = load_reference(chapter)
    changed = {k for k, v in ns.items() if k not in ref or ref[k] is not v}
    exercises = CHAPTERS[chapter].exercises
    hit = {ex.name for ex in exercises if ex.target in changed}
    while True:
        more = {ex.name for ex in exercises if set(ex.builds_on) & hit} - hit
        if not more:
            return [ex.name for ex in exercises if ex.name in hit]
        hit |= more


def grade_in(chapter: str, ns: dict, exercises: list[str] | None = None) -> dict:
    """exercise -> {"score", "max", "first" (first CPU failure or None), "notes", "tests",
    and per device ("cpu", "fake-cuda"): (score, max)}; every exercise, or those given."""
    out = {}
    for t in GRADER.grade_namespace(CHAPTERS[chapter], ns, exercises):
        e = out.setdefault(t.exercise, {"score": 0.0, "max": 0.0, "first": None, "notes": [], "tests": []})
        e["score"] += t.score
        e["max"] += t.max_score
        e[t.device] = (t.score, t.max_score)
        e["tests"].append(t)
        if t.note:
            e["notes"].append(t.note)
        if t.device == "cpu":
            e["first"] = t.first_failure
            e["hints"] = [h for h, _ in t.hints()][:3]  # as the report shows them
    return out


def self_check_failures(chapter: str, ns: dict, exercises=None) -> dict:
    """exercise -> the self-check's first mismatch (only exercises whose self-check fails)."""
    out = {}
    for ex in CHAPTERS[chapter].exercises:
        if exercises is None or ex.name in exercises:
            failed = [m for _, m, _ in run_checks(chapter, ex.name, ns[ex.target]) if m]
            if failed:
                out[ex.name] = failed[0]
    return out


def check_buggy(chapter: str, exercise: str, src: str, words: str | None, self_check: bool = True) -> None:
    """A buggy `src` loses credit on `exercise`, every other exercise keeps full marks, the
    student's self-check of `exercise` flags it (unless `self_check` is False: a documented
    exception, listed in test_selfcheck.SELF_CHECK_MISSES), and, with `words`, one of the hints the
    report shows (those the failing CPU cases give, most shared first) contains them."""
    ns = namespace_of(chapter, src)
    affected = affected_exercises(chapter, ns)
    assert exercise in affected, f"{src!r} does not redefine {exercise}"
    result = grade_in(chapter, ns, affected)  # (the others are the reference's own: full marks)
    assert result[exercise]["score"] < result[exercise]["max"], failures(result[exercise])
    if self_check:
        assert exercise in self_check_failures(chapter, ns, [exercise]), "the self-check passes this mistake"
    for other, e in result.items():
        if other != exercise:
            assert full(e), (other, failures(e))
    if words:
        first, hints = result[exercise]["first"], result[exercise]["hints"]
        assert any(words in h for h in hints), (first.case, first.message, hints)


def check_equivalent(chapter: str, src: str) -> None:
    """A correct but differently written `src` scores full marks on every exercise and passes
    every self-check."""
    ns = namespace_of(chapter, src)
    affected = affected_exercises(chapter, ns)
    assert affected, f"{src!r} redefines no exercise"
    for ex, e in grade_in(chapter, ns, affected).items():
        assert full(e), (ex, failures(e))
    assert not self_check_failures(chapter, ns, affected)


def full(e: dict) -> bool:
    return abs(e["score"] - e["max"]) < 1e-9


def failures(e: dict) -> list[tuple]:
    """(case, device, message, hint) of every failed case of one exercise."""
    return [(c.case, t.device, c.message, c.hint) for t in e["tests"] for c in t.cases if not c.passed]


def exercise_namespace(chapter: str) -> dict:
    """What the untouched exercise notebook defines (its stubs), run the way the references are
    (self-check and demo cells left out); a cell that raises is passed over, as the grader does."""
    nb = nbformat.read(REPO / "exercises" / f"{chapter}.ipynb", as_version=4)
    ns: dict = {"__name__": f"exercise_{chapter}"}
    for source in reference_cells(nb):
        try:
            exec(compile(source, f"<exercise {chapter}>", "exec"), ns)
        except Exception:
            pass
    return ns


def read_gradebook(path) -> dict:
    """The gradebook CSV's student rows (the Points Possible row left out), by the ID column (the
    student's folder unless `import` wrote an LMS id)."""
    import csv

    from autograder.report.gradebook import POINTS_POSSIBLE

    with open(path, newline="", encoding="utf-8") as f:
        return {r["ID"]: r for r in csv.DictReader(f) if r["Student"] != POINTS_POSSIBLE}

"""What a failure points to: when an exercise fails because a foundation it builds on fails,
its report says so, and points at the foundation instead of repeating its symptoms."""
from __future__ import annotations




from ..shared.contract import Chapter
from .results import CaseResult, TestResult


# The aspects a wrong prerequisite can cause in the exercise that calls it (not, e.g., its
# parameter names or its own signature); an error only where it was raised inside the prerequisite.
PREREQUISITE_ASPECTS = ("values", "nonfinite", "shape", "dtype", "device", "grads", "inplace")


def _blamed(c: CaseResult, name: str) -> bool:
    if name not in c.used:
        return False
    return c.aspect in PREREQUISITE_ASPECTS or (c.aspect == "error" and f", in {name}" in c.message)


def failing_exercises(tests: list[TestResult]) -> set[str]:
    """The exercises whose CPU test lost points: the foundations a diagnosis may blame."""
    return {t.exercise for t in tests if t.device == "cpu" and t.score < t.max_score}


def point_to_failing_foundations(chapter: Chapter, tests: list[TestResult]) -> None:
    """Where a case fails without a hint, and an exercise it builds on fails its own tests and
    was called by this case (and can cause this kind of failure), say so: the mistake is most
    likely there (e.g. SelfAttention over a wrong scaled_dot_product_attention)."""
    failing = failing_exercises(tests)
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

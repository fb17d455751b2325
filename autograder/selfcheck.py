"""The student-side check, called from each exercise's self-check cell.

    from autograder.selfcheck import check
    check("02_scaled_dot_product_attention", "scaled_dot_product_attention", scaled_dot_product_attention)

It runs a few fast cases in the student's own kernel and compares with expected outcomes stored
in `autograder/data/selfcheck.agw` (made from the reference solutions by
`python -m autograder selfcheck-data`), so it needs neither the solutions nor the grader's
hidden cases, and reveals no reference code. Failures raise `SelfCheckFailed` with the same
diagnosis the autograder gives: the first failing aspect, the largest error and where, a hint.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from . import wire
from .calls import Call, Outcome
from .compare import Mismatch, compare_meta
from .contract import CHAPTERS
from .execute import execute

DATA = Path(__file__).resolve().parent / "data" / "selfcheck.agw"


class SelfCheckFailed(AssertionError):
    """A self-check found a problem; the message is the diagnosis."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows the diagnosis alone, not a traceback into the grader's own code."""
        return str(self).splitlines()


@lru_cache(maxsize=1)
def _fixtures() -> dict:
    return wire.load(DATA)


def build_fixtures() -> dict:
    """Quick cases and the reference's outcomes for every exercise (CPU and meta device)."""
    from .cases import build_cases
    from .inputs import SELF_CHECK_SEED
    from .references import load_reference

    data = {}
    for chapter in CHAPTERS.values():
        ref = load_reference(chapter.id)
        for ex in chapter.exercises:
            entries = []
            for c in build_cases(chapter.id, ex.name, ref, seed=SELF_CHECK_SEED, quick=True):
                meta = c.on("meta", "float32")
                entries.append({"call": c.to_plain(), "expected": execute(ref, c).to_plain(),
                                "expected_meta": None if c.train else execute(ref, meta).to_plain()})
            data[f"{chapter.id}/{ex.name}"] = entries
    return data


def write_fixtures(path: Path = DATA) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    wire.save(build_fixtures(), path)


def run_checks(chapter: str, exercise: str, obj) -> list[tuple[Call, object]]:
    """(call, mismatch or None) for each quick case, the meta-device run last."""
    from .cases import compare, hint

    ex = CHAPTERS[chapter].exercise(exercise)
    namespace = {ex.target: obj}
    results = []
    entries = _fixtures()[f"{chapter}/{exercise}"]
    for entry in entries:
        c = Call.from_plain(entry["call"])
        student = execute(namespace, c)
        expected = Outcome.from_plain(entry["expected"])
        m = compare(c, student, expected)
        if m:
            m.hint = m.hint or hint(c, student, expected, m)
        elif ex.forbidden.used_in(student.forbidden):
            m = Mismatch("forbidden", f"uses {ex.forbidden.what}; this exercise asks you to write the "
                         "computation yourself (the autograder gives it zero).")
        results.append((c, m))
        if m:
            return results
    first = entries[0]
    if first["expected_meta"] is not None:
        c = Call.from_plain(first["call"]).on("meta", "float32")
        m = compare_meta(c, execute(namespace, c), Outcome.from_plain(first["expected_meta"]))
        results.append((c, m))
    return results


def check(chapter: str, exercise: str, obj, raise_on_failure: bool = True) -> bool:
    """Run the quick checks of one exercise; print a summary, and on failure raise
    SelfCheckFailed with the diagnosis (or, with raise_on_failure=False, print it and return False)."""
    results = run_checks(chapter, exercise, obj)
    failed = [(c, m) for c, m in results if m]
    if not failed:
        print(f"✓ {exercise}: {len(results)} quick checks passed "
              "(shapes, values, gradients, masks, device portability). The autograder runs more cases.")
        return True
    c, m = failed[0]
    device = " on the meta device (device-portability check)" if c.device == "meta" else ""
    lines = [f"✗ {exercise}: failed on case '{c.case}'{device}", f"  {m.message}"]
    if m.not_implemented:
        lines = [f"✗ {exercise}: not implemented yet (the stub raises NotImplementedError)."]
    elif m.hint:
        lines.append(f"  hint: {m.hint}")
    if not raise_on_failure:
        print("\n".join(lines))
        return False
    raise SelfCheckFailed("\n".join(lines)) from None

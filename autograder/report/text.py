"""The terminal report: per chapter and exercise, the score, the first failure and a hint."""
from __future__ import annotations

from ..results import SubmissionResult, TestResult


def _pts(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def exercise_lines(tests: list[TestResult]) -> list[str]:
    """Lines for one exercise (its tests on every device)."""
    score = sum(t.score for t in tests)
    max_score = sum(t.max_score for t in tests)
    mark = "✓" if score >= max_score - 1e-9 else ("✗" if score == 0 else "~")
    devices = ", ".join(f"{t.device} {t.passed}/{len(t.cases)}" for t in tests if t.cases)
    lines = [f"  {mark} {tests[0].exercise:<34} {_pts(score):>5} / {_pts(max_score):<5} {devices}"]
    notes = {t.note for t in tests if t.note}
    for note in notes:
        lines.append(f"      {note}")
    if not notes:
        shown = set()
        for t in tests:
            f = t.first_failure
            if f and f.message not in shown:
                shown.add(f.message)
                on = "" if t.device == "cpu" else f" [{t.device}, {f.dtype}]"
                lines.append(f"      first failure{on}: {f.case}")
                lines.extend(f"        {line}" for line in f.message.splitlines())
                lines.extend(f"      {h}" for h in t.hint_lines())
    for note in sorted({c.note for t in tests for c in t.cases if c.passed and c.note}):
        lines.append(f"      note: {note}")
    return lines


def render(result: SubmissionResult, verbose: bool = False) -> str:
    out = [f"Submission: {result.path}"]
    out.extend(f"  note: {n}" for n in result.notes)
    for ch in result.chapters:
        out.append("")
        where = f"  ({ch.notebook})" if ch.notebook else ""
        out.append(f"{ch.chapter}: {_pts(ch.score)} / {_pts(ch.max_score)}{where}")
        for n in ch.notes:
            if verbose or not n.startswith("sandbox:"):
                out.append(f"  note: {n}")
        by_ex: dict = {}
        for t in ch.tests:
            by_ex.setdefault(t.exercise, []).append(t)
        for tests in by_ex.values():
            out.extend(exercise_lines(tests))
    out.append("")
    sandbox = f", sandbox: {result.sandbox}" if result.sandbox else ""
    out.append(f"Total: {_pts(result.score)} / {_pts(result.max_score)}  "
               f"(graded in {result.seconds:.1f} s{sandbox})")
    return "\n".join(out)

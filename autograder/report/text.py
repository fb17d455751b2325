"""The terminal report: per chapter and exercise, the score, the first failure and a hint.

Student text in it (messages, names, file names) is shown through `untrusted_text.printable`,
and indented on every line it takes: nothing a student wrote can act on the terminal or start a
line of the report (a "Total: 13 / 13" of theirs stays inside their message).
"""
from __future__ import annotations

from ..runtime.device_check import DEVICE_CHECKS
from ..grading.results import SubmissionResult, TestResult
from .untrusted_text import printable


# What the device check of the reports is (the README's words, "Scoring"); said once per report.
META_NOTE = ("fake-cuda: the device check: your code run as if on a GPU where no GPU is present "
             "(tensors with shapes, dtypes and devices but no values, on PyTorch's meta device, held to "
             "CUDA's device rules), to catch tensors created on a fixed device, such as a CPU tensor "
             "meeting a CUDA one; it runs one case of each code path (no mask, a boolean mask, a float "
             "mask, ...) and gives its result to the others; code whose control flow needs values "
             "(`.item()`, `if t.any():`) is credited unchecked, and the case says so. It carries 20% of "
             "each exercise's points (a written answer is not run there), "
             "credited only for cases correct on the CPU (a code path that fails there is not run).")


def plural(n: int, word: str) -> str:
    """"1 case", "2 cases"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def uses_meta(result: SubmissionResult) -> bool:
    return any(t.device in DEVICE_CHECKS for ch in result.chapters for t in ch.tests)


def _pts(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _block(prefix: str, text: str) -> list[str]:
    """`text` after `prefix`, its further lines indented under its first."""
    first, *rest = printable(str(text)).splitlines() or [""]
    return [prefix + first] + [" " * max(len(prefix), 4) + line for line in rest]


def exercise_lines(tests: list[TestResult]) -> list[str]:
    """Lines for one exercise (its tests on every device)."""
    score = sum(t.exact_score for t in tests)
    max_score = sum(t.max_score for t in tests)
    mark = "✓" if score >= max_score - 1e-9 else ("✗" if score == 0 else "~")
    devices = ", ".join(f"{t.device} {t.passed}/{len(t.cases)}" for t in tests if t.cases)
    lines = [f"  {mark} {tests[0].exercise:<34} {_pts(score):>5} / {_pts(max_score):<5} {devices}"]
    notes = {t.note for t in tests if t.note}
    for note in notes:
        lines.extend(_block("      ", note))
    if not notes:
        shown = set()
        for t in tests:
            f = t.first_failure
            if f and f.message not in shown:
                shown.add(f.message)
                on = "" if t.device == "cpu" else f" [{t.device}, {f.dtype}]"
                lines.extend(_block(f"      first failure{on}: ", f.case))
                lines.extend(_block("        ", f.message))
                for h in t.hint_lines():
                    lines.extend(_block("      ", h))
    for note in sorted({c.note for t in tests for c in t.cases if c.passed and c.note}):
        lines.extend(_block("      note: ", note))
    return lines


def render(result: SubmissionResult, verbose: bool = False) -> str:
    out = _block("Submission: ", result.path)
    for n in result.notes:
        out.extend(_block("  note: ", n))
    for ch in result.chapters:
        out.append("")
        where = f"  ({ch.notebook})" if ch.notebook else ""
        out.extend(_block("", f"{ch.chapter}: {_pts(ch.score)} / {_pts(ch.max_score)}{where}"))
        for n in ch.notes:
            if verbose or not n.startswith("sandbox:"):
                out.extend(_block("  note: ", n))
        by_ex: dict = {}
        for t in ch.tests:
            by_ex.setdefault(t.exercise, []).append(t)
        for tests in by_ex.values():
            out.extend(exercise_lines(tests))
    out.append("")
    if uses_meta(result):
        out.append(META_NOTE)
    sandbox = f", sandbox: {result.sandbox}" if result.sandbox else ""
    out.append(f"Total: {_pts(result.score)} / {_pts(result.max_score)}  "
               f"(graded in {result.seconds:.1f} s{sandbox})")
    return printable("\n".join(out))

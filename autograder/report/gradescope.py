"""Gradescope's results.json: a score summary first, one test per (chapter, exercise, device).

What the student sees (the top-level `output`, each test's `output`): the score and each
chapter's (a chapter not handed in at zero, with the reason), then the notes about their
notebooks. What only the instructor sees: the sandbox's notes (how the code was isolated, said
once, not per chapter) and the flags (forbidden-API uses, timeouts), in `instructor_output`,
which `integrations.gradescope.run` prints to the autograder's stdout (`stdout_visibility`
hidden). A hidden test would hide the student's total too, so none is used for them.

With `hide_answers`, the written answers' tests are `after_published`: their results (and the
total, which Gradescope then hides as well) are shown when the instructor publishes the grades,
so resubmitting cannot narrow an answer down; the summary counts them out and says so.

Every string goes through `untrusted_text.printable`: Gradescope shows them to the student and
the instructor, and student text may hold control characters."""
from __future__ import annotations

import json
from pathlib import Path

from ..shared.contract import CHAPTERS
from ..grading.results import SubmissionResult
from .untrusted_text import printable
from . import flags
from .text import _pts, exercise_lines


def is_sandbox_note(note: str) -> bool:
    """A note on how the code was isolated (the same for every chapter), not on the notebook."""
    from ..sandbox.modes import CONTAINER_NOTE, FALLBACK_WARNING

    return note.lower().startswith("sandbox:") or note == CONTAINER_NOTE or FALLBACK_WARNING in note


def _answer(exercise_chapter: str, exercise: str) -> bool:
    ch = CHAPTERS.get(exercise_chapter)
    try:
        return ch is not None and ch.exercise(exercise).task.value
    except Exception:
        return False


def summary(result: SubmissionResult, hide_answers: bool = False) -> str:
    """The score, then each chapter's, then the notes on the student's notebooks."""
    def counted(tests):
        return [t for t in tests if not (hide_answers and _answer(t.chapter, t.exercise))]

    chapters = [(ch, counted(ch.tests)) for ch in result.chapters]
    score = sum(t.exact_score for _, ts in chapters for t in ts)
    most = sum(t.max_score for _, ts in chapters for t in ts)
    lines = [f"Score: {_pts(score)} / {_pts(most)}"
             + (" (written answers not counted here: their results are shown when grades are published)"
                if hide_answers and any(len(ts) < len(ch.tests) for ch, ts in chapters) else "")]
    width = max((len(ch.chapter) for ch, _ in chapters), default=0)
    for ch, ts in chapters:
        why = ("not handed in (no notebook submitted)" if ch.notebook is None
               else f"not graded: {ch.not_graded}" if ch.not_graded else "")
        line = f"  {ch.chapter:<{width}}  {_pts(sum(t.exact_score for t in ts)):>5} / {_pts(sum(t.max_score for t in ts))}"
        lines.append(line + (f"  {why}" if why else ""))
    notes = list(result.notes) + [f"{ch.chapter}: {n}" for ch in result.chapters for n in ch.notes
                                  if not is_sandbox_note(n)]
    if notes:
        lines += ["", "Notes:"] + [f"  {n}" for n in notes]
    return "\n".join(lines)


def instructor_output(result: SubmissionResult) -> str:
    """The sandbox's notes, each once, and the flags: for the instructor only."""
    seen: list[str] = []
    for n in [*result.notes, *(n for ch in result.chapters for n in ch.notes)]:
        if is_sandbox_note(n) and n not in seen:
            seen.append(n)
    lines = [f"sandbox: {result.sandbox}"] if result.sandbox and not any(s.startswith("sandbox:") for s in seen) else []
    lines += seen + [f"{kind}: {text}" for kind, text in flags.run_flags(result)]
    return "\n".join(lines)


def results_json(result: SubmissionResult, hide_answers: bool = False) -> dict:
    tests = []
    for ci, ch in enumerate(result.chapters, 1):
        for ti, t in enumerate(ch.tests, 1):
            lines = exercise_lines([t])[1:]
            detail = [f"{c.case}: {('passed' + (f' ({c.note})' if c.note else '')) if c.passed else c.message}"
                      for c in t.cases]
            output = "\n".join([l.strip() for l in lines] + ([""] if lines else []) + detail)
            hidden = hide_answers and _answer(t.chapter, t.exercise)
            tests.append({
                "name": f"{ch.chapter} / {t.exercise} ({t.device})",
                "number": f"{ci}.{ti}",
                "score": t.exact_score,
                "max_score": t.max_score,
                "status": "passed" if t.exact_score >= t.max_score - 1e-9 else "failed",
                "output": output or "passed",
                "visibility": "after_published" if hidden else "visible",
                "extra_data": {"chapter": t.chapter, "exercise": t.exercise, "device": t.device},
            })
    return _printable({
        "score": result.score,
        "execution_time": round(result.seconds, 2),
        "output": summary(result, hide_answers),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    })


def _printable(x):
    if isinstance(x, str):
        return printable(x)
    if isinstance(x, dict):
        return {_printable(k): _printable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_printable(v) for v in x]
    return x


def write(result: SubmissionResult, path, hide_answers: bool = False) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results_json(result, hide_answers), indent=2))

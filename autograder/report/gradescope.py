"""Gradescope's results.json: one test per (chapter, exercise, device), with extra_data.

Every string in it goes through `untrusted_text.printable`: Gradescope shows them to the student
and the instructor, and student text may hold control characters."""
from __future__ import annotations

import json
from pathlib import Path

from ..results import SubmissionResult
from ..untrusted_text import printable
from .text import exercise_lines


def results_json(result: SubmissionResult) -> dict:
    tests = []
    for ci, ch in enumerate(result.chapters, 1):
        for ti, t in enumerate(ch.tests, 1):
            lines = exercise_lines([t])[1:]
            detail = [f"{c.case}: {('passed' + (f' ({c.note})' if c.note else '')) if c.passed else c.message}"
                      for c in t.cases]
            output = "\n".join([l.strip() for l in lines] + ([""] if lines else []) + detail)
            tests.append({
                "name": f"{ch.chapter} / {t.exercise} ({t.device})",
                "number": f"{ci}.{ti}",
                "score": t.score,
                "max_score": t.max_score,
                "status": "passed" if t.score >= t.max_score - 1e-9 else "failed",
                "output": output or "passed",
                "visibility": "visible",
                "extra_data": {"chapter": t.chapter, "exercise": t.exercise, "device": t.device},
            })
    notes = list(result.notes) + [f"{ch.chapter}: {n}" for ch in result.chapters for n in ch.notes]
    return _printable({
        "score": round(result.score, 4),
        "execution_time": round(result.seconds, 2),
        "output": "\n".join(notes),
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


def write(result: SubmissionResult, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results_json(result), indent=2))

"""The self-check's data (`autograder/data/selfcheck.agw`), built here, on the instructor's side,
from the reference solutions, the quick cases and the mistake models:
`python -m autograder selfcheck-data`.

For each exercise, its quick cases (public seed) and for each: the reference's outcome (CPU, and
the first case's meta-device variant as the grader runs it), and what the hint engine needs of the
mistake models there: each applicable mistake's hint and prediction, the mistake-free model's
prediction, a find-the-bug exercise's bug prediction and symptom in words (never its fix), and
what chapter 8's dropout properties compare with (`dropout_probe`). The models themselves, working
re-implementations of the exercises, stay here: the student package gets their outputs on these
public inputs only. Of a written answer, only its form."""
from __future__ import annotations

import dataclasses

from ..shared import wire
from ..shared.calls import Call, Outcome
from ..shared.contract import CHAPTERS
from ..runtime.device_check import FAKE_CUDA
from ..runtime.execute import at_float32, execute
from ..selfcheck import DATA
from ..selfcheck.hint_engine import predict, prediction_to_plain
from . import chapter_module, _spec, build_cases
from .inputs import SELF_CHECK_SEED
from .other_kinds import _symptom, symptoms_only
from .written_answers import form


def build_fixtures() -> dict:
    """Quick cases, the reference's outcomes and the stored hint data for every exercise."""
    from ..grading.variants import variants
    from ..references.solutions import load_reference

    data = {}
    for chapter in CHAPTERS.values():
        ref = load_reference(chapter.id)
        for ex in chapter.exercises:
            cases = build_cases(chapter.id, ex.name, ref, seed=SELF_CHECK_SEED, quick=True)
            if ex.task.value:  # never the value: the shape asked for, nothing a loop could invert
                data[f"{chapter.id}/{ex.name}"] = [
                    {"call": c.to_plain(), "expected": form(execute(ref, c)).to_plain(), "expected_meta": None}
                    for c in cases]
                continue
            meta = dict(variants(cases[:1], FAKE_CUDA))  # the device check, as the grader's
            data[f"{chapter.id}/{ex.name}"] = [_entry(ref, c, meta.get(i)) for i, c in enumerate(cases)]
    return data


def _entry(ref: dict, c: Call, meta: Call | None) -> dict:
    expected = execute(ref, c)
    expected.at_float32 = None if expected.error else at_float32(ref, c)
    entry = {"call": c.to_plain(), "expected": expected.to_plain(),
             "expected_meta": execute(ref, meta).to_plain() if meta else None,
             "hints": stored_hints(c, expected)}
    if meta:
        entry["hints_meta"] = stored_hints(meta, expected)
    probe = getattr(chapter_module(c.chapter), "dropout_probe", lambda call: None)(c)
    if probe is not None:
        entry["probe"] = probe
    return entry


def stored_hints(c: Call, expected: Outcome) -> dict | None:
    """What the hint engine needs of the exercise's mistake models on call `c` (see the module's
    docstring); None where the exercise has no hints."""
    spec, extra = _spec(c)
    if spec is None:
        return None
    mistakes = spec.mistakes(c) if callable(spec.mistakes) else spec.mistakes
    return {
        "extra": extra,
        "mistakes": [[m.hint, prediction_to_plain(predict(m.model, c))]
                     for m in mistakes if m.when is None or m.when(c)],
        "correct": prediction_to_plain(predict(spec.correct, c)) if spec.correct is not None else None,
        "bugs": _stored_bugs(spec, c, expected),
        "weights_right": spec.weights_right, "fully_masked": spec.fully_masked,
    }


def _stored_bugs(spec, c: Call, expected: Outcome) -> list:
    """A find-the-bug exercise's bugs on `c`: each one's prediction, and its symptom (no fix), in
    words, as the self-check would say it of code that returns just that prediction."""
    stored = []
    for bug in getattr(spec.explain, "bugs", ()):
        prediction = predict(bug.model, c)
        text = None
        if prediction[0] == "ok" and not expected.error:
            try:
                with symptoms_only():
                    text = _symptom(bug, c, dataclasses.replace(expected, outputs=prediction[1]), expected)
            except Exception:  # the symptom does not apply to this call: no hint, as in the grader
                pass
        stored.append([prediction_to_plain(prediction), text])
    return stored


def write_fixtures(path=DATA) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    wire.save(build_fixtures(), path)

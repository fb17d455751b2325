"""The one hint engine that names likely mistakes, shared by the grader and the self-check.

A mistake model (`Mistake`) gives the outputs one named mistake produces on a call's inputs. The
grader's models are plain-torch re-implementations and stay with the instructor
(`autograder/cases/`); the student package gets, for each of its quick cases, only what those
models predicted there (`Stored`, built by `cases/selfcheck_data.py`). `hint` gives the hint of
the mistake that explains what the student returned, by one rule for every chapter (`explains`)
and one tolerance policy (`hint_tolerance`); see `model_hint`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from ..shared.calls import Call, Outcome

@dataclass(frozen=True)
class Mistake:
    """One named mistake: `model(call)` gives the outputs that mistake produces on the call's
    inputs (a tensor, or a list with None for outputs it does not predict), or raises as the
    mistake would; `when(call)` says whether the mistake is looked for on this call."""

    hint: str
    model: Callable
    when: Callable | None = None


@dataclass(frozen=True)
class Hints:
    """What a chapter declares about one exercise's likely mistakes.

    correct: the mistake-free model; when given, models are trusted only on calls where it
        reproduces the reference.
    explain: (call, student, expected, mismatch) -> hint or None, for what models cannot show
        (parameter names, dtype, device, a missing ValueError, shape errors with batch axes).
    weights_right: the hint when output 0 differs but output 1 (the weights) is right.
    fully_masked: the hint for NaN on a query whose keys are all masked, in the exercise's own
        terms (else FULLY_MASKED_NAN).
    """

    mistakes: tuple | Callable = ()  # the Mistakes, or a function of the call that lists them
    correct: Callable | None = None
    explain: Callable | None = None
    weights_right: str | None = None
    fully_masked: str | None = None  # the chapter's words for NaN on a fully masked query (FULLY_MASKED_NAN)


def with_spec(explain: Callable) -> Callable:
    """Marks an `explain` that takes the exercise's Hints as a fifth argument, to ask whether a
    mistake model explains the outcome (`model_hint`): the grader's spec runs the models, the
    self-check's has their stored predictions."""
    explain.with_spec = True
    return explain


@dataclass(frozen=True)
class Stored:
    """A model's prediction on one call, computed where the model is (the grader) and kept as
    data: ("ok", [outputs]) or ("error", key), as `predict` gives it."""

    prediction: tuple


NO_HINT_ASPECTS = ("missing", "timeout", "crash", "grader", "forbidden")
MODEL_ASPECTS = ("values", "nonfinite", "shape", "error")


def hint_tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for recognising a mistake: models run in float64, and a mistake changes
    values at O(1), so one loose tolerance serves every chapter."""
    return {"float16": (2e-2, 2e-2), "bfloat16": (1e-1, 1e-1), EXACT: (1e-8, 1e-10)}.get(dtype, (1e-3, 1e-5))


EXACT = "float64-exact"  # a pseudo-dtype for hint_tolerance: models matched at float64's accuracy


def hint(spec: Hints | None, extra: bool, call: Call, student: Outcome, expected: Outcome, mismatch) -> str | None:
    """The hint for a failing case, or None; `spec`: the exercise's hints, `extra`: an exercise of
    another kind (predict, find the bug), which gets no convention hint. Never raises (a hint is
    a courtesy)."""
    if mismatch.not_implemented or mismatch.aspect in NO_HINT_ASPECTS:
        return None  # a stub, or not the code's values: any hint about the behaviour would mislead
    try:
        if extra:
            return exercise_hint(spec, call, student, expected, mismatch)
        return (spec and exercise_hint(spec, call, student, expected, mismatch)) \
            or convention_hint(call, student, expected, mismatch)
    except Exception:
        return None


_UNEXPECTED_KEYWORD = re.compile(r"got an unexpected keyword argument '(\w+)'")
_LIST_INDEX = re.compile(r"\.\d+\.")


def convention_hint(call: Call, student: Outcome, expected: Outcome, mismatch) -> str | None:
    """Hints for ported code that clashes with the contract's conventions the same way in
    every chapter: a keyword named differently, a layer list instead of named layers, an
    extra leading axis of size 1."""
    if mismatch.aspect == "error" and student.error and student.error.get("type") == "TypeError":
        m = _UNEXPECTED_KEYWORD.search(student.error.get("message", ""))
        if m and (m.group(1) in call.kwargs or m.group(1) in (call.init or {})):
            return (f"the grader passes `{m.group(1)}=` by keyword, as the contract names it: call the "
                    f"parameter `{m.group(1)}` in your signature (e.g. not `attn_mask` for `mask`)")
    if mismatch.aspect == "params" and student.params and expected.params:
        listed = sorted(n for n in student.params if _LIST_INDEX.search("." + n) and n not in expected.params)
        if listed and not any(_LIST_INDEX.search("." + n) for n in expected.params):
            layers = sorted({n.rsplit(".", 1)[0] for n in expected.params if "." in n})
            return (f"the layers are kept in a list ({listed[0]}, ...): the grader loads the reference weights "
                    f"by name, so make each layer its own attribute with the contract's name: "
                    f"{', '.join(layers)}")
    if mismatch.aspect == "shape" and mismatch.output is not None and mismatch.output < len(student.meta):
        got = student.meta[mismatch.output].get("shape")
        want = expected.meta[mismatch.output].get("shape") if mismatch.output < len(expected.meta) else None
        if got and want is not None and got == [1] + want:
            return ("the result has an extra leading axis of size 1 (unsqueeze(0), or a shape like (1, L, L)): "
                    "return the contract's shape without it; a caller adds batch axes where it needs them")
    return None


def exercise_hint(spec: Hints, call: Call, student: Outcome, expected: Outcome, mismatch) -> str | None:
    if spec.explain:
        if getattr(spec.explain, "with_spec", False):  # it asks the models too (`with_spec`)
            text = spec.explain(call, student, expected, mismatch, spec)
        else:
            text = spec.explain(call, student, expected, mismatch)
        if text:
            return text
    if mismatch.aspect not in MODEL_ASPECTS:
        return None
    if _nonfinite_where_finite(student, expected, mismatch.output) is not None:
        return nonfinite_hint(spec, call, student, expected, mismatch.output)
    text = model_hint(spec, call, student, expected, shapes_only=mismatch.aspect == "shape")
    if text:
        return text
    if (spec.weights_right and mismatch.output == 0 and len(student.outputs) > 1 and len(expected.outputs) > 1
            and matches(student.outputs[1], expected.outputs[1], call.dtype)):
        return spec.weights_right
    return None


def model_hint(spec: Hints, call: Call, student: Outcome, expected: Outcome, shapes_only: bool = False,
               dtype: str | None = None):
    """The hint of the one mistake (by distinct hint text) that explains the student's outcome
    and not the reference's; None when none or several do, or when the mistake-free model does
    not reproduce the reference on this call. `dtype`: the tolerance (default the call's)."""
    dtype = dtype or call.dtype
    if spec.correct is not None and not explains(predict(spec.correct, call), expected, dtype):
        return None
    found = set()
    mistakes = spec.mistakes(call) if callable(spec.mistakes) else spec.mistakes
    for m in mistakes:
        if m.when is not None and not m.when(call):
            continue
        prediction = predict(m.model, call)
        if (explains(prediction, student, dtype, shapes_only)
                and not explains(prediction, expected, dtype, shapes_only)):
            found.add(m.hint)
    return found.pop() if len(found) == 1 else None


def small_difference_hint(spec: Hints | None, extra: bool, call: Call, student: Outcome,
                          expected: Outcome) -> str | None:
    """A float64 case whose outputs matched only at float32's accuracy (yet not the reference's
    own float32 run) and whose gradient is off: the mistake model that explains the outputs at
    float64's accuracy, where a small mistake shows (a tanh GELU is within 1e-4 of the exact
    one, inside float32's tolerance: at the usual hint tolerance it explains the reference too)."""
    try:
        if call.dtype != "float64" or extra:
            return None
        return spec and model_hint(spec, call, student, expected, dtype=EXACT)
    except Exception:  # a hint is a courtesy: never an error of the grader
        return None



def bug_hint(bugs, call: Call, student: Outcome, expected: Outcome, mismatch) -> str | None:
    """A find-the-bug exercise's hint: `bugs` lists (prediction, symptom) per known bug, the
    bug's `predict` on this call and symptom(student, expected) -> words. The symptom of the
    first bug that shows on this call (its prediction is not the reference's) and that explains
    the student's outputs (NaN and inf by where)."""
    if mismatch.aspect not in ("values", "nonfinite"):
        return None
    for prediction, symptom in bugs:
        if explains(prediction, expected, call.dtype):
            continue  # the bug does not show on this call
        if explains(prediction, student, call.dtype) or _same_nonfinite(prediction, student, call.dtype):
            return symptom(student, expected)
    return None

_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
                        r"at non-singleton dimension (\d+)")


def _error_key(message: str):
    """A broadcasting error, regardless of the operands' order (None for any other error)."""
    m = _BROADCAST.search(message or "")
    return (frozenset(m.group(1, 2)), m.group(3)) if m else None


def predict(model: Callable, call: Call) -> tuple:
    """("ok", [outputs]) or ("error", key) for one model on one call (a `Stored` one: as stored)."""
    if isinstance(model, Stored):
        return model.prediction
    try:
        with torch.no_grad():
            out = model(call)
    except RuntimeError as e:
        return "error", _error_key(str(e))
    except Exception:
        return "error", None
    return "ok", list(out) if isinstance(out, (list, tuple)) else [out]


def prediction_to_plain(prediction: tuple) -> dict:
    """A `predict` result as data the wire format holds (for the self-check's data)."""
    kind, value = prediction
    if kind == "ok":
        return {"ok": [None if t is None else t.detach().clone() for t in value]}
    return {"error": None if value is None else [sorted(value[0]), value[1]]}


def prediction_from_plain(plain: dict) -> tuple:
    if "ok" in plain:
        return "ok", list(plain["ok"])
    key = plain["error"]
    return "error", None if key is None else (frozenset(key[0]), key[1])


def explains(prediction: tuple, outcome: Outcome, dtype: str, shapes_only: bool = False) -> bool:
    """The matching rule: whether a model's prediction is what `outcome` holds."""
    kind, value = prediction
    if outcome.error:
        key = _error_key(outcome.error.get("message", ""))
        return kind == "error" and key is not None and key == value
    if kind != "ok" or len(value) > len(outcome.outputs) or all(v is None for v in value):
        return False
    for got, want in zip(outcome.outputs, value):
        if want is None:
            continue
        if got is None or tuple(got.shape) != tuple(want.shape):
            return False
        if not shapes_only and not matches(got, want, dtype):
            return False
    return True


def matches(got, want, dtype: str = "float64") -> bool:
    """Whether tensor `got` equals a model's `want` within the hint tolerance. NaN never
    matches, on either side: NaN equal to NaN is no evidence of a mistake (a model that gives
    NaN would "explain" any output that is NaN for another reason, and NaN weights would pass
    for zero ones). A NaN or inf the reference does not have is diagnosed by where it is
    (`nonfinite_hint`)."""
    if got is None or want is None or tuple(got.shape) != tuple(want.shape):
        return False
    got, want = got.double(), want.double()
    if torch.isnan(got).any() or torch.isnan(want).any():
        return False
    rtol, atol = hint_tolerance(dtype)
    return torch.allclose(got, want, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- NaN and inf
FULLY_MASKED_NAN = ("a query whose keys are all masked gives NaN (the softmax of a row of -inf is 0/0): give such "
                    "rows zero weights and a zero output: dead = torch.isneginf(scores).all(-1, keepdim=True); "
                    "weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)")
KEPT_KEYS_NAN = ("NaN or inf where the reference is finite, on queries that have keys left: look for 0 * inf (e.g. "
                 "(mask == 0) * -inf is NaN wherever the mask keeps a key: use masked_fill or torch.where) or "
                 "-inf - (-inf)")
OVERFLOW_NAN = ("a NaN or inf where the reference is finite, on a case with no fully masked query: an exp that "
                "overflows on large scores (subtract each row's maximum before exp, as torch.softmax does), or "
                "a division by a sum that is 0")
_MASK_NAMES = ("mask", "attention_mask")


def _nonfinite_where_finite(student: Outcome, expected: Outcome, i) -> torch.Tensor | None:
    """Where output `i` is NaN or inf and the reference's is not the same (None when nowhere)."""
    if i is None or i >= len(student.outputs) or i >= len(expected.outputs):
        return None
    got, want = student.outputs[i], expected.outputs[i]
    if got is None or want is None or tuple(got.shape) != tuple(want.shape) or not got.is_floating_point():
        return None
    got, want = got.double(), want.double()
    bad = ~torch.isfinite(got) & ~(torch.isinf(got) & (got == want))
    return bad if bool(bad.any()) else None


def _dead_queries(call: Call) -> torch.Tensor | None:
    """The call's mask's queries with no key left, (..., L_q) (None without a mask). `mask` is
    boolean (False: masked) or additive (-inf: masked); AlphaFold's `attention_mask` is a
    keep-mask of 0 and 1 whatever its dtype."""
    for name in _MASK_NAMES:
        m = call.kwargs.get(name)
        if isinstance(m, torch.Tensor) and m.dim() >= 1:
            if m.dtype == torch.bool:
                dead = ~m
            elif name == "mask" and m.is_floating_point():
                dead = torch.isneginf(m)
            else:
                dead = m == 0
            return dead.all(-1)
    return None


def _rows_aligned(dead: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """`dead` (..., L_q) broadcast to an output's rows (..., L_q), dropping the mask's axes of size
    1 that the output lacks (a head axis); None where they do not line up."""
    while dead.dim() > rows.dim() and 1 in dead.shape[:-1]:
        inner = max(j for j, n in enumerate(dead.shape[:-1]) if n == 1)  # the head axis, next to L_q
        dead = dead.squeeze(inner)
    try:
        return torch.broadcast_to(dead, rows.shape)
    except RuntimeError:
        return None


def _same_nonfinite(prediction: tuple, outcome: Outcome, dtype: str) -> bool:
    """Whether a model that gives NaN or inf predicts `outcome` by where: in every output it
    predicts, the same entries are not finite and the finite ones match."""
    kind, value = prediction
    if kind != "ok" or len(value) > len(outcome.outputs):
        return False
    nonfinite = False
    for got, want in zip(outcome.outputs, value):
        if want is None:
            continue
        if got is None or tuple(got.shape) != tuple(want.shape) or not want.is_floating_point():
            return False
        got, want = got.double(), want.double()
        finite = torch.isfinite(want)
        if not bool((finite == torch.isfinite(got)).all()) or not matches(got[finite], want[finite], dtype):
            return False
        nonfinite |= not bool(finite.all())
    return nonfinite


def nonfinite_hint(spec: Hints, call: Call, student: Outcome, expected: Outcome, i: int) -> str | None:
    """NaN or inf in output `i` where the reference is finite, diagnosed before any value hint.
    First the chapter's own mistake models that give NaN or inf, by where: one explains the
    output only if its non-finite entries are exactly the student's and the rest matches; then
    where, against the call's mask: only on queries with no key left (0/0), also on queries
    that have keys (0 * -inf), or no mask at all (an exp that overflows)."""
    if spec.correct is None or explains(predict(spec.correct, call), expected, call.dtype):
        found = set()
        mistakes = spec.mistakes(call) if callable(spec.mistakes) else spec.mistakes
        for m in mistakes:
            if m.when is None or m.when(call):
                if _same_nonfinite(predict(m.model, call), student, call.dtype):
                    found.add(m.hint)
        if len(found) == 1:
            return found.pop()
    bad, dead = _nonfinite_where_finite(student, expected, i), _dead_queries(call)
    if dead is None:
        return OVERFLOW_NAN
    # the output's query rows: a vector per query (..., L_q, d), or one value per query (lse)
    L_q = dead.shape[-1]
    if bad.dim() >= 2 and L_q in (1, bad.shape[-2]):
        rows = bad.any(-1)
    elif bad.dim() >= 1 and bad.shape[-1] == L_q:
        rows = bad
    else:
        return None
    aligned = _rows_aligned(dead, rows)
    if aligned is None:
        return None  # the output's axes do not line up with the mask's queries: no guess
    fully_masked = spec.fully_masked or FULLY_MASKED_NAN
    if not (bool(aligned.any()) and bool(rows[aligned].all())):
        return KEPT_KEYS_NAN  # a query with no key left came out right: the NaN is elsewhere
    if bool((rows & ~aligned).any()):  # NaN on every kind of query: either cause (or both)
        return f"{fully_masked}; or, if that is handled, {KEPT_KEYS_NAN[0].lower()}{KEPT_KEYS_NAN[1:]}"
    return fully_masked


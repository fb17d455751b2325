"""Compare a student's Outcome with the reference's: pure functions returning a Mismatch.

Checks run in a fixed order and stop at the first failing aspect, so the message names the
first thing to fix: error / presence, parameters, return structure, shape, dtype, device,
NaN/inf, values, gradients, inputs modified in place.

Tolerance policy (per dtype of the compared tensors, both computed in that dtype on that device):
    float64   rtol 1e-6, atol 1e-8   (CPU grading runs in float64: bugs cannot hide in rounding)
    float32   rtol 1e-4, atol 1e-5
    float16   rtol 1e-2, atol 1e-2
    bfloat16  rtol 5e-2, atol 5e-2
Integer and boolean outputs must match exactly.

Float32 rounding in a float64 case is not a mistake: a float64 result (an output or a gradient)
outside the float64 tolerance but within the float32 one passes, with the note FLOAT32_NOTE
(every exercise alike), whether measured against the float64 reference or against the reference
run in float32 on the same inputs (Outcome.at_float32: where a case's inputs amplify rounding,
e.g. a saturated softmax, float32 itself lands that far from float64).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..shared.calls import Call, ErrorKind, Outcome
from ..runtime.device_check import FAKE_CUDA

TOLERANCES = {
    "float64": (1e-6, 1e-8),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


NOT_IMPLEMENTED = "not implemented yet"
# A float64 case whose outputs matched only at float32 accuracy, then failed on a gradient (beyond
# float32's own run too: so not float32 rounding alone), and no mistake model names the difference.
PRECISION_HINT = ("the outputs match the reference only to about 1e-4, and this gradient is off by more than float32 "
                  "rounding gives here: a step differs slightly from the contract's (an approximation, such as "
                  "GELU's tanh form; another epsilon or constant), or runs at a lower precision than the inputs "
                  "(.half(), a float32 step that these inputs amplify beyond float32 itself). Follow the "
                  "contract's formulas exactly, in the inputs' dtype")
FLOAT32_NOTE = ("computed in float32: the result matches at float32 accuracy, not float64's "
                "(full marks; compute in the inputs' dtype to match exactly)")


@dataclass
class Mismatch:
    """The first failing aspect of one case, in words, with the numbers behind it."""

    aspect: str
    message: str
    output: int | None = None        # which returned tensor (0 = output, 1 = weights)
    max_abs: float | None = None
    max_rel: float | None = None
    where: list | None = None        # index of the largest error
    hint: str | None = None
    not_implemented: bool = False    # the code is still the exercise stub (NotImplementedError)

    def to_plain(self) -> dict:
        return dict(self.__dict__)

    @property
    def about_shapes(self) -> bool:
        """Whether this is an error raised over shapes or dimensions (not NotImplementedError etc.)."""
        words = ("size", "shape", "dimension", "mat1", "expand", "broadcast", "out of range")
        return self.aspect == "error" and any(w in self.message.split("\n")[0] for w in words)


def _output_name(i: int, n: int, call: Call | None = None) -> str:
    """Returned tensor `i` of `n`, as the contract names it (Exercise.outputs: "lse", "the
    logits", ...), else "the output" and "the weights" of an attention pair."""
    named = _contract_outputs(call)
    if i < len(named):
        return named[i]
    if n == 1:
        return "the result"
    if n == 2:
        return ("the output", "the weights")[i]
    return f"returned value #{i + 1}"


def _contract_outputs(call: Call | None) -> tuple:
    from ..shared.contract import CHAPTERS

    try:
        return CHAPTERS[call.chapter].exercise(call.exercise).outputs if call is not None else ()
    except KeyError:
        return ()


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def value_error(actual: torch.Tensor, expected: torch.Tensor, dtype: str) -> tuple | None:
    """(max_abs, max_rel, where) if `actual` is outside the tolerance of `expected`, else None."""
    if expected.dtype == torch.bool or not expected.is_floating_point():
        bad = actual.to(expected.dtype) != expected
        if not bad.any():
            return None
        idx = torch.nonzero(bad)[0].tolist()
        return (1.0, None, idx)
    rtol, atol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    a = actual.to(torch.float64)
    e = expected.to(torch.float64)
    # Most values are right: one isclose (the same rule: NaN matches NaN, an infinity only the
    # same infinity) instead of the dozen ops that say where a wrong one is wrong.
    if bool(torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True).all()):
        return None
    both_nan = torch.isnan(a) & torch.isnan(e)
    same_inf = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
    diff = torch.where(both_nan | same_inf, torch.zeros_like(a), (a - e).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    bad = diff > atol + rtol * torch.nan_to_num(e.abs(), posinf=0.0)
    if not bad.any():
        return None
    flat = int(torch.argmax(torch.where(bad, diff, torch.full_like(diff, -1.0))))
    idx = list(torch.unravel_index(torch.tensor(flat), diff.shape)) if diff.dim() else []
    idx = [int(i) for i in idx]
    max_abs = float(diff[bad].max())
    # the relative error where the absolute one is largest (None where the expected value is 0)
    at = tuple(idx)
    rel = float(diff[at] / e[at].abs()) if float(e[at]) != 0 else None
    return max_abs, rel, idx


def _values(i, n, a: torch.Tensor, e: torch.Tensor, dtype: str, what: str, notes: list | None,
            at_float32: torch.Tensor | None = None, call: Call | None = None) -> Mismatch | None:
    err = value_error(a, e, dtype)
    if err is None:
        return None
    # float32 rounding in a float64 case is no mistake: within float32's tolerance of the float64
    # reference, or of the reference itself run in float32 on the same inputs (`at_float32`:
    # inputs that amplify rounding, a saturated softmax, move both alike)
    if dtype == "float64" and (value_error(a, e, "float32") is None or (
            isinstance(at_float32, torch.Tensor) and at_float32.shape == e.shape
            and value_error(a, at_float32, "float32") is None)):
        if notes is not None and FLOAT32_NOTE not in notes:
            notes.append(FLOAT32_NOTE)
        return None
    max_abs, max_rel, where = err
    name = _output_name(i, n, call) if what == "value" else what
    got = a[tuple(where)].item() if where or a.dim() == 0 else None
    want = e[tuple(where)].item() if where or e.dim() == 0 else None
    at = f" at index {tuple(where)}" if where else ""
    detail = f" (got {got:.6g}, expected {want:.6g})" if isinstance(got, float) and isinstance(want, float) else ""
    if not e.is_floating_point():  # bool or integer: no sizes of error, just where it differs
        detail = f" (got {got}, expected {want})"
        return Mismatch("values" if what == "value" else "grads",
                        f"{name} differs from the reference{at}{detail}.", output=i if what == "value" else None,
                        where=where)
    relative = f", relative {max_rel:.3g}" if max_rel is not None else ""
    return Mismatch("values" if what == "value" else "grads",
                    f"{name} differs from the reference: largest absolute error {max_abs:.3g}{at}"
                    f"{detail}{relative}.", output=i if what == "value" else None,
                    max_abs=max_abs, max_rel=max_rel, where=where)


def compare(call: Call, student: Outcome, expected: Outcome, notes: list | None = None) -> Mismatch | None:
    """The first way in which `student` differs from `expected` for this call, or None.
    A pass that needed the float32-rounding allowance appends FLOAT32_NOTE to `notes`."""
    if call.expect_error:
        return _expected_error(call, student.error)
    m = _error_mismatch(call, student.error, expected)
    if m:
        return m
    if expected.params is not None:
        m = _compare_params(student, expected)
        if m:
            return m
    if student.returned != expected.returned:
        return Mismatch("returned", f"returned {student.returned or 'nothing'}, expected {expected.returned}.")
    return (structure(student, expected, call)
            or _meta_mismatch(call, student, expected)
            or _outputs_mismatch(call, student, expected, notes)
            or _grads_mismatch(call, student, expected, notes)
            or _inplace_mismatch(student))


def _not_implemented(call: Call) -> Mismatch:
    return Mismatch("error", f"{NOT_IMPLEMENTED}: `{call.target}` still raises NotImplementedError.",
                    not_implemented=True)


def _expected_error(call: Call, err: dict | None) -> Mismatch | None:
    """The verdict on a call that must raise `call.expect_error`: None when the student's own
    code raised it, else why not."""
    kind = ErrorKind.of(err)
    if err and call.expect_error in err.get("mro", [err.get("type")]):
        if not err.get("where"):  # the student's own code must have raised it
            return Mismatch("expected-error", f"this call must raise {call.expect_error} with a `raise` "
                            "statement of your own code, but no such statement of the notebook raised it.")
        return None
    if kind:
        return Mismatch(kind.aspect, err["message"])
    if err and err["type"] == "NotImplementedError":
        return _not_implemented(call)  # a stub: the hint about the required error would mislead
    got = f"it raised {err['type']}: {err['message']}" if err else "it returned normally"
    return Mismatch("expected-error", f"this call must raise {call.expect_error}, but {got}.")


def _error_mismatch(call: Call, err: dict | None, expected: Outcome) -> Mismatch | None:
    """An error of the student's call (a stub, a crash, a limit), or of the reference's."""
    if err and err["type"] == "NotImplementedError":
        return _not_implemented(call)
    if err:
        kind = ErrorKind.of(err)
        aspect = kind.aspect if kind else "error"
        where = f"\n{err['where']}" if err.get("where") else ""
        return Mismatch(aspect, f"{err['type']}: {err['message']}{where}")
    if expected.error:  # the reference itself failed: a grader bug, never the student's fault
        return Mismatch("grader", f"the reference failed on this case ({expected.error['type']}); "
                        "please report this to your instructor.")
    return None


def _meta_mismatch(call: Call, student: Outcome, expected: Outcome) -> Mismatch | None:
    """The first output whose shape, dtype or device differs from the reference's."""
    n = len(expected.meta)
    for i, (sm, em) in enumerate(zip(student.meta, expected.meta)):
        name = _output_name(i, n, call)
        if "shape" not in em:
            continue
        if sm["shape"] != em["shape"]:
            return Mismatch("shape", f"{name} has shape {_fmt_shape(sm['shape'])}, expected "
                            f"{_fmt_shape(em['shape'])}.", output=i)
        if sm["dtype"] != em["dtype"]:
            floating = em["dtype"].startswith(("float", "bfloat", "complex"))
            why = " (the dtype of the inputs)" if floating and call.dtype in em["dtype"] else ""
            return Mismatch("dtype", f"{name} has dtype {sm['dtype']}, expected {em['dtype']}{why}.", output=i)
        if sm["device"] != em["device"]:
            return Mismatch("device", f"{name} is on device '{sm['device']}', expected '{em['device']}' "
                            "(the device of the inputs).", output=i)
    return None


def _outputs_mismatch(call: Call, student: Outcome, expected: Outcome, notes: list | None) -> Mismatch | None:
    """The first output with NaN/inf where the reference is finite, or with values off."""
    n = len(expected.meta)
    for i, (s, e) in enumerate(zip(student.outputs, expected.outputs)):
        if s is None or e is None:
            continue
        if s.is_floating_point() and not bool(torch.isfinite(e).logical_not().any()):
            bad = ~torch.isfinite(s)
            if bad.any():
                idx = tuple(int(j) for j in torch.nonzero(bad)[0])
                kind = "NaN" if torch.isnan(s).any() else "inf"
                return Mismatch("nonfinite", f"{_output_name(i, n, call)} contains {kind} "
                                f"({int(bad.sum())} entries, first at index {idx}); the reference is finite.",
                                output=i, where=list(idx))
        m = _values(i, n, s, e, call.dtype, "value", notes, _at_float32(expected, "outputs", i), call)
        if m:
            return m
    return None


def _grads_mismatch(call: Call, student: Outcome, expected: Outcome, notes: list | None) -> Mismatch | None:
    """The first gradient missing, of the wrong shape, or with values off."""
    n = len(expected.meta)
    for name, e in expected.grads.items():
        s = student.grads.get(name)
        if e is None:
            continue
        label = _grad_label(name)
        if s is None:
            return Mismatch("grads", f"no gradient reaches {label}: the computation is cut off from "
                            "autograd (.detach(), .data, .item(), torch.tensor(...) or numpy on the way?).")
        if tuple(s.shape) != tuple(e.shape):
            return Mismatch("grads", f"the gradient of {label} has shape {_fmt_shape(s.shape)}, "
                            f"expected {_fmt_shape(e.shape)}.")
        m = _values(None, n, s, e, call.dtype, f"the gradient with respect to {label}", notes,
                    _at_float32(expected, "grads", name))
        if m:
            return m
    return None


def _inplace_mismatch(student: Outcome) -> Mismatch | None:
    if student.inputs_modified:
        names = ", ".join(_grad_label(x) for x in student.inputs_modified)
        return Mismatch("inplace", f"the call modified its input in place ({names}); work on a copy "
                        "or use out-of-place ops (masked_fill, not masked_fill_).")
    return None


def _at_float32(expected: Outcome, part: str, key):
    """The reference's float32 run's counterpart of one output or gradient (or None)."""
    low = (expected.at_float32 or {}).get(part)
    try:
        return low[key] if low is not None else None
    except (IndexError, KeyError, TypeError):
        return None


def _kind(meta: dict) -> str:
    return "Tensor" if "shape" in meta else str(meta.get("type"))


def structure(student: Outcome, expected: Outcome, call: Call | None = None) -> Mismatch | None:
    """Whether the student's outcome has the expected outcome's structure, believing nothing the
    child claims about itself: as many outputs and descriptions as expected, each of the same
    kind, every tensor's data agreeing with its description (shape, dtype) and with the
    expected one, a tensor wherever the reference has one (never a missing value), and a
    gradient for every input the reference's gradient reaches. Anything else fails the case:
    a comparison is never skipped for lack of something to compare."""
    n = len(expected.meta)
    if len(student.meta) != len(student.outputs):
        return Mismatch("returned", f"the result describes {len(student.meta)} values but holds "
                        f"{len(student.outputs)}.")
    if len(student.outputs) != n or len(expected.outputs) != n:
        return Mismatch("returned", f"returned {len(student.outputs)} values, expected {n}.")
    for i, (sm, em, s, e) in enumerate(zip(student.meta, expected.meta, student.outputs, expected.outputs)):
        name = _output_name(i, n, call)
        if _kind(sm) != _kind(em):
            return Mismatch("returned", f"{name} is {_kind(sm)}, expected {_kind(em)}.", output=i)
        if s is not None and not isinstance(s, torch.Tensor):
            return Mismatch("returned", f"{name} came back without its values.", output=i)
        if s is None:
            # No data: only where the reference has none either (the meta device), or where the
            # student's tensor claims the meta device on a CPU case (reported as a device error).
            if e is not None and sm.get("device") != "meta" and call.device != FAKE_CUDA:
                return Mismatch("returned", f"{name} came back without its values.", output=i)
            continue
        if list(s.shape) != list(sm.get("shape", [])) or str(s.dtype).removeprefix("torch.") != sm.get("dtype"):
            return Mismatch("returned", f"{name}'s data ({_fmt_shape(s.shape)}, "
                            f"{str(s.dtype).removeprefix('torch.')}) does not match its description "
                            f"({_fmt_shape(sm.get('shape', []))}, {sm.get('dtype')}).", output=i)
    for key, e in expected.grads.items():
        s = student.grads.get(key)
        if e is not None and s is not None and not isinstance(s, torch.Tensor):
            return Mismatch("grads", f"the gradient of {_grad_label(key)} came back without its values.")
    return None


def _grad_label(name: str) -> str:
    if name.startswith("param."):
        return f"parameter `{name[6:]}`"
    kind, _, key = name.partition(".")
    return f"argument #{int(key) + 1}" if kind == "args" else f"argument `{key}`"


def _compare_params(student: Outcome, expected: Outcome) -> Mismatch | None:
    sp, ep = student.params or {}, expected.params or {}
    missing = [k for k in ep if k not in sp and k not in expected.transient]
    if missing:
        have = ", ".join(sorted(sp)) or "none"
        return Mismatch("params", f"the module has no parameter or buffer named {', '.join(missing)} "
                        f"(it has: {have}).")
    # a non-persistent buffer the reference lacks (HF-style position_ids) holds no weights and is
    # no part of the contract: only parameters and saved buffers are the module's layout
    extra = [k for k in sp if k not in ep and k not in student.transient]
    if extra:
        return Mismatch("params", f"the module has unexpected parameters or buffers: {', '.join(extra)} "
                        "(check the contract's layers and bias=... settings).")
    wrong = [f"{k} is {_fmt_shape(sp[k])}, expected {_fmt_shape(ep[k])}" for k in ep if sp[k] != ep[k]]
    if wrong:
        return Mismatch("params", "parameter shapes differ: " + "; ".join(wrong) + ".")
    if student.load_error:
        return Mismatch("params", f"the reference weights could not be loaded: {student.load_error}")
    return None


def compare_meta(call: Call, student: Outcome, expected: Outcome) -> Mismatch | None:
    """For the device check (or the meta device): everything but values (neither has any)."""
    # (shallow copies: `compare` only reads them; to_plain would deep-copy every tensor)
    stripped = dataclasses.replace(expected, outputs=[None] * len(expected.outputs), grads={}, at_float32=None)
    s = dataclasses.replace(student, outputs=[None] * len(student.outputs), grads={}, inputs_modified=[])
    m = compare(call, s, stripped)
    mixed = m and m.aspect == "error" and any(w in m.message.lower() for w in ("meta", "same device"))
    if mixed or (m and m.aspect == "device"):
        m.hint = ("some tensor is created on a fixed device: create new tensors with "
                  "device=x.device (and dtype=x.dtype), or with torch.*_like / x.new_*")
    return m

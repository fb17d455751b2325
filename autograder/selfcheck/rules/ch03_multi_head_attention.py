"""Chapter 3's comparison (training-mode dropout, graded by properties) and the hints no mistake
model shows."""
from __future__ import annotations

import math
import re

import torch

from ...grading.compare import Mismatch, compare_meta
from ...grading.compare import compare as compare_values
from ..hint_engine import hint_tolerance
from .common import nan_gradients_explain


_nan_gradients = nan_gradients_explain("mask")


def _dropout_p(call) -> float:
    return float((call.init or {}).get("dropout", 0.0) or 0.0)


def is_dropout_probe(call) -> bool:
    return call.exercise == "MultiHeadAttention" and _dropout_p(call) > 0


def is_dropout_train(call) -> bool:
    """A training-mode call with p > 0: its output is random and graded by properties."""
    return call.exercise == "MultiHeadAttention" and call.train and _dropout_p(call) > 0


def compare(call, student, expected, notes=None):
    """This chapter's comparison: value for value, except training-mode dropout with p > 0.

    `autograder.cases.compare` calls it in place of `autograder.grading.compare.compare` on CPU and CUDA
    (the meta-device run skips training-mode calls).
    """
    if is_dropout_train(call):
        return dropout_properties(call, student, expected)
    return compare_values(call, student, expected, notes)


def _revealed(call, output):
    """From the probe's output: the weights as they multiplied the values (B, H, L_q, L_k), and
    their sums as the values' all-ones feature saw them (B, H, L_q)."""
    B, Lk, E = call.args[2].shape
    H = call.init["num_heads"]
    d_h = E // H
    heads = (output.double() - call.state["out_proj.bias"]).reshape(B, -1, H, d_h).transpose(1, 2)
    return heads[..., :Lk], heads[..., Lk]


def dropout_properties(call, student, expected) -> Mismatch | None:
    """Grade a training-mode dropout probe (see `_dropout_probe`) by what holds whatever the
    random stream, with W the weights before dropout (what the reference returns):

    (1) names, shapes, dtypes and devices as the reference's; (2) the returned weights are W
    (dropout acts only on the copy that multiplies the values); (3) each weight that multiplied the
    values is 0 or W / (1-p); (4) the share of dropped weights is within 5 standard deviations of
    p; (5) the values saw those very weights (dropout acts on the weights, not on the heads'
    output). The reference's own draw must pass (1)-(5), or the case is reported as a grader bug.
    """
    m = compare_meta(call, student, expected)
    if m:
        m.hint = None
        return m
    if _dropout_violation(call, expected, expected.outputs[1]) is not None:
        return Mismatch("grader", "the reference fails its own training-mode dropout check; "
                        "please report this to your instructor.")
    return _dropout_violation(call, student, expected.outputs[1])


def _dropout_violation(call, outcome, w_eval) -> Mismatch | None:
    p = _dropout_p(call)
    out, w = (t.double() for t in outcome.outputs[:2])
    w_eval = w_eval.double()
    if not (torch.isfinite(out).all() and torch.isfinite(w).all()):
        return Mismatch("nonfinite", "in training mode the output or the weights contain NaN or inf.")
    rtol, atol = (1e-5, 1e-7) if call.dtype == "float64" else (1e-4, 1e-5)
    if not torch.allclose(w, w_eval, rtol=rtol, atol=atol):
        looks_dropped = bool(((w.abs() <= atol) | torch.isclose(w, w_eval / (1 - p), rtol=rtol, atol=atol)).all())
        return Mismatch("values", f"in training mode with dropout={p}, the returned weights should be the "
                        "weights before dropout: dropout acts only on the copy that multiplies the values.",
                        output=1, hint="keep the softmax weights to return, and multiply the values by "
                        "F.dropout(weights, p, training=self.training)" if looks_dropped else None)
    used, sums = _revealed(call, out)
    if torch.allclose(used, w_eval, rtol=rtol, atol=atol):
        return Mismatch("values", f"in training mode with dropout={p}, no attention weight was dropped: "
                        "dropout must act on the weights in training mode.", output=0,
                        hint="F.dropout(weights, p, training=self.training), or an nn.Dropout(p) layer, "
                             "which module.train() turns on and module.eval() off")
    kept_value = w_eval / (1 - p)
    dropped = used.abs() <= atol
    kept = (used - kept_value).abs() <= atol + rtol * kept_value.abs()
    bad = ~(dropped | kept)
    if bad.any():
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        return Mismatch("values", f"in training mode with dropout={p}, each weight that multiplies the "
                        "values must be dropped (0) or kept and scaled by 1/(1-p): the weight of head "
                        f"{idx[1]}, query {idx[2]} on key {idx[3]} (batch {idx[0]}) acted as "
                        f"{used[idx].item():.6g}, expected 0 or {kept_value[idx].item():.6g}.", output=0,
                        hint="apply dropout to the attention weights after the softmax (F.dropout / "
                             "nn.Dropout zero each with probability p and scale the rest by 1/(1-p))")
    live = w_eval > 1e-6
    n = int(live.sum())
    share = float(dropped[live].double().mean())
    if abs(share - p) > 5 * math.sqrt(p * (1 - p) / n):
        return Mismatch("values", f"in training mode with dropout={p}, {share:.0%} of the {n} attention "
                        f"weights were dropped; expected about {p:.0%}.", output=0)
    if not torch.allclose(sums, used.sum(-1), rtol=rtol, atol=atol):
        return Mismatch("values", "in training mode the values were not multiplied by the dropped-out "
                        "weights themselves (dropout on the heads' output, or twice?): apply dropout once, "
                        "to the attention weights, before they multiply the values.", output=0)
    return None


def _bias_explain(call, student, mismatch):
    if (mismatch.aspect == "params" and call.init and call.init.get("bias") is False
            and any(name.endswith(".bias") for name in student.params or {})):
        return "with bias=False no layer has a bias: pass bias=bias to every nn.Linear"
    return None


def _mha_explain(call, student, expected, mismatch):
    common = _bias_explain(call, student, mismatch) or _nan_gradients(call, student, expected, mismatch)
    if common:
        return common
    if call.expect_error == "ValueError":
        return "raise ValueError in __init__ when embed_dim % num_heads != 0"
    if is_dropout_probe(call) and not call.train and mismatch.aspect == "values" \
            and _dropped_in_eval(call, student, expected):
        return ("dropout acts in eval mode too: use F.dropout(weights, p, training=self.training) "
                "or an nn.Dropout layer (module.eval() turns it off)")
    return None


def _mhsa_explain(call, student, expected, mismatch):
    common = _bias_explain(call, student, mismatch) or _nan_gradients(call, student, expected, mismatch)
    if common:
        return common
    if mismatch.aspect == "params" and any(re.match(r"[qkv]_proj\.", name) for name in student.params or {}):
        return "use one fused qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias), not three"
    return None


def _dropped_in_eval(call, student, expected) -> bool:
    """On the eval-mode dropout probe: the weights that multiplied the values look dropped out."""
    if not student.outputs or student.outputs[0] is None or student.outputs[0].shape != expected.outputs[0].shape:
        return False
    used, _ = _revealed(call, student.outputs[0])
    w_e = expected.outputs[1].double()
    rtol, atol = hint_tolerance(call.dtype)
    dropped = used.abs() <= atol
    kept = torch.isclose(used, w_e / (1 - _dropout_p(call)), rtol=rtol, atol=atol)
    return bool((dropped | kept).all() and dropped[w_e > 1e-6].any())


EXPLAIN = {"MultiHeadAttention": _mha_explain, "MultiHeadSelfAttention": _mhsa_explain}

"""Chapter 2: scaled_dot_product_attention and SelfAttention."""
from __future__ import annotations

import math

import torch

from .inputs import bool_mask, distinct_state, float_mask, randn
from . import Hints, Mistake, call
from ..selfcheck.rules.ch02_scaled_dot_product_attention import EXPLAIN
from .mistake_models import (FLOAT_MASK_AS_BOOL, bool_given, float_given, fully_masked_row, softmax_weights)


def cases(exercise, gen, ref, quick):
    if exercise == "scaled_dot_product_attention":
        return _sdpa_cases(gen, quick)
    if exercise == "SelfAttention":
        return _self_attention_cases(gen, ref, quick)
    raise KeyError(exercise)


def _sdpa_cases(gen, quick):
    g = ["args.0", "args.1", "args.2"]
    cs = [
        call("unbatched, L_q=3, L_k=5, d_k=4, d_v=6",
             randn(gen, 3, 4), randn(gen, 5, 4), randn(gen, 5, 6), grad=g),
        call("batch (2, 3), L_q=4 != L_k=6, d_k=5 != d_v=7",
             randn(gen, 2, 3, 4, 5), randn(gen, 2, 3, 6, 5), randn(gen, 2, 3, 6, 7), grad=g),
        call("boolean mask (L_q, L_k) broadcast over a batch, one fully masked row",
             randn(gen, 2, 4, 8), randn(gen, 2, 5, 8), randn(gen, 2, 5, 3),
             kwargs={"mask": bool_mask(gen, 4, 5, full_rows=1)}, grad=g + ["kwargs.mask"]),
        call("additive float mask (0 / -inf plus a bias), batch (2,)",
             randn(gen, 2, 3, 4), randn(gen, 2, 6, 4), randn(gen, 2, 6, 4),
             kwargs={"mask": float_mask(gen, 2, 3, 6)}, grad=g + ["kwargs.mask"]),
        # a row of -inf scores that autograd reaches (a boolean mask's masked_fill cuts it off):
        # its gradients must be finite too, which nan_to_num after the softmax is not
        call("float mask with a fully -inf row: zero output, finite gradients",
             randn(gen, 4, 5), randn(gen, 6, 5), randn(gen, 6, 3),
             kwargs={"mask": float_mask(gen, 4, 6, full_rows=1)}, grad=g),
    ]
    if quick:
        return cs
    return cs + [
        call("padding-style mask (B, 1, 1, L_k) against (B, H, L_q, L_k)",
             randn(gen, 2, 3, 5, 4), randn(gen, 2, 3, 5, 4), randn(gen, 2, 3, 5, 4),
             kwargs={"mask": bool_mask(gen, 2, 1, 1, 5, p=0.4, full_rows=0)}, grad=g),
        call("several fully masked rows in a batched boolean mask",
             randn(gen, 3, 4, 6), randn(gen, 3, 4, 6), randn(gen, 3, 4, 2),
             kwargs={"mask": bool_mask(gen, 3, 4, 4, p=0.5, full_rows=3)}, grad=g),
        call("large scores (inputs scaled by 30): softmax must stay finite",
             randn(gen, 4, 16, scale=30.0), randn(gen, 7, 16, scale=30.0), randn(gen, 7, 3), grad=g),
        call("d_k = 1, L_q = 1 (odd sizes)",
             randn(gen, 2, 1, 1), randn(gen, 2, 3, 1), randn(gen, 2, 3, 5), grad=g),
        call("float32 inputs keep float32", randn(gen, 2, 3, 4), randn(gen, 2, 5, 4),
             randn(gen, 2, 5, 4), kwargs={"mask": bool_mask(gen, 2, 3, 5, full_rows=0)}, dtype="float32"),
    ]


def _self_attention_cases(gen, ref, quick):
    cls = ref["SelfAttention"]
    out = []
    # (name, d_model, d_k, x shape, mask shape or None, fully masked rows, dtype)
    specs = [("unbatched x (5, 6), d_k=4", 6, 4, (5, 6), None, 0, "float64"),
             ("batch (2, 3), x (2, 3, 4, 8), d_k=5, boolean mask with a fully masked row", 8, 5, (2, 3, 4, 8),
              (4, 4), 1, "float64")]
    if not quick:
        specs += [("batch (3,), x (3, 7, 6), d_k=6, mask with a fully masked row", 6, 6, (3, 7, 6), (3, 7, 7),
                   1, "float64"),
                  ("d_model=5, d_k=3 (odd sizes), float32", 5, 3, (2, 4, 5), None, 0, "float32")]
    # (last, so the cases above keep their inputs) the fully masked rule with a float mask
    specs += [("batch (2,), x (2, 4, 6), d_k=3, additive float mask with a fully -inf row", 6, 3, (2, 4, 6),
               (4, 4), -1, "float64")]
    for name, d_model, d_k, xshape, mshape, full_rows, dtype in specs:
        state = distinct_state(cls(d_model, d_k), gen)
        if full_rows < 0:
            kwargs = {"mask": float_mask(gen, *mshape, full_rows=-full_rows)}
        else:
            kwargs = {"mask": bool_mask(gen, *mshape, full_rows=full_rows)} if mshape else {}
        grad = ["args.0", "params"] + (["kwargs.mask"] if full_rows < 0 else [])
        out.append(call(name, randn(gen, *xshape), init={"d_model": d_model, "d_k": d_k}, state=state,
                        kwargs=kwargs, grad=grad, dtype=dtype))
    return out


# ----------------------------------------------------------------------------- hints
def attend(call, scale="sqrt", dim=-1, invert=False, fill="zero", float_as_bool=None):
    """[output, weights] of scaled dot-product attention on the call's q, k, v and mask (float64),
    with one mistake switched on: scale "sqrt" (correct), "none" or "d_k"; the softmax over
    `dim`; the boolean mask inverted; fully masked rows "zero" (correct), "nan" (a plain softmax
    of all -inf) or "uniform" (-1e9 instead of -inf); `float_as_bool` (-1e9 or -inf): a float
    mask read as a boolean one, `masked_fill(mask == 0, float_as_bool)`, then a plain softmax."""
    q, k, v = (a.double() for a in call.args[:3])
    mask = call.kwargs.get("mask")
    d_k = q.shape[-1]
    s = q @ k.transpose(-2, -1) / {"sqrt": math.sqrt(d_k), "none": 1.0, "d_k": d_k}[scale]
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = ~mask if invert else mask
            s = s.masked_fill(~keep, -1e9 if fill == "uniform" else float("-inf"))
        elif float_as_bool is not None:
            return _softmax_all(s.masked_fill(mask == 0, float_as_bool), dim, v)
        else:
            s = s + mask.double()
    w = softmax_weights(s, dim, "zero" if fill == "zero" else "softmax")
    return [w @ v, w]


def _softmax_all(scores, dim, v):
    w = torch.softmax(scores, dim=dim)
    return [w @ v.double(), w]


def _weights(**mistake):
    return lambda c: [None, attend(c, **mistake)[1]]


_bool_mask, _float_mask = bool_given("mask"), float_given("mask")


_fully_masked = fully_masked_row("mask")


SDPA_MISTAKES = (
    Mistake(FLOAT_MASK_AS_BOOL, _weights(float_as_bool=-1e9), when=_float_mask),
    Mistake(FLOAT_MASK_AS_BOOL, _weights(float_as_bool=float("-inf")), when=_float_mask),
    Mistake("scores look unscaled: divide q·k by sqrt(d_k) before the softmax", _weights(scale="none")),
    Mistake("scores are divided by d_k: divide by sqrt(d_k) instead", _weights(scale="d_k")),
    Mistake("the weights sum to 1 over the wrong axis: take the softmax over the keys (dim=-1)", _weights(dim=-2)),
    Mistake("the mask looks inverted: True means 'may attend' (keep), False means masked out",
            _weights(invert=True), when=_bool_mask),
    Mistake("a fully masked row gives NaN (softmax of all -inf): give such rows zero weights and a zero output",
            _weights(fill="nan"), when=_fully_masked),
    Mistake("a fully masked row should give zero weights and a zero output, not a uniform average "
            "(-1e9 instead of -inf, or no zeroing after the softmax?)", _weights(fill="uniform"), when=_fully_masked),
)


HINTS = {
    "scaled_dot_product_attention": Hints(
        SDPA_MISTAKES, correct=attend, explain=EXPLAIN["scaled_dot_product_attention"],
        weights_right="the weights are right but the output is not: multiply the weights by v (weights @ v)"),
}

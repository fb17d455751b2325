"""Chapter 2: scaled_dot_product_attention and SelfAttention."""
from __future__ import annotations

import math

import torch

from ..inputs import bool_mask, distinct_state, float_mask, randn
from . import call, matches


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
    ]
    if quick:
        return cs
    return cs + [
        call("additive float mask (0 / -inf plus a bias), batch (2,)",
             randn(gen, 2, 3, 4), randn(gen, 2, 6, 4), randn(gen, 2, 6, 4),
             kwargs={"mask": float_mask(gen, 2, 3, 6)}, grad=g + ["kwargs.mask"]),
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
             randn(gen, 2, 5, 4), kwargs={"mask": bool_mask(gen, 2, 3, 5)}, dtype="float32"),
    ]


def _self_attention_cases(gen, ref, quick):
    cls = ref["SelfAttention"]
    out = []
    specs = [("unbatched x (5, 6), d_k=4", (6, 4), (5, 6), None),
             ("batch (2, 3), x (2, 3, 4, 8), d_k=5, boolean mask", (8, 5), (2, 3, 4, 8), (4, 4))]
    if not quick:
        specs += [("batch (3,), x (3, 7, 6), d_k=6, mask with a fully masked row", (6, 6), (3, 7, 6), (3, 7, 7)),
                  ("d_model=5, d_k=3 (odd sizes), float32", (5, 3), (2, 4, 5), None)]
    for i, (name, (d_model, d_k), xshape, mshape) in enumerate(specs):
        state = distinct_state(cls(d_model, d_k), gen)
        kwargs = {}
        if mshape:
            kwargs["mask"] = bool_mask(gen, *mshape, full_rows=1 if "fully" in name else 0)
        out.append(call(name, randn(gen, *xshape), init={"d_model": d_model, "d_k": d_k}, state=state,
                        kwargs=kwargs, grad=["args.0", "params"],
                        dtype="float32" if "float32" in name else "float64"))
    return out


# ----------------------------------------------------------------------------- hints
def _softmax(s, dim=-1):
    return torch.softmax(s, dim=dim)


def _masked(scores, mask):
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    return scores + mask


def sdpa_weight_hint(q, k, mask, weights, expected_weights) -> str | None:
    """Names the mistake whose weights match the student's (plain-torch mistake models)."""
    if weights is None or expected_weights is None or weights.shape != expected_weights.shape:
        return None
    q, k = q.double(), k.double()
    d_k = q.shape[-1]
    raw = q @ k.transpose(-2, -1)
    boolean = mask is not None and mask.dtype == torch.bool

    def fully_masked(m):  # rows whose keys `m` masks all; None without a boolean mask
        return ~m.expand(raw.shape).any(-1) if boolean else None

    full = fully_masked(mask)
    # (hint, the weights that mistake gives, the rows it masks fully: zero in a correct treatment)
    candidates = [
        ("scores look unscaled: divide q·k by sqrt(d_k) before the softmax", _softmax(_masked(raw, mask)), full),
        ("scores are divided by d_k: divide by sqrt(d_k) instead",
         _softmax(_masked(raw / d_k, mask)), full),
        ("the weights sum to 1 over the wrong axis: take the softmax over the keys (dim=-1)",
         _softmax(_masked(raw / math.sqrt(d_k), mask), dim=-2), full),
    ]
    if boolean:
        candidates.append(("the mask looks inverted: True means 'may attend' (keep), False means masked out",
                           _softmax(_masked(raw / math.sqrt(d_k), ~mask)), fully_masked(~mask)))
    for text, cand, rows in candidates:
        if rows is not None:
            cand = cand.masked_fill(rows.unsqueeze(-1), 0.0)
        if matches(weights, cand) or matches(weights, torch.nan_to_num(cand)):
            return text
    if full is not None and full.any():
        rows = weights.double()[full.expand(weights.shape[:-1])]
        if torch.isnan(rows).any():
            return ("a fully masked row gives NaN (softmax of all -inf): give such rows zero weights "
                    "and a zero output")
        if rows.abs().sum() > 0:
            return ("a fully masked row should give zero weights and a zero output, not a uniform "
                    "average (-1e9 instead of -inf, or no zeroing after the softmax?)")
    return None


def hint(call, student, expected, mismatch):
    if mismatch.aspect == "nonfinite" and "mask" in call.kwargs:
        return ("a fully masked row gives NaN (softmax of all -inf): give such rows zero weights "
                "and a zero output")
    if call.exercise != "scaled_dot_product_attention" or mismatch.aspect not in ("values", "nonfinite"):
        return None
    q, k = call.args[0], call.args[1]
    mask = call.kwargs.get("mask")
    if len(student.outputs) > 1 and len(expected.outputs) > 1:
        h = sdpa_weight_hint(q, k, mask, student.outputs[1], expected.outputs[1])
        if h:
            return h
        if mismatch.output == 0 and matches(student.outputs[1], expected.outputs[1]):
            return "the weights are right but the output is not: multiply the weights by v (weights @ v)"
    return None

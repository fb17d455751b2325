"""Chapter 6: the AlphaFold-style MultiHeadAttention (prepare_qkv, prepare_qkv_global, forward).

Inputs are MSA-like: x (B, S, R, c_in), attention along the rows (attn_dim=-2), the columns
(attn_dim=-3), a positive attn_dim, and unbatched or with extra batch axes. The pair bias
(*, N_head, q, k) is given with fewer batch axes than the scores, left-aligned as in the
worksheet, with B != S (a right-aligned bias fails loudly) and once with B == S (it would fail
silently). attention_mask (*, k) is a 0/1 float or a boolean, with a fully masked row (zero
weights, so the output is linear_o's bias). Every layer gets its own random weights, linear_g
included, so gating matters; global attention is graded with gated=True (AlphaFold's use).
"""
from __future__ import annotations

import functools
import math

import torch

from .inputs import distinct_state, randn
from . import Hints, Mistake, call
from ..selfcheck.rules.ch06_gated_global_attention import EXPLAIN
from .mistake_models import given, linear, softmax_weights


def cases(exercise, gen, ref, quick):
    cls = ref["MultiHeadAttention"]
    if exercise == "prepare_qkv":
        return _prepare_cases(gen, quick, is_global=False)
    if exercise == "prepare_qkv_global":
        return _prepare_cases(gen, quick, is_global=True)
    if exercise == "MultiHeadAttention":
        return _forward_cases(gen, cls, quick)
    raise KeyError(exercise)


# ----------------------------------------------------------------------------- prepare_qkv(_global)
def _prepare_call(name, gen, *, N_head, c, attn_dim, q_shape, k_len, is_global, dtype="float64", c_in=5):
    """q of q_shape (the attention axis at attn_dim, N_head*c channels last); k and v alike but
    k_len long on the attention axis (and c channels when global)."""
    init = {"c_in": c_in, "c": c, "N_head": N_head, "attn_dim": attn_dim}
    if is_global:
        init["is_global"] = True
    q_shape = list(q_shape) + [N_head * c]
    kv_shape = list(q_shape)
    kv_shape[attn_dim] = k_len
    kv_shape[-1] = c if is_global else N_head * c
    g = ["args.0", "args.1", "args.2"] if dtype == "float64" else []
    return call(name, randn(gen, *q_shape), randn(gen, *kv_shape), randn(gen, *kv_shape), init=init,
                method="prepare_qkv_global" if is_global else "prepare_qkv", grad=g, dtype=dtype)


def _prepare_cases(gen, quick, is_global):
    kv = "single-head keys/values, " if is_global else ""
    specs = [
        (f"rows: attn_dim=-2, (B=2, S=3, q=5, 3 heads x c=4), {kv}k=6", 3, 4, -2, (2, 3, 5), 6),
        (f"columns: attn_dim=-3, (B=2, q=4, R=3, 2 heads x c=5), {kv}k=6", 2, 5, -3, (2, 4, 3), 6),
    ]
    if not quick:
        specs += [
            ("attn_dim=1 (positive) on (2, q=5, 3, 4 heads x c=3), k=4", 4, 3, 1, (2, 5, 3), 4),
            ("attn_dim=0 on (q=5, 3, 2 heads x c=4), k=2", 2, 4, 0, (5, 3), 2),
            ("unbatched (q=4, 3 heads x c=2), attn_dim=-2, k=5", 3, 2, -2, (4,), 5),
            ("attn_dim=-4 on (2, q=3, 2, 2, 1 head x c=6), k=5", 1, 6, -4, (2, 3, 2, 2), 5),
            ("5 heads x c=1, attn_dim=-2, (3, q=4), k=3", 5, 1, -2, (3, 4), 3),
        ]
    out = [_prepare_call(n, gen, N_head=h, c=c, attn_dim=d, q_shape=s, k_len=k, is_global=is_global)
           for n, h, c, d, s, k in specs]
    if not quick:
        out.append(_prepare_call("float32, columns: attn_dim=-3, (2, q=4, 3, 2 heads x c=3), k=4", gen,
                                 N_head=2, c=3, attn_dim=-3, q_shape=(2, 4, 3), k_len=4,
                                 is_global=is_global, dtype="float32"))
    return out


# ----------------------------------------------------------------------------- forward
def _mask(gen, *shape, p=0.3, dead=0, as_bool=False):
    """An attention_mask (*, k): 1 = attend, 0 = no weight; exactly the first `dead` rows (over
    the flattened batch) fully masked."""
    keep = torch.rand(shape, generator=gen) >= p
    flat = keep.reshape(-1, shape[-1])
    flat[~flat.any(-1), 0] = True
    for i in range(dead):
        flat[i] = False
    keep = flat.reshape(shape)
    return keep if as_bool else keep.to(torch.float64)


def _forward_call(name, gen, cls, *, c_in, c, N_head, attn_dim, x_shape, gated=False, is_global=False,
                  emb_bias=False, bias_shape=None, mask=None, dtype="float64"):
    init = {"c_in": c_in, "c": c, "N_head": N_head, "attn_dim": attn_dim}
    if gated:
        init["gated"] = True
    if is_global:
        init["is_global"] = True
    if emb_bias:
        init["use_bias_for_embeddings"] = True
    state = distinct_state(cls(**init), gen)
    kwargs = {}
    g = ["args.0", "params"]
    if bias_shape is not None:
        kwargs["bias"] = randn(gen, *bias_shape)
        g.append("kwargs.bias")
    if mask is not None:
        kwargs["attention_mask"] = mask
    return call(name, randn(gen, *x_shape, c_in), init=init, state=state, kwargs=kwargs, grad=g, dtype=dtype)


def _forward_cases(gen, cls, quick):
    cs = [
        _forward_call("row attention (attn_dim=-2) on x (B=2, S=3, R=5, c_in=6), 3 heads x c=4, pair bias "
                      "(B, N_head, R, R) left-aligned", gen, cls, c_in=6, c=4, N_head=3, attn_dim=-2,
                      x_shape=(2, 3, 5), bias_shape=(2, 3, 5, 5)),
        _forward_call("column attention (attn_dim=-3), gated, q/k/v biases, x (B=2, S=4, R=3, c_in=7), "
                      "attention_mask (B, R, S)", gen, cls, c_in=7, c=3, N_head=2, attn_dim=-3,
                      x_shape=(2, 4, 3), gated=True, emb_bias=True, mask=_mask(gen, 2, 3, 4)),
        _forward_call("global gated attention along the columns (attn_dim=-3), x (B=2, S=5, R=3, c_in=6), "
                      "4 heads x c=2, attention_mask (B, R, S)", gen, cls, c_in=6, c=2, N_head=4, attn_dim=-3,
                      x_shape=(2, 5, 3), gated=True, is_global=True, mask=_mask(gen, 2, 3, 5)),
        _forward_call("attention_mask (B, S, R) with fully masked rows: zero weights", gen, cls, c_in=6, c=4,
                      N_head=2, attn_dim=-2, x_shape=(2, 3, 5), gated=True,
                      mask=_mask(gen, 2, 3, 5, dead=2)),
        _forward_call("column attention with N_seq = N_res = 4: boolean attention_mask (B, R, S), its "
                      "attention axis last", gen, cls, c_in=5, c=3, N_head=2, attn_dim=-3, x_shape=(2, 4, 4),
                      mask=_mask(gen, 2, 4, 4, p=0.5, as_bool=True)),
    ]
    if quick:
        return cs
    return cs + [
        _forward_call("unbatched x (L=5, c_in=6), attn_dim=-2, bias (N_head, L, L)", gen, cls, c_in=6, c=3,
                      N_head=2, attn_dim=-2, x_shape=(5,), bias_shape=(2, 5, 5)),
        _forward_call("bias with all batch axes (B, S, N_head, R, R), gated", gen, cls, c_in=5, c=4, N_head=2,
                      attn_dim=-2, x_shape=(2, 3, 4), gated=True, bias_shape=(2, 3, 2, 4, 4)),
        _forward_call("B == S = 3: bias (B, N_head, R, R) must align with B, not with S", gen, cls, c_in=6,
                      c=2, N_head=3, attn_dim=-2, x_shape=(3, 3, 4), bias_shape=(3, 3, 4, 4)),
        _forward_call("extra batch axes: x (2, 2, S=3, R=4, c_in=5), bias (2, N_head, R, R)", gen, cls,
                      c_in=5, c=3, N_head=2, attn_dim=-2, x_shape=(2, 2, 3, 4), bias_shape=(2, 2, 4, 4)),
        _forward_call("boolean attention_mask (B, S, R) and pair bias", gen, cls, c_in=6, c=3, N_head=3,
                      attn_dim=-2, x_shape=(2, 3, 4), bias_shape=(2, 3, 4, 4),
                      mask=_mask(gen, 2, 3, 4, as_bool=True)),
        _forward_call("gated, c_in == N_head * c = 8", gen, cls, c_in=8, c=4, N_head=2, attn_dim=-2,
                      x_shape=(2, 3, 4), gated=True),
        _forward_call("attn_dim=1 (positive) on x (B=2, L=5, 3, c_in=6), gated, bias and mask", gen, cls,
                      c_in=6, c=2, N_head=3, attn_dim=1, x_shape=(2, 5, 3), gated=True,
                      bias_shape=(2, 3, 5, 5), mask=_mask(gen, 2, 3, 5)),
        _forward_call("global gated, unbatched x (L=6, c_in=5), q/k/v biases", gen, cls, c_in=5, c=3,
                      N_head=2, attn_dim=-2, x_shape=(6,), gated=True, is_global=True, emb_bias=True),
        _forward_call("global gated, rows (attn_dim=-2), 1 head, a fully masked row", gen, cls, c_in=4, c=5,
                      N_head=1, attn_dim=-2, x_shape=(2, 3, 4), gated=True, is_global=True,
                      mask=_mask(gen, 2, 3, 4, dead=1)),
        _forward_call("1 head x c=1, no gating, attn_dim=-3", gen, cls, c_in=3, c=1, N_head=1, attn_dim=-3,
                      x_shape=(2, 4, 3)),
        _forward_call("float32, gated, column attention with bias and mask", gen, cls, c_in=6, c=4, N_head=2,
                      attn_dim=-3, x_shape=(2, 4, 3), gated=True, bias_shape=(2, 2, 4, 4),
                      mask=_mask(gen, 2, 3, 4), dtype="float32"),
    ]


# ----------------------------------------------------------------------------- hints
# Plain-torch mistake models (see autograder.cases.Mistake): each recomputes the call with one
# named mistake.
def _heads(t, ad, H, c, order="hc", move=True):
    """(*, L, *, H*c) -> (*, H, L, c)."""
    if move:
        t = t.movedim(ad, -2)
    if order == "hc":
        return t.unflatten(-1, (H, c)).transpose(-3, -2)
    if order == "ch":  # view(..., c, N_head): head h holds channels h, h+N_head, ...
        return t.unflatten(-1, (c, H)).movedim(-1, -3)
    if order == "no-transpose":  # reshape straight to (*, H, L, c)
        return t.reshape(*t.shape[:-2], H, t.shape[-2], c)
    raise ValueError(order)


def _prepare(call, order="hc", move=True, keepdim=True, reduce="mean", kv_unsqueeze=-3, q_len_for_kv=False):
    init = call.init
    H, c, ad = init["N_head"], init["c"], init["attn_dim"]
    q, k, v = (a.double() for a in call.args)
    if q_len_for_kv:  # k and v viewed with q's shape
        k, v = k.reshape(q.shape), v.reshape(q.shape)
    if init.get("is_global"):
        q = _heads(q, ad, H, c, order, move)
        q = q.mean(-2, keepdim=keepdim) if reduce == "mean" else q.sum(-2, keepdim=keepdim)
        if move:
            k, v = k.movedim(ad, -2), v.movedim(ad, -2)
        return [q, k.unsqueeze(kv_unsqueeze), v.unsqueeze(kv_unsqueeze)]
    return [_heads(t, ad, H, c, order, move) for t in (q, k, v)]


def _forward(call, scale="c", gate="sigmoid", bias_align="left", mask_on="keys", fill="zero",
             attn_dim=None, dim=-1, global_mean="queries"):
    init, st = call.init, {k: v.double() for k, v in call.state.items()}
    H, c = init["N_head"], init["c"]
    ad = init["attn_dim"] if attn_dim is None else attn_dim
    x = call.args[0].double()
    bias, mask = call.kwargs.get("bias"), call.kwargs.get("attention_mask")
    q, k, v = linear(x, st, "linear_q"), linear(x, st, "linear_k"), linear(x, st, "linear_v")
    q = _heads(q, ad, H, c)
    if init.get("is_global"):
        k, v = k.movedim(ad, -2).unsqueeze(-3), v.movedim(ad, -2).unsqueeze(-3)
        if global_mean == "queries":
            q = q.mean(-2, keepdim=True)
    else:
        k, v = _heads(k, ad, H, c), _heads(v, ad, H, c)
    q = q / {"c": math.sqrt(c), "cN": math.sqrt(c * H), "none": 1.0}[scale]
    s = q @ k.transpose(-2, -1)  # (*, H, q, k)
    if bias is not None:
        bias = bias.double()
        if bias_align == "left":
            bias = bias.reshape(*bias.shape[:-3], *(1,) * (s.dim() - bias.dim()), *bias.shape[-3:])
        s = s + bias
    if mask is not None:
        m = mask != 0
        if mask_on == "inverted":
            m = ~m
        if mask_on == "transposed":  # laid out like x, (*, q, k) with the two axes swapped
            m = m.transpose(-1, -2)
        m = m[..., None, :, None] if mask_on == "queries" else m[..., None, None, :]
        if fill == "offset":  # the worksheet's -1e8 offset: a fully masked row stays a softmax
            s = s + (~m) * -1e8
        elif fill == "times-inf":  # (mask == 0) * -inf: 0 * -inf is NaN on every kept key
            s = s + (~m).double() * float("-inf")
        else:
            s = s.masked_fill(~m, float("-inf"))
    w = softmax_weights(s, dim, "softmax" if fill == "nan" else "zero")  # "nan": a plain softmax
    o = w @ v
    if init.get("is_global") and global_mean == "outputs":
        o = o.mean(-2, keepdim=True)
    o = o.transpose(-3, -2).flatten(-2).movedim(-2, ad)
    if init.get("gated"):
        g = linear(x, st, "linear_g")
        if gate == "sigmoid":
            o = torch.sigmoid(g) * o
        elif gate == "no-sigmoid":
            o = g * o
        elif gate == "after":
            return [torch.sigmoid(g) * linear(o, st, "linear_o")]
    return [linear(o, st, "linear_o")]


def _mistakes(model, table):
    return tuple(Mistake(text, functools.partial(model, **kw), when) for text, kw, when in table)


def _init(name):
    return lambda c: bool(c.init.get(name))


PREPARE_MISTAKES = [
    ("attn_dim is ignored: move the attention axis next to the channels first "
     "(t.movedim(self.attn_dim, -2))", dict(move=False), None),
    ("the heads are split in the wrong order: view the channels as (N_head, c), not (c, N_head), so "
     "head h holds channels h*c to (h+1)*c - 1", dict(order="ch"), None),
    ("reshaping straight to (*, N_head, q, c) mixes positions: view as (*, q, N_head, c), then "
     "transpose the q and N_head axes", dict(order="no-transpose"), None),
    ("k and v are reshaped with the shape of q: each tensor keeps its own length along attn_dim",
     dict(q_len_for_kv=True), None),
]
_UNSQUEEZE = ("keys and values get their singleton head axis just before the k axis: k.unsqueeze(-3) gives "
              "(*, 1, k, c), which broadcasts against the N_head query heads")
GLOBAL_MISTAKES = [
    ("keep the averaged query axis: torch.mean(q, dim=-2, keepdim=True) gives (*, N_head, 1, c)",
     dict(keepdim=False), None),
    ("the queries are summed: average them over the query axis (torch.mean)", dict(reduce="sum"), None),
    (_UNSQUEEZE, dict(kv_unsqueeze=-2), None),
    (_UNSQUEEZE, dict(kv_unsqueeze=0), None),
]
_MASK_ON_QUERIES = ("the attention_mask acts on the queries: it masks keys, attention_mask[..., None, "
                    "None, :] lines it up with the last (k) axis of the (*, N_head, q, k) scores")
_MASKED = given("attention_mask")
_MASK_CODE = ("Mask with masked_fill, which never multiplies, and give a query with no key left zero weights: "
              "keep = attention_mask[..., None, None, :] != 0; a = a.masked_fill(~keep, float('-inf')); "
              "dead = ~keep.any(-1, keepdim=True); "
              "a = torch.softmax(a.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)")


def _square(mask) -> bool:
    """Where a mask in x's layout would broadcast silently (N_seq = N_res); elsewhere it fails
    loudly, as other mistakes do."""
    return mask.dim() >= 2 and mask.shape[-1] == mask.shape[-2]
FORWARD_MISTAKES = [
    ("scores are divided by sqrt(c * N_head): divide the queries by sqrt(c), the channels per head",
     dict(scale="cN"), None),
    ("scores look unscaled: divide the queries by sqrt(c) before the dot products", dict(scale="none"), None),
    # (with a key mask, a softmax over the queries is NaN everywhere: only told apart without one)
    ("the weights sum to 1 over the wrong axis: take the softmax over the keys (dim=-1)", dict(dim=-2),
     lambda c: not _MASKED(c)),
    ("attn_dim is ignored (attention always runs along axis -2): move self.attn_dim next to the "
     "channels, and back after the heads are merged", dict(attn_dim=-2), None),
    ("the pair bias is broadcast from the right: its leading axes are the leading batch axes of the "
     "scores, so insert singleton axes after them (bias.view(*bias.shape[:-3], 1, ..., 1, "
     "*bias.shape[-3:]))", dict(bias_align="right"), given("bias")),
    (_MASK_ON_QUERIES, dict(mask_on="queries"), _MASKED),
    (_MASK_ON_QUERIES, dict(mask_on="queries", fill="offset"), _MASKED),
    ("the attention_mask looks inverted: keys where it is 0 get no weight, keys where it is 1 are kept",
     dict(mask_on="inverted"), _MASKED),
    ("the attention_mask is read in the wrong layout: it is (*, k), with the attention axis last "
     "(for column attention (B, N_res, N_seq)); do not move its axes like x's",
     dict(mask_on="transposed"), lambda c: _MASKED(c) and _square(c.kwargs["attention_mask"])),
    ("a query whose keys are all masked should get zero weights (so its output is linear_o's bias), "
     "not a softmax over masked keys: the -1e8 offset leaves such rows unchanged. " + _MASK_CODE,
     dict(fill="offset"), _MASKED),
    ("(attention_mask == 0) * -inf is NaN on every kept key (0 * -inf = NaN), so every row is NaN. "
     + _MASK_CODE, dict(fill="times-inf"), _MASKED),
    ("a query whose keys are all masked gives NaN (softmax of all -inf): give such rows zero "
     "weights (masked_fill after the softmax), so their output is linear_o's bias", dict(fill="nan"), _MASKED),
    ("the gate is applied after linear_o: multiply the heads' output by sigmoid(linear_g(x)) before "
     "linear_o", dict(gate="after"), _init("gated")),
    ("the gate needs a sigmoid: multiply by torch.sigmoid(linear_g(x))", dict(gate="no-sigmoid"), _init("gated")),
    ("gating has no effect: with gated=True multiply the heads' output by sigmoid(linear_g(x)) before "
     "linear_o", dict(gate="none"), _init("gated")),
    ("global attention averages the queries (one query per head, prepare_qkv_global), not the "
     "outputs of every query", dict(global_mean="outputs"), _init("is_global")),
]


HINTS = {
    "prepare_qkv": Hints(_mistakes(_prepare, PREPARE_MISTAKES), correct=_prepare, explain=EXPLAIN["prepare_qkv"]),
    "prepare_qkv_global": Hints(_mistakes(_prepare, PREPARE_MISTAKES + GLOBAL_MISTAKES), correct=_prepare,
                                explain=EXPLAIN["prepare_qkv"]),
    "MultiHeadAttention": Hints(_mistakes(_forward, FORWARD_MISTAKES), correct=_forward, explain=EXPLAIN["prepare_qkv"]),
}

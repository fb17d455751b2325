"""Chapter 3: split_heads, merge_heads, MultiHeadAttention and MultiHeadSelfAttention.

The cases follow the contract (book/exercise_api.md): split/merge run unbatched and with extra
leading dimensions; the modules run self- and cross-attention (key only, key and value),
L_q != L_k, every mask layout the contract names (bool and float, fully masked rows), bias=False,
odd sizes, float32, the ValueError, and dropout in eval mode (it must be off) and in training
mode with p = 0 (it must equal eval). Every parameter gets its own random values, so a swapped
layer shows.

Dropout in training mode with p > 0 cannot be compared value for value (the student's random
stream need not match the reference's), so `dropout_properties` checks what must hold whatever
the stream: each weight is either dropped (0) or kept and scaled by 1/(1-p), about p of them are
dropped, and the output is the one those very weights give. The chapter's `compare` (which
`autograder.cases.compare` calls in place of the generic one) applies it.
"""
from __future__ import annotations

import functools
import math

import torch

from .inputs import bool_mask, distinct_state, float_mask, randn
from . import Hints, Mistake, call
from ..selfcheck.rules.ch03_multi_head_attention import (  # noqa: F401  (compare: the chapter's rule)
    EXPLAIN, compare, is_dropout_probe)
from .mistake_models import (FLOAT_MASK_AS_BOOL, bool_given, float_given, fully_masked_row, linear, softmax_weights)

DROPOUT_P = 0.5


def cases(exercise, gen, ref, quick):
    if exercise == "split_heads":
        return _split_cases(gen, quick)
    if exercise == "merge_heads":
        return _merge_cases(gen, quick)
    if exercise == "MultiHeadAttention":
        return _mha_cases(gen, ref, quick)
    if exercise == "MultiHeadSelfAttention":
        return _mhsa_cases(gen, ref, quick)
    raise KeyError(exercise)


# ----------------------------------------------------------------------------- split / merge
def _split_cases(gen, quick):
    g = ["args.0"]
    cs = [
        call("batch (2, 3), L=5, D=12, 3 heads (d_h=4 != H)", randn(gen, 2, 3, 5, 12), 3, grad=g),
        call("unbatched (4, 10), 2 heads (d_h=5)", randn(gen, 4, 10), 2, grad=g),
    ]
    if quick:
        return cs
    return cs + [
        call("batch (2,), L=3, D=6, 1 head", randn(gen, 2, 3, 6), 1, grad=g),
        call("batch (3,), L=4, D=5, 5 heads (d_h=1)", randn(gen, 3, 4, 5), 5, grad=g),
        call("four leading dims (2, 1, 3, 2), L=1, D=15, 3 heads", randn(gen, 2, 1, 3, 2, 1, 15), 3, grad=g),
        call("batch (2,), L=6, D=8, 4 heads, float32", randn(gen, 2, 6, 8), 4, dtype="float32"),
    ]


def _merge_cases(gen, quick):
    g = ["args.0"]
    cs = [
        call("batch (2,), 3 heads, L=5, d_h=4", randn(gen, 2, 3, 5, 4), grad=g),
        call("unbatched (2 heads, L=4, d_h=3)", randn(gen, 2, 4, 3), grad=g),
    ]
    if quick:
        return cs
    return cs + [
        call("batch (2, 3), 4 heads, L=3, d_h=5", randn(gen, 2, 3, 4, 3, 5), grad=g),
        call("batch (3,), 1 head, L=4, d_h=6", randn(gen, 3, 1, 4, 6), grad=g),
        call("batch (2,), 5 heads, L=1, d_h=1 (odd sizes)", randn(gen, 2, 5, 1, 1), grad=g),
        call("batch (2,), 4 heads, L=6, d_h=2, float32", randn(gen, 2, 4, 6, 2), dtype="float32"),
    ]


# ----------------------------------------------------------------------------- MultiHeadAttention
def _mha_call(name, gen, cls, *, E, H, B=2, Lq=5, Lk=None, inputs="self", bias=True, dropout=None,
              mask=None, train=False, dtype="float64", grad=True, scale=1.0):
    """A MultiHeadAttention call. inputs: "self" (query only), "key" (query and key, value
    defaults to key) or "kv" (query, key and value)."""
    init = {"embed_dim": E, "num_heads": H}
    if not bias:
        init["bias"] = False
    if dropout is not None:
        init["dropout"] = dropout
    state = distinct_state(cls(**init), gen)
    Lk = Lq if Lk is None else Lk
    args = [randn(gen, B, Lq, E, scale=scale)]
    if inputs in ("key", "kv"):
        args.append(randn(gen, B, Lk, E, scale=scale))
    if inputs == "kv":
        args.append(randn(gen, B, Lk, E, scale=scale))
    kwargs = {"mask": mask} if mask is not None else {}
    g = ["args.0", "params"] + (["args.1"] if len(args) > 1 else []) + (["args.2"] if len(args) > 2 else [])
    if mask is not None and mask.is_floating_point():
        g.append("kwargs.mask")
    return call(name, *args, init=init, state=state, kwargs=kwargs, train=train,
                grad=g if grad else [], dtype=dtype)


def _mha_cases(gen, ref, quick):
    cls = ref["MultiHeadAttention"]
    # The quick cases (the self-check's) cover every rule the exercise states: fully masked rows,
    # bool and float masks, key/value defaults, bias=False, the ValueError, dropout off in eval mode.
    cs = [
        _mha_call("self-attention (query only), B=2, L=5, E=12, 3 heads, bool mask (L, L) with a "
                  "fully masked row", gen, cls, E=12, H=3, Lq=5, mask=bool_mask(gen, 5, 5, full_rows=1)),
        _mha_call("cross-attention, key and value given, L_q=3 != L_k=6, E=8, 2 heads, padding mask "
                  "(B, 1, 1, L_k)", gen, cls, E=8, H=2, Lq=3, Lk=6, inputs="kv",
                  mask=bool_mask(gen, 2, 1, 1, 6, p=0.4, full_rows=0)),
        _mha_call("cross-attention with key only (value defaults to key), L_q = L_k = 6, E=12, 4 heads",
                  gen, cls, E=12, H=4, Lq=6, Lk=6, inputs="key"),
        _mha_call("additive float mask (B, H, L_q, L_k) with a fully masked (-inf) row, L_q=3, L_k=5",
                  gen, cls, E=6, H=2, Lq=3, Lk=5, inputs="kv",
                  mask=float_mask(gen, 2, 2, 3, 5, full_rows=1)),
        _mha_call("bias=False, cross-attention, L_q=6, L_k=2", gen, cls, E=8, H=2, Lq=6, Lk=2,
                  inputs="kv", bias=False),
        call("embed_dim=10, num_heads=4 must raise ValueError", randn(gen, 2, 3, 10),
             init={"embed_dim": 10, "num_heads": 4}, expect_error="ValueError"),
        _dropout_probe(gen, cls, train=False),
    ]
    if quick:
        return cs + [_dropout_probe(gen, cls, train=True)]
    return cs + [
        _mha_call("cross-attention with key only, L_q=4 != L_k=7, E=10, 2 heads", gen, cls, E=10, H=2,
                  Lq=4, Lk=7, inputs="key"),
        _mha_call("bool mask (B, H, L_q, L_k) with several fully masked rows, B=3, 3 heads",
                  gen, cls, E=9, H=3, B=3, Lq=4, Lk=6, inputs="kv",
                  mask=bool_mask(gen, 3, 3, 4, 6, p=0.4, full_rows=3)),
        _mha_call("padding mask (B, 1, 1, L_k) masking every key of one batch element",
                  gen, cls, E=8, H=4, Lq=3, Lk=4, inputs="key",
                  mask=bool_mask(gen, 2, 1, 1, 4, p=0.3, full_rows=1)),
        _mha_call("float mask (L_q, L_k), self-attention, B=3", gen, cls, E=10, H=5, B=3, Lq=4,
                  mask=float_mask(gen, 4, 4)),
        _mha_call("one head, E=5 (odd), L_q=1", gen, cls, E=5, H=1, Lq=1, Lk=3, inputs="kv"),
        _mha_call("E=6, 6 heads (d_h=1), B=1", gen, cls, E=6, H=6, B=1, Lq=4, Lk=5, inputs="kv"),
        _mha_call("large inputs (scaled by 30): the softmax must stay finite", gen, cls, E=8, H=2, Lq=4,
                  mask=bool_mask(gen, 4, 4, full_rows=0), scale=30.0),
        _mha_call("dropout=0.0 in training mode: same as eval", gen, cls, E=8, H=4, Lq=5, Lk=3,
                  inputs="kv", dropout=0.0, train=True),
        _mha_call("float32, cross-attention, bool mask (B, 1, 1, L_k)", gen, cls, E=12, H=3, Lq=4,
                  Lk=6, inputs="kv", mask=bool_mask(gen, 2, 1, 1, 6, full_rows=0), dtype="float32"),
    ] + [_dropout_probe(gen, cls, train=True)]


def _dropout_probe(gen, cls, train):
    """A dropout=0.5 call whose output shows which weights were dropped: v_proj and out_proj are identities
    (out_proj with a known bias), and each value row is one-hot within every head, plus a feature
    that is 1 for all keys. So output[b, i, h*d_h + j] - bias is the weight of query i on key j
    in head h as it multiplied the values, and output[b, i, h*d_h + L_k] - bias their sum.
    """
    B, H, Lq, Lk = 8, 2, 8, 5
    d_h = Lk + 1
    E = H * d_h
    init = {"embed_dim": E, "num_heads": H, "dropout": DROPOUT_P}
    state = distinct_state(cls(**init), gen)
    eye = torch.eye(E, dtype=torch.float64)
    state.update({"v_proj.weight": eye, "v_proj.bias": torch.zeros(E, dtype=torch.float64),
                  "out_proj.weight": eye.clone(),
                  "out_proj.bias": torch.arange(E, dtype=torch.float64) / 8 - 0.75})  # exact in float32
    value = torch.zeros(B, Lk, E, dtype=torch.float64)
    for h in range(H):
        value[:, :, h * d_h: h * d_h + Lk] = torch.eye(Lk, dtype=torch.float64)
        value[:, :, h * d_h + Lk] = 1.0
    name = (f"dropout={DROPOUT_P} in training mode: weights dropped and rescaled, once" if train else
            f"dropout={DROPOUT_P} in eval mode: no dropout at all")
    return call(name, randn(gen, B, Lq, E), randn(gen, B, Lk, E), value, init=init, state=state,
                train=train, grad=[] if train else ["args.0", "args.1", "params"])


# ----------------------------------------------------------------------------- MultiHeadSelfAttention
def _mhsa_call(name, gen, cls, *, E, H, B=2, N=5, bias=True, mask=None, dtype="float64"):
    init = {"embed_dim": E, "num_heads": H}
    if not bias:
        init["bias"] = False
    state = distinct_state(cls(**init), gen)
    kwargs = {"mask": mask} if mask is not None else {}
    g = ["args.0", "params"] + (["kwargs.mask"] if mask is not None and mask.is_floating_point() else [])
    return call(name, randn(gen, B, N, E), init=init, state=state, kwargs=kwargs, grad=g, dtype=dtype)


def _mhsa_cases(gen, ref, quick):
    cls = ref["MultiHeadSelfAttention"]
    cs = [
        _mhsa_call("B=2, N=5, E=12, 3 heads (d_h=4 != H), bool mask (N, N) with a fully masked row",
                   gen, cls, E=12, H=3, mask=bool_mask(gen, 5, 5, full_rows=1)),
        _mhsa_call("no mask, B=3, N=4, E=8, 2 heads", gen, cls, E=8, H=2, B=3, N=4),
        _mhsa_call("bias=False, additive float mask (B, H, N, N)", gen, cls, E=8, H=4, N=3, bias=False,
                   mask=float_mask(gen, 2, 4, 3, 3)),
    ]
    if not quick:
        cs += [
            _mhsa_call("bias=False, padding mask (B, 1, 1, N)", gen, cls, E=10, H=2, N=6, bias=False,
                       mask=bool_mask(gen, 2, 1, 1, 6, p=0.4, full_rows=0)),
            _mhsa_call("one head, E=5 (odd), N=1", gen, cls, E=5, H=1, N=1),
            _mhsa_call("float32, E=12, 4 heads", gen, cls, E=12, H=4, N=5,
                       mask=bool_mask(gen, 5, 5, full_rows=0), dtype="float32"),
        ]
    # (last, so the cases above keep their inputs) the rule for float masks, on purpose: it was
    # left to the chance of the random mask above
    return cs + [_mhsa_call("additive float mask (N, N) with a fully masked (-inf) row", gen, cls, E=6, H=2,
                            N=4, mask=float_mask(gen, 4, 4, full_rows=1))]


# ----------------------------------------------------------------------------- training-mode dropout


# ----------------------------------------------------------------------------- hints
# Plain-torch mistake models (see autograder.cases.Mistake): each recomputes the call with one
# named mistake.
def _split(x, H, order="hd"):
    *lead, L, D = x.shape
    if order == "hd":
        return x.reshape(*lead, L, H, D // H).transpose(-3, -2)
    if order == "dh":  # view(..., d_h, H): head h holds features h, h+H, h+2H, ...
        return x.reshape(*lead, L, D // H, H).movedim(-1, -3)
    if order == "no-transpose":  # reshape straight to (..., H, L, d_h)
        return x.reshape(*lead, H, L, D // H)
    raise ValueError(order)


def _merge(x, order="hd"):
    *lead, H, L, d = x.shape
    if order == "hd":
        return x.transpose(-3, -2).reshape(*lead, L, H * d)
    if order == "dh":
        return x.movedim(-3, -1).reshape(*lead, L, d * H)
    if order == "no-transpose":
        return x.reshape(*lead, L, H * d)
    raise ValueError(order)


def _attend(q, k, v, mask, scale="d_h", dim=-1, invert=False, full_rows="zero", float_as_bool=None):
    d_h = q.shape[-1]
    H = q.shape[-3] if q.dim() >= 3 else 1
    s = q @ k.transpose(-2, -1)
    s = s / {"d_h": math.sqrt(d_h), "E": math.sqrt(d_h * H), "none": 1.0, "d_h^1": d_h}[scale]
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = ~mask if invert else mask
            s = s.masked_fill(~keep, -1e9 if full_rows == "uniform" else float("-inf"))
        elif float_as_bool is not None:  # masked_fill(mask == 0, float_as_bool), then a plain softmax
            w = torch.softmax(s.masked_fill(mask == 0, float_as_bool), dim=dim)
            return w @ v, w
        else:
            s = s + mask
    w = softmax_weights(s, dim, "zero" if full_rows == "zero" else "softmax")  # "nan", "uniform" (-1e9)
    return w @ v, w


def _mha_model(call, *, split="hd", merge=None, scale="d_h", dim=-1, invert=False, full_rows="zero",
               value_default="key", out_proj=True, layout="3hd", float_as_bool=None):
    st = {k: v.double() for k, v in call.state.items()}
    args = [a.double() for a in call.args]
    mask = call.kwargs.get("mask")
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    H = call.init["num_heads"]
    merge = split if merge is None else merge
    if call.exercise == "MultiHeadSelfAttention":
        x = args[0]
        B, N, E = x.shape
        qkv = linear(x, st, "qkv_proj")
        if layout == "3hd":
            q, k, v = qkv.view(B, N, 3, H, E // H).permute(2, 0, 3, 1, 4)
        elif layout == "h3d":
            q, k, v = qkv.view(B, N, H, 3, E // H).permute(3, 0, 2, 1, 4)
        else:  # "3dh"
            q, k, v = qkv.view(B, N, 3, E // H, H).permute(2, 0, 4, 1, 3)
    else:
        query = args[0]
        key = args[1] if len(args) > 1 else query
        value = args[2] if len(args) > 2 else {"key": key, "query": query}[value_default]
        q = _split(linear(query, st, "q_proj"), H, split)
        k = _split(linear(key, st, "k_proj"), H, split)
        v = _split(linear(value, st, "v_proj"), H, split)
    o, w = _attend(q, k, v, mask, scale, dim, invert, full_rows, float_as_bool)
    o = _merge(o, merge)
    return [linear(o, st, "out_proj") if out_proj else o, w]


def _model(**mistake):
    return functools.partial(_mha_model, **mistake)


_bool_mask, _float_mask, _dead_row = bool_given("mask"), float_given("mask"), fully_masked_row("mask")

_FULL_ROWS_NAN = ("a query whose keys are all masked gives NaN (softmax of all -inf): give such rows "
                  "zero weights (masked_fill after the softmax), so their output is out_proj's bias")
ATTENTION_MISTAKES = (
    Mistake("the weights are right but the output is not: merge the heads back by transposing to "
            "(B, L, H, d_h) before flattening to (B, L, E)", _model(merge="no-transpose")),
    Mistake("the weights are right but the output is not: merge the heads in the order (B, L, H, d_h), so "
            "head h fills features h*d_h to (h+1)*d_h - 1", _model(merge="dh")),
    Mistake("scores look unscaled: divide q·k by sqrt(d_h) (the per-head dimension) before the softmax",
            _model(scale="none")),
    Mistake("scores are divided by sqrt(embed_dim): divide by sqrt(d_h) = sqrt(embed_dim / num_heads)",
            _model(scale="E")),
    Mistake("scores are divided by d_h: divide by sqrt(d_h)", _model(scale="d_h^1")),
    Mistake("the weights sum to 1 over the wrong axis: take the softmax over the keys (dim=-1)", _model(dim=-2)),
    Mistake("the mask looks inverted: True means 'may attend' (keep), False means masked out",
            _model(invert=True), when=_bool_mask),
    Mistake("a fully masked row should give zero weights and a zero output, not a uniform average "
            "(-1e9 instead of -inf, or no zeroing after the softmax?)", _model(full_rows="uniform"),
            when=lambda c: _bool_mask(c) and _dead_row(c)),
    Mistake(_FULL_ROWS_NAN, _model(full_rows="nan"), when=_dead_row),
    Mistake("out_proj is missing: the merged heads go through out_proj", _model(out_proj=False)),
    Mistake(FLOAT_MASK_AS_BOOL, _model(float_as_bool=-1e9), when=_float_mask),
    Mistake(FLOAT_MASK_AS_BOOL, _model(float_as_bool=float("-inf")), when=_float_mask),
)
MHA_MISTAKES = ATTENTION_MISTAKES + (
    Mistake("the heads are split in the wrong order: reshape to (..., L, num_heads, d_h), not (..., L, d_h, "
            "num_heads), so that head h holds features h*d_h to (h+1)*d_h - 1", _model(split="dh", merge="hd")),
    Mistake("the heads are split and merged in the wrong order: use (..., L, num_heads, d_h), not "
            "(..., L, d_h, num_heads), in both split and merge", _model(split="dh")),
    Mistake("the heads are made by reshaping straight to (..., H, L, d_h), which mixes positions: reshape to "
            "(..., L, H, d_h) and then transpose L and H", _model(split="no-transpose", merge="hd")),
    Mistake("when value is None it defaults to key (which itself defaults to query), not to query",
            _model(value_default="query"), when=lambda c: len(c.args) < 3),
)
MHSA_MISTAKES = ATTENTION_MISTAKES + (
    Mistake("the fused projection is read as (B, N, H, 3, d_h): its output is laid out (B, N, 3, H, d_h) "
            "(all queries, then all keys, then all values, as in nn.MultiheadAttention's in_proj_weight)",
            _model(layout="h3d")),
    Mistake("the fused projection is read as (B, N, 3, d_h, H): its output is laid out (B, N, 3, H, d_h)",
            _model(layout="3dh")),
)


def _split_model(order="hd"):
    return lambda c: _split(c.args[0].double(), c.args[1], order)


def _merge_model(order="hd"):
    return lambda c: _merge(c.args[0].double(), order)


HINTS = {
    "split_heads": Hints((
        Mistake("the heads are split in the wrong order: reshape to (..., L, num_heads, D // num_heads) "
                "(head h holds features h*d_h to (h+1)*d_h - 1), then transpose L and num_heads", _split_model("dh")),
        Mistake("reshaping straight to (..., num_heads, L, d_h) mixes positions: reshape to "
                "(..., L, num_heads, d_h), then transpose the L and num_heads axes", _split_model("no-transpose")),
    ), correct=_split_model()),
    "merge_heads": Hints((
        Mistake("the heads are merged without transposing back: transpose (..., H, L, d_h) to "
                "(..., L, H, d_h), then flatten the last two axes", _merge_model("no-transpose")),
        Mistake("the heads are merged in the wrong order: transpose to (..., L, H, d_h) (not "
                "(..., L, d_h, H)) before flattening, so head h fills features h*d_h onwards", _merge_model("dh")),
    ), correct=_merge_model()),
    "MultiHeadAttention": Hints(MHA_MISTAKES, correct=_mha_model, explain=EXPLAIN["MultiHeadAttention"],
                                fully_masked=_FULL_ROWS_NAN),
    "MultiHeadSelfAttention": Hints(MHSA_MISTAKES, correct=_mha_model, explain=EXPLAIN["MultiHeadSelfAttention"],
                                    fully_masked=_FULL_ROWS_NAN),
}


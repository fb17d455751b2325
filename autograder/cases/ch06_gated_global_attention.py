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

import math
import re

import torch

from ..inputs import distinct_state, randn
from . import call


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
        _forward_call("attention_mask (B, S, R) with fully masked rows: zero weights", gen, cls, c_in=6, c=4,
                      N_head=2, attn_dim=-2, x_shape=(2, 3, 5), gated=True,
                      mask=_mask(gen, 2, 3, 5, dead=2)),
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
# Plain-torch "mistake models" of the module: each recomputes the call with one named mistake. A
# hint is given only when exactly one model reproduces the student's result (values, or the same
# shapes when the shapes are wrong, or the same broadcasting error) and the mistake-free model
# reproduces the reference.
def _linear(x, st, name):
    y = x @ st[f"{name}.weight"].T
    b = st.get(f"{name}.bias")
    return y if b is None else y + b


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
    q, k, v = _linear(x, st, "linear_q"), _linear(x, st, "linear_k"), _linear(x, st, "linear_v")
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
        m = m[..., None, :, None] if mask_on == "queries" else m[..., None, None, :]
        if fill == "offset":  # the worksheet's -1e8 offset: a fully masked row stays a softmax
            s = s + (~m) * -1e8
        else:
            s = s.masked_fill(~m, float("-inf"))
    dead = torch.isneginf(s).all(-1, keepdim=True)  # queries with no key left
    w = torch.softmax(s.masked_fill(dead, 0.0), dim=dim).masked_fill(dead, 0.0)
    o = w @ v
    if init.get("is_global") and global_mean == "outputs":
        o = o.mean(-2, keepdim=True)
    o = o.transpose(-3, -2).flatten(-2).movedim(-2, ad)
    if init.get("gated"):
        g = _linear(x, st, "linear_g")
        if gate == "sigmoid":
            o = torch.sigmoid(g) * o
        elif gate == "no-sigmoid":
            o = g * o
        elif gate == "after":
            return [torch.sigmoid(g) * _linear(o, st, "linear_o")]
    return [_linear(o, st, "linear_o")]


PREPARE_MISTAKES = [
    ("attn_dim is ignored: move the attention axis next to the channels first "
     "(t.movedim(self.attn_dim, -2))", dict(move=False)),
    ("the heads are split in the wrong order: view the channels as (N_head, c), not (c, N_head), so "
     "head h holds channels h*c to (h+1)*c - 1", dict(order="ch")),
    ("reshaping straight to (*, N_head, q, c) mixes positions: view as (*, q, N_head, c), then "
     "transpose the q and N_head axes", dict(order="no-transpose")),
    ("k and v are reshaped with the shape of q: each tensor keeps its own length along attn_dim",
     dict(q_len_for_kv=True)),
]
GLOBAL_MISTAKES = [
    ("keep the averaged query axis: torch.mean(q, dim=-2, keepdim=True) gives (*, N_head, 1, c)",
     dict(keepdim=False)),
    ("the queries are summed: average them over the query axis (torch.mean)", dict(reduce="sum")),
    ("keys and values get their singleton head axis just before the k axis: k.unsqueeze(-3) gives "
     "(*, 1, k, c), which broadcasts against the N_head query heads", dict(kv_unsqueeze=-2)),
    ("keys and values get their singleton head axis just before the k axis: k.unsqueeze(-3) gives "
     "(*, 1, k, c), which broadcasts against the N_head query heads", dict(kv_unsqueeze=0)),
]
FORWARD_MISTAKES = [
    ("scores are divided by sqrt(c * N_head): divide the queries by sqrt(c), the channels per head",
     dict(scale="cN")),
    ("scores look unscaled: divide the queries by sqrt(c) before the dot products", dict(scale="none")),
    ("the weights sum to 1 over the wrong axis: take the softmax over the keys (dim=-1)", dict(dim=-2)),
    ("attn_dim is ignored (attention always runs along axis -2): move self.attn_dim next to the "
     "channels, and back after the heads are merged", dict(attn_dim=-2)),
]
BIAS_MISTAKES = [
    ("the pair bias is broadcast from the right: its leading axes are the leading batch axes of the "
     "scores, so insert singleton axes after them (bias.view(*bias.shape[:-3], 1, ..., 1, "
     "*bias.shape[-3:]))", dict(bias_align="right")),
]
_MASK_ON_QUERIES = ("the attention_mask acts on the queries: it masks keys, attention_mask[..., None, "
                    "None, :] lines it up with the last (k) axis of the (*, N_head, q, k) scores")
MASK_MISTAKES = [
    (_MASK_ON_QUERIES, dict(mask_on="queries")),
    (_MASK_ON_QUERIES, dict(mask_on="queries", fill="offset")),
    ("the attention_mask looks inverted: keys where it is 0 get no weight, keys where it is 1 are kept",
     dict(mask_on="inverted")),
    ("a query whose keys are all masked should get zero weights (so its output is linear_o's bias), "
     "not a softmax over masked keys: the -1e8 offset leaves such rows unchanged; use -inf and zero "
     "the fully masked rows after the softmax", dict(fill="offset")),
]
GATE_MISTAKES = [
    ("the gate is applied after linear_o: multiply the heads' output by sigmoid(linear_g(x)) before "
     "linear_o", dict(gate="after")),
    ("the gate needs a sigmoid: multiply by torch.sigmoid(linear_g(x))", dict(gate="no-sigmoid")),
    ("gating has no effect: with gated=True multiply the heads' output by sigmoid(linear_g(x)) before "
     "linear_o", dict(gate="none")),
]
GLOBAL_FORWARD_MISTAKES = [
    ("global attention averages the queries (one query per head, prepare_qkv_global), not the "
     "outputs of every query", dict(global_mean="outputs")),
]


def _tol(call):
    """Looser than grading: a mistake changes values at O(1), and the executor loads float64
    weights through a float32 module (a relative rounding of about 1e-8)."""
    return (1e-5, 1e-7) if call.dtype == "float64" else (1e-3, 1e-5)


_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
                        r"at non-singleton dimension (\d+)")


def _error_key(message: str):
    """A broadcasting error, regardless of the operands' order."""
    m = _BROADCAST.search(message or "")
    return (frozenset(m.group(1, 2)), m.group(3)) if m else None


def _run(fn, call, kw):
    """('ok', outputs) or ('error', key) for one mistake model."""
    try:
        with torch.no_grad():
            return "ok", fn(call, **kw)
    except RuntimeError as e:
        return "error", _error_key(str(e))
    except Exception:
        return "error", None


def _same(call, outcome, result, shapes_only) -> bool:
    kind, value = result
    if outcome.error:
        key = _error_key(outcome.error.get("message", ""))
        return kind == "error" and key is not None and key == value
    if kind != "ok" or len(outcome.outputs) != len(value):
        return False
    rtol, atol = _tol(call)
    for a, b in zip(outcome.outputs, value):
        if a is None or tuple(a.shape) != tuple(b.shape):
            return False
        if not shapes_only and not torch.allclose(torch.nan_to_num(a.double()), b, rtol=rtol, atol=atol):
            return False
    return True


def _one_match(call, student, expected, fn, mistakes, shapes_only=False) -> str | None:
    if not _same(call, expected, _run(fn, call, {}), False):
        return None  # the mistake-free model does not reproduce the reference here: say nothing
    found = set()
    for text, kw in mistakes:
        result = _run(fn, call, kw)
        if _same(call, student, result, shapes_only) and not _same(call, expected, result, shapes_only):
            found.add(text)
    return found.pop() if len(found) == 1 else None


def _params_hint(call, student, expected):
    sp, ep = student.params or {}, expected.params or {}
    init = call.init or {}
    c, H = init.get("c"), init.get("N_head")
    if init.get("is_global") and sp.get("linear_k.weight", [None])[0] == c * H != c:
        return ("with is_global, linear_k and linear_v map c_in to c channels: one key/value head "
                "shared by all N_head query heads")
    if "linear_g.weight" in ep and "linear_g.weight" not in sp:
        return "with gated=True the module needs linear_g = nn.Linear(c_in, c * N_head) (with a bias)"
    if "linear_o.bias" in ep and "linear_o.bias" not in sp:
        return "linear_o always has a bias (only linear_q/k/v follow use_bias_for_embeddings)"
    if "linear_q.bias" in sp and "linear_q.bias" not in ep:
        return "linear_q, linear_k and linear_v have a bias only when use_bias_for_embeddings=True"
    if "linear_q.bias" in ep and "linear_q.bias" not in sp:
        return "with use_bias_for_embeddings=True, linear_q, linear_k and linear_v have a bias"
    return None


def _nan_rows_hint(call, student):
    """NaN exactly in the rows whose keys the attention_mask masks entirely."""
    mask = call.kwargs.get("attention_mask")
    if mask is None or not student.outputs or student.outputs[0] is None:
        return None
    try:
        out = student.outputs[0].movedim(call.init["attn_dim"], -2)   # (*, q, c_in)
        nan_rows = torch.isnan(out).any(-1).any(-1)                    # (*,)
        dead = (mask == 0).all(-1).expand(nan_rows.shape)
    except Exception:
        return None
    if nan_rows.any() and not (nan_rows & ~dead).any():
        return ("a query whose keys are all masked gives NaN (softmax of all -inf): give such rows zero "
                "weights (masked_fill after the softmax), so their output is linear_o's bias")
    return None


def hint(call, student, expected, mismatch):
    if mismatch.aspect == "params":
        return _params_hint(call, student, expected)
    if mismatch.aspect == "nonfinite":
        return _nan_rows_hint(call, student)
    if mismatch.aspect not in ("values", "shape", "error"):
        return None
    shapes_only = mismatch.aspect == "shape"
    if call.exercise in ("prepare_qkv", "prepare_qkv_global"):
        mistakes = PREPARE_MISTAKES + (GLOBAL_MISTAKES if call.exercise == "prepare_qkv_global" else [])
        return _one_match(call, student, expected, _prepare, mistakes, shapes_only)
    mistakes = list(FORWARD_MISTAKES)
    if call.kwargs.get("bias") is not None:
        mistakes += BIAS_MISTAKES
    if call.kwargs.get("attention_mask") is not None:
        mistakes += MASK_MISTAKES
    if call.init.get("gated"):
        mistakes += GATE_MISTAKES
    if call.init.get("is_global"):
        mistakes += GLOBAL_FORWARD_MISTAKES
    return _one_match(call, student, expected, _forward, mistakes, shapes_only)

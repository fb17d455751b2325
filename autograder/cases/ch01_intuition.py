"""Chapter 1: softmax and attention_pool.

softmax is graded on any shape and any `dim` (negative and 0 included), on inputs of ±1000 (a
naive exp overflows), and on -inf entries; attention_pool unbatched and with leading batch
dimensions, d_v != d, and on dot products large enough to overflow a naive exp.
"""
from __future__ import annotations

import math

import torch

from .inputs import randn
from . import Hints, Mistake, call
from ..selfcheck.rules.ch01_intuition import EXPLAIN, _dim_of, _x


def cases(exercise, gen, ref, quick):
    if exercise == "softmax":
        return _softmax_cases(gen, quick)
    if exercise == "attention_pool":
        return _pool_cases(gen, quick)
    raise KeyError(exercise)


# ----------------------------------------------------------------------------- inputs
def _huge(gen, rows: int, cols: int) -> torch.Tensor:
    """Rows near +1000, rows near -1000 and rows mixing both: a naive exp overflows (inf/inf)
    and a max over the whole tensor instead of along `dim` underflows (0/0)."""
    x = randn(gen, rows, cols, scale=3.0)
    signs = torch.ones(rows, cols, dtype=torch.float64)
    signs[1::3] = -1.0
    signs[2::3, ::2] = -1.0
    return x + 1000.0 * signs


def _with_neg_inf(gen, *shape: int, p: float = 0.3) -> torch.Tensor:
    """Random values with about p of the entries -inf, never a whole row along the last axis."""
    x = randn(gen, *shape, scale=2.0)
    drop = torch.rand(shape, generator=gen) < p
    drop[..., 0] = False
    return x.masked_fill(drop, float("-inf"))


def _all_neg_inf_row(gen, rows: int, cols: int, row: int) -> torch.Tensor:
    """-inf entries, and one row entirely -inf (whose probabilities are all 0 by the contract)."""
    x = _with_neg_inf(gen, rows, cols)
    x[row] = float("-inf")
    return x


def _softmax_cases(gen, quick):
    g = ["args.0"]
    huge = call("inputs of ±1000, (6, 5), dim=-1 (exp overflows unless the max is subtracted)",
                _huge(gen, 6, 5), grad=g)
    dim1 = call("3-D (2, 5, 3), dim=1", randn(gen, 2, 5, 3, scale=2.0), kwargs={"dim": 1}, grad=g)
    neg_inf = call("-inf entries get probability 0, (4, 6)", _with_neg_inf(gen, 4, 6), grad=g)
    empty = call("a slice that is entirely -inf gives all zeros (like a fully masked attention row)",
                 _all_neg_inf_row(gen, 4, 5, row=2))
    if quick:
        return [huge, dim1, neg_inf, empty]
    # Moderate inputs first: the CUDA test repeats the first cases in float16 / bfloat16, where
    # inputs of ±1000 are too coarse for a fair comparison of equally stable formulas.
    return [dim1, neg_inf, call("2-D (4, 7), default dim", randn(gen, 4, 7, scale=2.0), grad=g), huge] + [
        call("1-D vector (9,)", randn(gen, 9), grad=g),
        call("dim=0 on (5, 3)", randn(gen, 5, 3, scale=2.0), kwargs={"dim": 0}, grad=g),
        call("dim=-2 on 4-D (2, 3, 4, 5)", randn(gen, 2, 3, 4, 5), kwargs={"dim": -2}, grad=g),
        call("dim given positionally: softmax(x, 2) on (3, 2, 4)", randn(gen, 3, 2, 4), 2, grad=g),
        call("inputs of ±1000 along dim=0, (5, 6)", _huge(gen, 6, 5).T.contiguous(), kwargs={"dim": 0}),
        call("-inf entries along dim=1 of (2, 5, 3)",
             _with_neg_inf(gen, 2, 3, 5).transpose(1, 2).contiguous(), kwargs={"dim": 1}, grad=g),
        call("a single entry along dim (3, 1): probability 1", randn(gen, 3, 1), grad=g),
        empty,
        call("float32 keeps float32, inputs of ±100 (float32's exp overflows at 89)",
             randn(gen, 4, 6, scale=100.0), dtype="float32", grad=g),
    ]


def _large_scores(gen, batch: int, n: int, d: int) -> tuple:
    """query (batch, d) and keys (batch, n, d) whose dot products are exactly +1000 for key 0,
    -800 for key 1 and small for the others: a naive exp overflows, the weights are one-hot."""
    query = randn(gen, batch, d, scale=3.0)
    keys = randn(gen, batch, n, d)
    sq = (query * query).sum(-1, keepdim=True)          # (batch, 1)
    keys[:, 0] = query * (1000.0 / sq)
    keys[:, 1] = query * (-800.0 / sq)
    return query, keys


def _pool_cases(gen, quick):
    g = ["args.0", "args.1", "args.2"]
    cs = [
        call("unbatched: query (4,), keys (6, 4), values (6, 3)",
             randn(gen, 4), randn(gen, 6, 4), randn(gen, 6, 3), grad=g),
        call("batch (2, 3): query (2, 3, 5), keys (2, 3, 7, 5), values (2, 3, 7, 2)",
             randn(gen, 2, 3, 5), randn(gen, 2, 3, 7, 5), randn(gen, 2, 3, 7, 2), grad=g),
    ]
    large = call("large dot products (+1000 and -800): the weights must stay finite",
                 *_large_scores(gen, 3, 6, 8), randn(gen, 3, 6, 4), grad=g)
    if quick:
        return cs + [large]
    return cs + [
        call("batch (4,): query (4, 3), keys (4, 5, 3), values (4, 5, 6)",
             randn(gen, 4, 3), randn(gen, 4, 5, 3), randn(gen, 4, 5, 6), grad=g),
        large,
        call("one key (n = 1): weight 1, output = that value",
             randn(gen, 2, 5), randn(gen, 2, 1, 5), randn(gen, 2, 1, 3), grad=g),
        call("d = 1 (odd sizes), n = 5, d_v = 7",
             randn(gen, 1), randn(gen, 5, 1), randn(gen, 5, 7), grad=g),
        call("float32 keeps float32, batch (2,)", randn(gen, 2, 6), randn(gen, 2, 5, 6),
             randn(gen, 2, 5, 4), dtype="float32", grad=g),
    ]


# ----------------------------------------------------------------------------- hints


def _stable(x, dim, keep_empty=False):
    """exp(x - max) / sum along dim; with keep_empty, an all -inf slice gives zeros."""
    m = x.amax(dim, keepdim=True)
    if keep_empty:
        m = m.nan_to_num(neginf=0.0)
    e = torch.exp(x - m)
    s = e.sum(dim, keepdim=True)
    return e / (s.masked_fill(s == 0, 1.0) if keep_empty else s)


def _normalise(e, dim):
    return e / e.sum(dim, keepdim=True)


def _large(call) -> bool:
    finite = _x(call)[torch.isfinite(_x(call))]
    return bool(finite.numel() and finite.abs().max() > 80)


def _empty_slice(call) -> bool:
    x = _x(call)
    return bool((torch.isinf(x) & (x < 0)).all(_dim_of(call)).any())


_OVERFLOW = ("exp overflows (or underflows to 0/0) for large inputs: subtract the maximum taken "
             "along `dim` with keepdim=True (of each slice, not of the whole tensor) before exp")


def _softmax_mistakes(call):
    x, dim = _x(call), _dim_of(call)
    d = dim % x.dim()
    wrong_dims = tuple(
        Mistake(f"the probabilities sum to 1 along dim {other - x.dim()} instead of dim={dim}: use the "
                "`dim` argument for the max, the exp's sum and the division",
                lambda c, o=other: _stable(_x(c), o, keep_empty=True))
        for other in range(x.dim()) if other != d and x.shape[other] > 1)
    return wrong_dims + (
        Mistake(_OVERFLOW, lambda c: _normalise(torch.exp(_x(c)), _dim_of(c)), when=_large),
        Mistake(_OVERFLOW, lambda c: _normalise(torch.exp(_x(c) - _x(c).max()), _dim_of(c)), when=_large),
        Mistake("a slice that is entirely -inf must give all zeros (like a fully masked attention row), "
                "not NaN: its maximum is -inf and -inf - (-inf) = NaN, so shift such a slice by 0, and "
                "divide by 1 where the sum of the exponentials is 0",
                lambda c: _stable(_x(c), _dim_of(c)), when=_empty_slice),
        Mistake("the result is not normalised: divide by the sum of the exponentials along `dim`",
                lambda c: torch.exp(_x(c) - _x(c).amax(_dim_of(c), keepdim=True).nan_to_num(neginf=0.0))),
    )


def _scores(call):
    query, keys = call.args[0].double(), call.args[1].double()
    return (keys @ query.unsqueeze(-1)).squeeze(-1)  # (..., n)


def _pool(call, weights):
    return [(weights.unsqueeze(-2) @ call.args[2].double()).squeeze(-2), weights]


def _pool_mistakes(call):
    raw = _scores(call)
    batch_axes = tuple(
        Mistake("the softmax is taken over a batch axis: take it over the keys (dim=-1)",
                lambda c, a=axis: [None, torch.softmax(_scores(c), a)])
        for axis in range(raw.dim() - 1) if raw.shape[axis] > 1)
    return batch_axes + (
        Mistake("the dot products are scaled by 1/sqrt(d): attention_pool uses the unscaled dot products "
                "keys · query", lambda c: [None, torch.softmax(_scores(c) / math.sqrt(c.args[0].shape[-1]), -1)]),
        Mistake("the weights are not normalised: take the softmax of the scores (they must sum to 1 over "
                "the n keys)", lambda c: [None, _scores(c)]),
        Mistake("the weights are not normalised: divide the exponentials by their sum over the n keys",
                lambda c: [None, torch.exp(_scores(c))]),
        Mistake("exp overflows for large dot products: use a numerically stable softmax (subtract the "
                "maximum along the keys axis first)",
                lambda c: [None, _normalise(torch.exp(_scores(c)), -1)]),
    )


HINTS = {
    "softmax": Hints(_softmax_mistakes, correct=lambda c: _stable(_x(c), _dim_of(c), keep_empty=True),
                     explain=EXPLAIN["softmax"]),
    "attention_pool": Hints(_pool_mistakes, correct=lambda c: _pool(c, torch.softmax(_scores(c), -1)),
                            explain=EXPLAIN["attention_pool"],
                            weights_right="the weights are right but the output is not: the output is the "
                                          "weighted sum of the values, (weights.unsqueeze(-2) @ values).squeeze(-2)"),
}

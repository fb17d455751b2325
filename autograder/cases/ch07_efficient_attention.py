"""Chapter 7: online_softmax_attention, repeat_kv, GroupedQueryAttention (with a KV cache),
sliding_window_mask and alibi_bias.

Graded by behaviour and by the property that makes each technique worth having:
`online_softmax_attention` never holds the L_q x L_k scores: the grader's memory cases
(Call.capped_memory) run where the kernel caps the child's memory far below that matrix, and
the self-check's (Call.measure_memory) record the largest tensor created; `GroupedQueryAttention`'s
cache is graded as returned (H_kv heads, past positions first).

The hints are a table of mistake models, (hint text, model) per exercise (MISTAKES), each model
recomputing the call with one named mistake in float64: a hint is given when exactly one model
reproduces the student's outputs and the mistake-free model reproduces the reference.
"""
from __future__ import annotations

import math
from functools import partial

import torch

from ..runtime.execute import DEVICE_PLACEHOLDER as DEVICE
from .inputs import bool_mask, distinct_state, float_mask, randn
from . import Hints, Mistake, call
from ..selfcheck.rules.ch07_efficient_attention import (  # noqa: F401  (compare: the chapter's rule)
    EXPLAIN, MEMORY_HINT, compare, memory_limit)


def cases(exercise, gen, ref, quick):
    return {
        "online_softmax_attention": _online_cases,
        "repeat_kv": _repeat_cases,
        "GroupedQueryAttention": partial(_gqa_cases, ref=ref),
        "sliding_window_mask": _window_cases,
        "alibi_bias": _alibi_cases,
    }[exercise](gen, quick)


def _online_cases(gen, quick):
    g = ["args.0", "args.1", "args.2"]
    cs = [
        call("block_size=3 does not divide L_k=7, batch (2, 2), d_k=4 != d_v=5, a fully masked query",
             randn(gen, 2, 2, 5, 4), randn(gen, 2, 2, 7, 4), randn(gen, 2, 2, 7, 5),
             kwargs={"mask": bool_mask(gen, 5, 7, full_rows=1), "block_size": 3}),
        call("memory: L_k=96 in blocks of 8, no tensor of L_q x L_k scores",
             randn(gen, 2, 16, 4), randn(gen, 2, 96, 4), randn(gen, 2, 96, 4),
             kwargs={"block_size": 8}, measure_memory=True),
        call("block_size=1, batch (2,), L_q=3, L_k=5 (gradients too)",
             randn(gen, 2, 3, 4), randn(gen, 2, 5, 4), randn(gen, 2, 5, 6),
             kwargs={"block_size": 1}, grad=g),
    ]
    if quick:
        return cs + _online_rule_cases(gen, g)
    # The grader scores memory where the student's process cannot reach: this call runs in a
    # child whose memory the kernel caps (Limits.memory_case, 192 MiB above what it holds before
    # the notebook's cells run) below the whole score matrix: 2^26 float32 scores, 256 MiB, while
    # a block's scores (512 KiB) fit hundreds of times over. One batch element, so that one
    # element's matrix is the whole matrix (with two, it was 128 MiB and fit). Not smaller under
    # a smaller cap: the cells' own imports count against it. What the cap cannot tell from a
    # block (fewer query rows, half precision) and the measured history: docs/security.md,
    # docs/performance.md. (The self-check's recorder case above runs in the student's own
    # process; the grader does not run it.)
    padding = torch.rand(1, 262144, generator=gen) > 0.1
    cs = [c for c in cs if not c.measure_memory]
    return cs + [
        call("memory: batch (1,), L_q=256, L_k=262144 in blocks of 512, float32, padding mask (1, L_k), memory "
             "capped below the L_q x L_k score matrix", randn(gen, 1, 256, 2).float(),
             randn(gen, 1, 262144, 2).float(), randn(gen, 1, 262144, 2).float(),
             kwargs={"mask": padding, "block_size": 512}, dtype="float32", capped_memory=True),
        call("block_size=16 larger than L_k=6, unbatched (gradients too)",
             randn(gen, 4, 3), randn(gen, 6, 3), randn(gen, 6, 2), kwargs={"block_size": 16}, grad=g),
        call("default block_size (64) with L_k=70, batch (2,)",
             randn(gen, 2, 3, 4), randn(gen, 2, 70, 4), randn(gen, 2, 70, 3), grad=g),
        call("additive float mask (bias and -inf), block_size=2 (gradients too)",
             randn(gen, 2, 4, 4), randn(gen, 2, 6, 4), randn(gen, 2, 6, 3),
             kwargs={"mask": float_mask(gen, 2, 4, 6), "block_size": 2}, grad=g + ["kwargs.mask"]),
        call("several fully masked queries, causal-style boolean mask (L_q, L_k), block_size=2",
             randn(gen, 3, 5, 4), randn(gen, 3, 6, 4), randn(gen, 3, 6, 4),
             kwargs={"mask": bool_mask(gen, 3, 5, 6, p=0.5, full_rows=3), "block_size": 2}),
        call("a key block entirely masked for some queries (padding mask (B, 1, L_k)), block_size=2",
             randn(gen, 2, 3, 4), randn(gen, 2, 6, 4), randn(gen, 2, 6, 4),
             kwargs={"mask": torch.tensor([[[True, True, False, False, True, False]],
                                           [[False, False, True, True, True, True]]]),
                     "block_size": 2}, grad=g),
        call("large scores (inputs scaled by 30), block_size=2: the running max keeps exp finite",
             randn(gen, 4, 16, scale=30.0), randn(gen, 7, 16, scale=30.0), randn(gen, 7, 3),
             kwargs={"block_size": 2}, grad=g),
        call("float32 inputs keep float32, block_size=4", randn(gen, 2, 3, 4), randn(gen, 2, 9, 4),
             randn(gen, 2, 9, 4), kwargs={"block_size": 4}, dtype="float32"),
    ] + _online_rule_cases(gen, g)


def _online_rule_cases(gen, g):
    """Rules the self-check must show too (tests/rules.py), on purpose: a float mask's fully
    -inf row, and a wholly masked key block of a query that has keys left, with gradients (blocks
    merged through logsumexp/logaddexp give NaN gradients there). Last in both lists, so the
    cases before them keep their inputs."""
    # additive, so autograd reaches the masked scores (a boolean mask's masked_fill would zero
    # their NaN gradients before they reach q and k)
    block = torch.zeros(2, 5, 6, dtype=torch.float64)
    block[:, :, 2:4] = float("-inf")               # keys 2-3: the second block of 2, for every query
    block[1, 3] = float("-inf")                    # and one query with no key at all
    return [
        call("additive float mask with a fully -inf row, block_size=2 (gradients too)",
             randn(gen, 2, 4, 3), randn(gen, 2, 6, 3), randn(gen, 2, 6, 2),
             kwargs={"mask": float_mask(gen, 4, 6, full_rows=1), "block_size": 2}, grad=g),
        call("a key block wholly -inf for queries that have other keys, block_size=2 (gradients too)",
             randn(gen, 2, 5, 4), randn(gen, 2, 6, 4), randn(gen, 2, 6, 3),
             kwargs={"mask": block, "block_size": 2}, grad=g),
    ]


def _repeat_cases(gen, quick):
    cs = [
        call("x (2, 3, 4, 5), n_rep=2", randn(gen, 2, 3, 4, 5), 2, grad=["args.0"]),
        call("unbatched x (2, 3, 4), n_rep=3", randn(gen, 2, 3, 4), 3, grad=["args.0"]),
        call("n_rep=1 returns the same values", randn(gen, 2, 4, 3, 2), 1),
    ]
    if quick:
        return cs
    return cs + [
        call("one key/value head (multi-query), n_rep=4", randn(gen, 3, 1, 5, 2), 4, grad=["args.0"]),
        call("two batch axes, x (2, 2, 4, 3, 2), n_rep=2", randn(gen, 2, 2, 4, 3, 2), 2),
    ]


def _gqa_cases(gen, quick, ref):
    cls = ref["GroupedQueryAttention"]

    def module_call(name, E, H, H_kv, B, L, bias=False, mask=None, past=0, dtype="float64"):
        state = distinct_state(cls(E, H, H_kv, bias=bias), gen)
        kwargs = {}
        if mask is not None:
            kwargs["mask"] = mask
        if past:
            d_h = E // H
            kwargs["past_kv"] = [randn(gen, B, H_kv, past, d_h), randn(gen, B, H_kv, past, d_h)]
        return call(name, randn(gen, B, L, E), init={"embed_dim": E, "num_heads": H, "num_kv_heads": H_kv,
                                                     "bias": bias},
                    state=state, kwargs=kwargs, grad=["args.0", "params"], dtype=dtype)

    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    cs = [
        module_call("multi-query: H=4 query heads share H_kv=1, causal mask", 8, 4, 1, 2, 5, mask=causal),
        module_call("KV cache: 3 new positions after 4 cached ones, H=4, H_kv=2, causal mask (3, 7)",
                    8, 4, 2, 2, 3, mask=torch.ones(3, 7, dtype=torch.bool).tril(4), past=4),
        call("E=8, num_heads=4, num_kv_heads=3: ValueError",
             init={"embed_dim": 8, "num_heads": 4, "num_kv_heads": 3}, expect_error="ValueError"),
    ]

    def rule_cases():
        """Fully masked rows, boolean and float, on purpose (a -1e6 fill that leaves them uniform
        scored full marks before); last in both lists, so the cases before keep their inputs."""
        padding = torch.tensor([True, True, False, True, False, False, False, False]).view(2, 1, 1, 4)
        return [
            module_call("padding mask (B, 1, 1, L) that masks every key of one sequence, H=4, H_kv=2",
                        8, 4, 2, 2, 4, mask=padding),
            module_call("additive float mask (L, L) with a fully -inf row, H=4, H_kv=1", 8, 4, 1, 2, 4,
                        mask=float_mask(gen, 4, 4, full_rows=1)),
        ]

    if quick:
        return cs + rule_cases()
    return cs + [
        module_call("multi-head: H_kv = H = 4, no mask", 8, 4, 4, 2, 5),
        module_call("groups of 3: H=6, H_kv=2, bias=True, padding mask (B, 1, 1, L)", 12, 6, 2, 2, 4, bias=True,
                    mask=torch.tensor([True, True, True, False, True, True, False, False]).view(2, 1, 1, 4)),
        module_call("KV cache: one new position after 5 cached ones, H=4, H_kv=2, no mask", 8, 4, 2, 3, 1, past=5),
        module_call("KV cache with one key/value head: 2 new positions after 3, H=2, H_kv=1", 6, 2, 1, 1, 2,
                    mask=torch.ones(2, 5, dtype=torch.bool).tril(3), past=3),
        call("E=10, num_heads=4: ValueError",
             init={"embed_dim": 10, "num_heads": 4, "num_kv_heads": 2}, expect_error="ValueError"),
        module_call("float32, H=4, H_kv=2", 8, 4, 2, 2, 3, dtype="float32"),
    ] + rule_cases()


def _window_cases(gen, quick):
    cs = [
        call("seq_len=6, window=3", 6, 3, kwargs={"device": DEVICE}),
        call("window=1: each position sees only itself", 5, 1, kwargs={"device": DEVICE}),
        call("window=7 larger than seq_len=4: the causal mask", 4, 7, kwargs={"device": DEVICE}),
    ]
    if quick:
        return cs
    return cs + [
        call("seq_len=1, window=1", 1, 1, kwargs={"device": DEVICE}),
        call("seq_len=9, window=4, no device argument (the CPU)", 9, 4),
        call("window equal to seq_len=5", 5, 5, DEVICE),
    ]


def _alibi_cases(gen, quick):
    cs = [
        call("8 heads, seq_len=5", 8, 5, kwargs={"device": DEVICE}, as_default=True),
        call("one head, seq_len=4 (slope 1/256)", 1, 4, kwargs={"device": DEVICE}, as_default=True),
        call("6 heads (not a power of two): ValueError", 6, 4, expect_error="ValueError"),
    ]
    if quick:
        return cs
    return cs + [
        call("4 heads, seq_len=6", 4, 6, kwargs={"device": DEVICE}, as_default=True),
        call("2 heads, seq_len=1", 2, 1, kwargs={"device": DEVICE}, as_default=True),
        call("16 heads, seq_len=3", 16, 3, kwargs={"device": DEVICE}, as_default=True),
        call("3 heads: ValueError", 3, 2, expect_error="ValueError"),
        call("8 heads, seq_len=4, float32 default dtype", 8, 4, kwargs={"device": DEVICE}, as_default=True,
             dtype="float32"),
    ]


# ----------------------------------------------------------------------------- memory


# ----------------------------------------------------------------------------- mistake models
def _t(x):
    return x.double() if isinstance(x, torch.Tensor) else x


def _online(c, rescale_acc=True, rescale_sum=True, add_max=True, scale=True, zero_full=True, floor_blocks=False,
            base2=False):
    """online_softmax_attention in float64, with one optional mistake."""
    q, k, v = (_t(a) for a in c.args[:3])
    mask = c.kwargs.get("mask", c.args[3] if len(c.args) > 3 else None)
    bs = c.kwargs.get("block_size", c.args[4] if len(c.args) > 4 else 64)
    f = 1 / math.sqrt(q.shape[-1]) if scale else 1.0
    L_k = k.shape[-2]
    m = l = acc = None
    for s0 in range(0, (L_k // bs) * bs if floor_blocks else L_k, bs):
        s = q @ k[..., s0:s0 + bs, :].transpose(-2, -1) * f
        if mask is not None:
            mb = mask[..., s0:s0 + bs] if mask.shape[-1] != 1 else mask
            s = torch.where(mb, s, float("-inf")) if mb.dtype == torch.bool else s + _t(mb)
        if m is None:
            m = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype)
            l = torch.zeros(s.shape[:-1], dtype=s.dtype)
            acc = torch.zeros((*s.shape[:-1], v.shape[-1]), dtype=s.dtype)
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
        p = torch.exp(s - safe.unsqueeze(-1))
        alpha = torch.exp(m - safe)
        l = (alpha * l if rescale_sum else l) + p.sum(-1)
        acc = (alpha.unsqueeze(-1) * acc if rescale_acc else acc) + p @ v[..., s0:s0 + bs, :]
        m = m_new
    seen = l > 0
    out = acc / torch.where(seen, l, 1.0).unsqueeze(-1)
    if not zero_full:
        out = torch.where(seen.unsqueeze(-1), out, float("nan"))
    lse = torch.log(l) + (torch.where(seen, m, 0.0) if add_max else 0.0)
    return [out, torch.where(seen, lse / (math.log(2) if base2 else 1.0), float("-inf"))]


def _repeat(c, tiled=False):
    x, n = _t(c.args[0]), c.args[1]
    return x.repeat(*([1] * (x.dim() - 3)), n, 1, 1) if tiled else x.repeat_interleave(n, dim=-3)


def _gqa(c, tiled=False, past_after=False, no_scale=False, finite_fill=False):
    st = {k: v.double() for k, v in c.state.items()}
    E, H, H_kv = c.init["embed_dim"], c.init["num_heads"], c.init["num_kv_heads"]
    d_h = E // H
    x = _t(c.args[0])
    B, L, _ = x.shape

    def lin(name, t):
        y = t @ st[f"{name}.weight"].T
        return y + st[f"{name}.bias"] if f"{name}.bias" in st else y

    q = lin("q_proj", x).view(B, L, H, d_h).transpose(1, 2)
    k = lin("k_proj", x).view(B, L, H_kv, d_h).transpose(1, 2)
    v = lin("v_proj", x).view(B, L, H_kv, d_h).transpose(1, 2)
    past = c.kwargs.get("past_kv")
    if past is not None:
        pk, pv = _t(past[0]), _t(past[1])
        k = torch.cat([k, pk] if past_after else [pk, k], 2)
        v = torch.cat([v, pv] if past_after else [pv, v], 2)
    n = H // H_kv
    rep = (lambda t: t.repeat(1, n, 1, 1)) if tiled else (lambda t: t.repeat_interleave(n, 1))
    s = q @ rep(k).transpose(-2, -1) / (1.0 if no_scale else math.sqrt(d_h))
    mask = c.kwargs.get("mask")
    if mask is not None and finite_fill:  # -1e6 / finfo.min: a fully masked row is a softmax over equal scores
        s = torch.where(mask, s, -1e6) if mask.dtype == torch.bool else s + _t(mask).clamp(min=-1e6)
    elif mask is not None:
        s = torch.where(mask, s, float("-inf")) if mask.dtype == torch.bool else s + _t(mask)
    full = torch.isneginf(s).all(-1, keepdim=True)
    w = torch.softmax(s.masked_fill(full, 0.0), -1).masked_fill(full, 0.0)
    out = lin("out_proj", (w @ rep(v)).transpose(1, 2).reshape(B, L, E))
    return [out, w, k, v]


def _window(c, off_by_one=False, symmetric=False):
    L, window = c.args[0], c.args[1]
    d = torch.arange(L).view(-1, 1) - torch.arange(L).view(1, -1)
    keep = (d.abs() if symmetric else d) < window + (1 if off_by_one else 0)
    return keep & ((d >= 0) | symmetric)


def _alibi(c, first_slope_one=False, not_causal=False, positive=False, key_position=False):
    H, L = c.args[0], c.args[1]
    h = torch.arange(H, dtype=torch.float64) + (0 if first_slope_one else 1)
    slopes = 2.0 ** (-8.0 * h / H)
    d = (torch.arange(L).view(-1, 1) - torch.arange(L).view(1, -1)).double()
    if key_position:  # BLOOM's m_h * j: the same softmax (it differs by a constant per row), not this bias
        j = torch.arange(L, dtype=torch.float64).expand(L, L)
        return (slopes.view(-1, 1, 1) * j).masked_fill(d < 0, float("-inf"))
    bias = slopes.view(-1, 1, 1) * (d.abs() if not_causal else d) * (1 if positive else -1)
    return bias if not_causal else bias.masked_fill(d < 0, float("-inf"))


# (exercise) -> (mistake-free model, [(hint, model, when)])
MISTAKES = {
    "online_softmax_attention": (_online, [
        ("the running sum of values is not rescaled: when a block raises the maximum from m to m', "
         "multiply the accumulator by exp(m - m') before adding the block", partial(_online, rescale_acc=False), None),
        ("the running sum of exponentials is not rescaled: when a block raises the maximum from m to m', "
         "multiply it by exp(m - m') before adding the block", partial(_online, rescale_sum=False), None),
        ("lse misses the maximum: the running sum is relative to the running max m, so lse = m + log(l)",
         partial(_online, add_max=False), None),
        ("scores look unscaled: multiply q·k by 1/sqrt(d_k)", partial(_online, scale=False), None),
        ("a fully masked query gives NaN (its sum of exponentials is 0): give it a zero output and lse = -inf",
         partial(_online, zero_full=False), lambda c: "mask" in c.kwargs),
        ("the last, partial block of keys is left out: there are ceil(L_k / block_size) blocks "
         "(range(0, L_k, block_size)), not L_k // block_size", partial(_online, floor_blocks=True),
         lambda c: c.args[1].shape[-2] % c.kwargs.get("block_size", 64) != 0),
        ("lse is in base 2 (exp2 / log2, as Triton's kernels keep it): it is the natural-log lse divided by "
         "ln 2 exactly; the contract's lse is log(sum_j exp(s_ij)) in natural log (multiply by ln 2)",
         partial(_online, base2=True), None),
    ]),
    "repeat_kv": (_repeat, [
        ("the heads are tiled ([k0, k1, k0, k1]) instead of grouped ([k0, k0, k1, k1]): output head h must be "
         "input head h // n_rep (repeat_interleave, not repeat)", partial(_repeat, tiled=True), None),
    ]),
    "GroupedQueryAttention": (_gqa, [
        ("the key/value heads are tiled instead of grouped: query head h must use key/value head "
         "h // (num_heads // num_kv_heads) (repeat_interleave, not repeat)", partial(_gqa, tiled=True), None),
        ("the cache is appended in the wrong order: the past keys and values come first, the new ones after "
         "(torch.cat([past, new], dim=2))", partial(_gqa, past_after=True), lambda c: "past_kv" in c.kwargs),
        ("scores look unscaled: divide by sqrt(d_h)", partial(_gqa, no_scale=True), None),
        ("masked scores are filled with a large finite number (-1e6, finfo.min), so a query whose keys are all "
         "masked gets a uniform average instead of zero weights: fill with -inf and give such rows zero weights "
         "(masked_fill after the softmax)", partial(_gqa, finite_fill=True), lambda c: "mask" in c.kwargs),
    ]),
    "sliding_window_mask": (_window, [
        ("the window is off by one: a query sees `window` positions, its own included (0 <= i - j < window)",
         partial(_window, off_by_one=True), None),
        ("the mask is not causal: a query may not see later positions (j <= i)", partial(_window, symmetric=True),
         None),
    ]),
    "alibi_bias": (_alibi, [
        ("the slopes start at 1: m_h = 2 ** (-8 * (h + 1) / H) for h = 0 .. H-1, so the first is 2 ** (-8 / H)",
         partial(_alibi, first_slope_one=True), None),
        ("the bias is not causal: later positions (j > i) must get -inf", partial(_alibi, not_causal=True), None),
        ("the bias has the wrong sign: distant keys are penalised, -m_h * (i - j)", partial(_alibi, positive=True),
         None),
        ("the bias is by key position, m_h * j (as BLOOM builds it): that gives the same softmax, since it differs "
         "from the contract's bias by a constant per query, but the contract's bias is by distance, -m_h * (i - j)",
         partial(_alibi, key_position=True), None),
    ]),
}


_FULLY_MASKED = {
    "online_softmax_attention": "a fully masked query gives NaN (its sum of exponentials is 0): give it a zero "
                                "output and lse = -inf",
    "GroupedQueryAttention": "a query whose keys are all masked gives NaN (softmax of all -inf): give such rows "
                             "zero weights (masked_fill after the softmax), so their output is out_proj's bias",
}
GQA_WEIGHTS_RIGHT = "the weights are right but the output is not: weights @ v, heads merged back, then out_proj"


HINTS = {
    exercise: Hints(mistakes=tuple(Mistake(text, model, when) for text, model, when in mistakes),
                    correct=correct, explain=EXPLAIN.get(exercise),
                    weights_right=GQA_WEIGHTS_RIGHT if exercise == "GroupedQueryAttention" else None,
                    fully_masked=_FULLY_MASKED.get(exercise))
    for exercise, (correct, mistakes) in MISTAKES.items()
}

"""Independent cross-checks of the reference solutions (the solution notebooks).

The autograder grades students against these references, so they are checked here against
implementations that do not come from them: PyTorch's own `scaled_dot_product_attention` and
`nn.MultiheadAttention`, the formulas of the papers written out element by element (loops,
complex numbers, explicit rotations), and an independent AlphaFold attention with distinct
weights per layer and gating really on. Everything also runs on the `meta` device, to prove the
references create no tensor on a fixed device or dtype.
"""
from __future__ import annotations

import cmath
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.references.solutions import load_reference

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def ref(chapter: str) -> dict:
    return load_reference(chapter)


def ch1():
    return ref("01_intuition")


def ch2():
    return ref("02_scaled_dot_product_attention")


def ch3():
    return ref("03_multi_head_attention")


def ch4():
    return ref("04_positional_encoding")


def ch5():
    return ref("05_masks")


def ch6():
    return ref("06_gated_global_attention")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g, *shape, dtype=torch.float64, scale=1.0):
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def assert_close(actual, expected, dtype=torch.float64, **kw):
    tol = dict(TOL[dtype])
    tol.update(kw)
    torch.testing.assert_close(actual, expected, **tol)


def distinct_weights(module: nn.Module, g: torch.Generator, scale: float = 0.5) -> None:
    """Give every parameter of `module` its own random values (so a swapped layer shows)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(randn(g, *p.shape, dtype=p.dtype, scale=scale))


class Recorder(TorchDispatchMode):
    """The aten ops a computation reaches."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def on_meta(*tensors):
    return [t.to("meta") for t in tensors]


# =============================================================== chapter 1: softmax, pooling
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((5,), -1), ((3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), -2), ((2, 1, 3, 5), -1)])
def test_softmax_matches_torch(shape, dim, dtype):
    x = randn(gen(1), *shape, dtype=dtype, scale=3.0).requires_grad_()
    y = ch1()["softmax"](x, dim=dim)
    expected = torch.softmax(x, dim=dim)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, expected, dtype)
    r = randn(gen(2), *shape, dtype=dtype)
    (g,) = torch.autograd.grad((y * r).sum(), x)
    (g_ref,) = torch.autograd.grad((expected * r).sum(), x)
    assert_close(g, g_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_large_magnitudes(dtype):
    x = torch.tensor([[1000.0, -1000.0, 0.0], [1000.0, 1000.0, 999.0], [-1000.0, -1000.0, -1001.0]], dtype=dtype)
    y = ch1()["softmax"](x)
    assert torch.isfinite(y).all()
    assert_close(y, torch.softmax(x, dim=-1), dtype)
    assert_close(y.sum(-1), torch.ones(3, dtype=dtype), dtype)


def test_softmax_minus_inf_and_fully_masked_rows():
    inf = float("inf")
    x = torch.tensor([[0.0, -inf, 1.0], [-inf, -inf, -inf], [-inf, 2.0, -inf]], dtype=torch.float64,
                     requires_grad=True)
    y = ch1()["softmax"](x)
    assert y[0, 1] == 0 and y[2, 0] == 0 and y[2, 2] == 0 and y[2, 1] == 1
    assert torch.equal(y[1], torch.zeros(3, dtype=torch.float64))
    assert_close(y[0], torch.softmax(x[0].detach(), dim=-1))
    (g,) = torch.autograd.grad((y * torch.arange(9.0, dtype=torch.float64).view(3, 3)).sum(), x)
    assert torch.isfinite(g).all()
    assert torch.equal(g[1], torch.zeros(3, dtype=torch.float64))


def test_softmax_does_not_use_torch_softmax_or_modify_input():
    x = randn(gen(3), 4, 6)
    before = x.clone()
    with Recorder() as rec:
        ch1()["softmax"](x, dim=0)
    assert not rec.ops & {"softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax"}, rec.ops
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_attention_pool_matches_formula(batch, dtype):
    g = gen(4)
    n, d, d_v = 5, 4, 3
    query, keys, values = randn(g, *batch, d, dtype=dtype), randn(g, *batch, n, d, dtype=dtype), randn(g, *batch, n, d_v, dtype=dtype)
    out, w = ch1()["attention_pool"](query, keys, values)
    scores = torch.einsum("...nd,...d->...n", keys, query)
    w_ref = torch.softmax(scores, dim=-1)
    assert out.shape == (*batch, d_v) and w.shape == (*batch, n) and out.dtype == dtype
    assert_close(w, w_ref, dtype)
    assert_close(out, torch.einsum("...n,...nv->...v", w_ref, values), dtype)


def test_chapter1_on_meta():
    x, = on_meta(randn(gen(), 2, 3, 4))
    y = ch1()["softmax"](x, dim=1)
    assert (y.shape, y.dtype, y.device.type) == ((2, 3, 4), torch.float64, "meta")
    q, k, v = on_meta(randn(gen(), 2, 4, dtype=torch.float32), randn(gen(), 2, 5, 4, dtype=torch.float32),
                      randn(gen(), 2, 5, 3, dtype=torch.float32))
    out, w = ch1()["attention_pool"](q, k, v)
    assert out.shape == (2, 3) and w.shape == (2, 5) and out.device.type == "meta" and out.dtype == torch.float32


# ================================================= chapter 2: scaled dot-product attention
def _mask(kind, g, shape, dtype):
    """None, or a boolean / additive float mask of `shape` with one fully masked row if asked."""
    if kind is None:
        return None
    keep = torch.rand(shape, generator=g) > 0.3
    keep[..., 0] = True  # no accidental fully masked rows
    if kind.endswith("+full"):
        keep.view(-1, shape[-2], shape[-1])[0, -1, :] = False
    if kind.startswith("bool"):
        return keep
    bias = randn(g, *shape, dtype=dtype, scale=0.5)
    return torch.where(keep, bias, torch.full_like(bias, float("-inf")))


SDPA_SHAPES = [
    # (q, k, v, mask) shapes: unbatched, L_q != L_k, d_k != d_v, extra batch dims, broadcast masks
    ((3, 4), (5, 4), (5, 6), (3, 5)),
    ((2, 4, 8), (2, 6, 8), (2, 6, 3), (4, 6)),
    ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), (2, 3, 4, 6)),
    ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), (2, 1, 1, 6)),
    ((1, 2, 3, 1, 2), (1, 2, 3, 4, 2), (1, 2, 3, 4, 1), (3, 1, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", [None, "bool", "float", "bool+full", "float+full"])
@pytest.mark.parametrize("shapes", SDPA_SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_sdpa_matches_torch(shapes, kind, dtype):
    g = gen(5)
    qs, ks, vs, ms = shapes
    q, k, v = (randn(g, *s, dtype=dtype).requires_grad_() for s in (qs, ks, vs))
    mask = _mask(kind, g, ms, dtype)
    if mask is not None and mask.is_floating_point():
        mask.requires_grad_()
    inputs = [q, k, v] + ([mask] if mask is not None and mask.requires_grad else [])
    pristine = [t.detach().clone() for t in inputs]

    out, w = ch2()["scaled_dot_product_attention"](q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.shape == expected.shape and out.dtype == dtype and w.dtype == dtype
    assert w.shape == torch.broadcast_shapes(qs[:-1] + (ks[-2],), ms if mask is not None else (1,))
    assert_close(out, expected, dtype)

    # the weights, independently: softmax of the masked, scaled scores, fully masked rows zero
    scores = q.detach() @ k.detach().transpose(-2, -1) / math.sqrt(qs[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.detach()
    w_ref = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    assert_close(w, w_ref, dtype)
    assert torch.isfinite(w).all() and torch.isfinite(out).all()

    r = randn(g, *out.shape, dtype=dtype)
    grads = torch.autograd.grad((out * r).sum(), inputs)
    grads_ref = torch.autograd.grad((expected * r).sum(), inputs)
    for a, b in zip(grads, grads_ref):
        assert torch.isfinite(a).all()
        assert_close(a, b, dtype)
    for t, before in zip(inputs, pristine):
        assert torch.equal(t.detach(), before)


@pytest.mark.parametrize("kind", ["bool+full", "float+full"])
def test_fully_masked_rows_are_zero_in_torch_and_reference(kind):
    """PyTorch 2.13's own SDPA gives zeros for a fully masked query (the contract follows it)."""
    g = gen(6)
    q, k, v = randn(g, 2, 3, 4), randn(g, 2, 5, 4), randn(g, 2, 5, 6)
    mask = _mask(kind, g, (2, 3, 5), torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out, w = ch2()["scaled_dot_product_attention"](q, k, v, mask=mask)
    # _mask fully masks the last query of the first batch element
    assert torch.equal(expected[0, -1], torch.zeros(6, dtype=torch.float64))
    assert torch.equal(out[0, -1], torch.zeros(6, dtype=torch.float64))
    assert torch.equal(w[0, -1], torch.zeros(5, dtype=torch.float64))
    assert torch.isfinite(out).all() and (out[0, :-1].abs().sum(-1) > 0).all()


def test_sdpa_does_not_use_torch_attention():
    g = gen(7)
    with Recorder() as rec:
        ch2()["scaled_dot_product_attention"](randn(g, 2, 3, 4), randn(g, 2, 5, 4), randn(g, 2, 5, 4))
    assert not any("scaled_dot_product" in op for op in rec.ops), rec.ops


@pytest.mark.parametrize("dtype", DTYPES)
def test_self_attention_matches_formula(dtype):
    g = gen(8)
    m = ch2()["SelfAttention"](6, 4).to(dtype)
    distinct_weights(m, g)
    assert set(dict(m.named_parameters())) == {"W_q.weight", "W_k.weight", "W_v.weight"}
    assert m.W_q.weight.shape == (4, 6)
    x = randn(g, 2, 3, 5, 6, dtype=dtype)
    mask = torch.rand(5, 5, generator=g) > 0.3
    out, w = m(x, mask=mask)
    Q, K, V = x @ m.W_q.weight.T, x @ m.W_k.weight.T, x @ m.W_v.weight.T
    expected = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
    assert out.shape == (2, 3, 5, 4) and w.shape == (2, 3, 5, 5)
    assert_close(out, expected.detach(), dtype)


def test_chapter2_on_meta():
    q, k, v = on_meta(randn(gen(), 2, 3, 4, dtype=torch.float32), randn(gen(), 2, 5, 4, dtype=torch.float32),
                      randn(gen(), 2, 5, 6, dtype=torch.float32))
    for mask in (None, torch.ones(3, 5, dtype=torch.bool, device="meta"), torch.zeros(3, 5, device="meta")):
        out, w = ch2()["scaled_dot_product_attention"](q, k, v, mask=mask)
        assert (out.shape, w.shape, out.dtype, out.device.type) == ((2, 3, 6), (2, 3, 5), torch.float32, "meta")
    m = ch2()["SelfAttention"](4, 3).to("meta")
    out, w = m(torch.empty(2, 5, 4, device="meta"))
    assert out.shape == (2, 5, 3) and w.shape == (2, 5, 5) and out.device.type == "meta"


# ========================================================== chapter 3: multi-head attention
def test_split_heads_layout_and_round_trip():
    x = randn(gen(9), 2, 3, 5, 12)
    s = ch3()["split_heads"](x, 4)
    assert s.shape == (2, 3, 4, 5, 3)
    for h in range(4):  # head h holds features h*d_h ... (h+1)*d_h - 1
        assert torch.equal(s[..., h, :, :], x[..., 3 * h:3 * (h + 1)])
    assert torch.equal(ch3()["merge_heads"](s), x)
    y = randn(gen(10), 4, 7)  # unbatched
    assert torch.equal(ch3()["merge_heads"](ch3()["split_heads"](y, 7)), y)
    with pytest.raises(ValueError):
        ch3()["split_heads"](y, 3)


def test_merge_heads_layout():
    x = randn(gen(11), 2, 3, 4, 5)  # (B, H, L, d_h)
    m = ch3()["merge_heads"](x)
    assert m.shape == (2, 4, 15)
    assert torch.equal(m, torch.cat([x[:, h] for h in range(3)], dim=-1))


def torch_mha_like(ours, E, H, bias, dropout=0.0):
    """nn.MultiheadAttention(batch_first=True) holding our module's weights."""
    t = nn.MultiheadAttention(E, H, bias=bias, dropout=dropout, batch_first=True).double()
    with torch.no_grad():
        if hasattr(ours, "qkv_proj"):
            t.in_proj_weight.copy_(ours.qkv_proj.weight)
            if bias:
                t.in_proj_bias.copy_(ours.qkv_proj.bias)
        else:
            t.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
            if bias:
                t.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        t.out_proj.weight.copy_(ours.out_proj.weight)
        if bias:
            t.out_proj.bias.copy_(ours.out_proj.bias)
    return t


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", ["self", "cross", "bool-causal", "padding", "float-per-head"])
def test_multi_head_attention_matches_torch(case, bias):
    g = gen(12)
    B, E, H, L_q, L_k = 2, 12, 3, 4, 6
    ours = ch3()["MultiHeadAttention"](E, H, bias=bias).double().eval()
    distinct_weights(ours, g)
    theirs = torch_mha_like(ours, E, H, bias).eval()
    query = randn(g, B, L_q, E).requires_grad_()
    key, value = randn(g, B, L_k, E), randn(g, B, L_k, E)
    kw, tkw = {}, {}
    if case == "self":
        key = value = query
        args = (query,)
    else:
        args = (query, key, value)
    if case == "bool-causal":
        key = value = query
        args = (query,)
        keep = torch.ones(L_q, L_q, dtype=torch.bool).tril()
        kw["mask"], tkw["attn_mask"] = keep, ~keep  # torch: True = *blocked*
    elif case == "padding":
        keep = torch.ones(B, L_k, dtype=torch.bool)
        keep[0, -2:] = False
        kw["mask"], tkw["key_padding_mask"] = keep[:, None, None, :], ~keep
    elif case == "float-per-head":
        fm = randn(g, B, H, L_q, L_k, scale=0.5)
        kw["mask"], tkw["attn_mask"] = fm, fm.reshape(B * H, L_q, L_k)
    out, w = ours(*args, **kw)
    expected, w_ref = theirs(query, key, value, need_weights=True, average_attn_weights=False, **tkw)
    assert out.shape == (B, L_q, E) and w.shape == w_ref.shape
    assert_close(out, expected)
    assert_close(w, w_ref)
    r = randn(g, *out.shape)
    (g1,) = torch.autograd.grad((out * r).sum(), query)
    (g2,) = torch.autograd.grad((expected * r).sum(), query)
    assert_close(g1, g2)


def test_multi_head_attention_dropout():
    g = gen(13)
    E, H = 8, 2
    ours = ch3()["MultiHeadAttention"](E, H, dropout=0.5).double()
    distinct_weights(ours, g)
    theirs = torch_mha_like(ours, E, H, True, dropout=0.5)
    x = randn(g, 2, 5, E)
    ours.eval()
    out_eval, w_eval = ours(x)
    assert torch.equal(ours(x)[0], out_eval)  # no dropout in eval mode
    ours.train()
    theirs.train()
    torch.manual_seed(0)
    out_train, w_train = ours(x)
    torch.manual_seed(0)
    expected, _ = theirs(x, x, x, need_weights=True, average_attn_weights=False)
    assert_close(out_train, expected)  # same dropout mask on the weights that multiply v
    assert not torch.allclose(out_train, out_eval)
    assert_close(w_train, w_eval)  # the returned weights are taken before dropout


def test_multi_head_attention_errors_and_names():
    with pytest.raises(ValueError):
        ch3()["MultiHeadAttention"](10, 3)
    with pytest.raises(ValueError):
        ch3()["MultiHeadSelfAttention"](10, 4)
    m = ch3()["MultiHeadAttention"](8, 2, bias=False)
    assert set(dict(m.named_parameters())) == {f"{p}_proj.weight" for p in "qkv"} | {"out_proj.weight"}
    m = ch3()["MultiHeadSelfAttention"](8, 2)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "qkv_proj.weight": (24, 8), "qkv_proj.bias": (24,), "out_proj.weight": (8, 8), "out_proj.bias": (8,)}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_multi_head_self_attention_matches_torch(bias, masked):
    g = gen(14)
    B, N, E, H = 3, 5, 12, 4
    ours = ch3()["MultiHeadSelfAttention"](E, H, bias=bias).double()
    distinct_weights(ours, g)
    theirs = torch_mha_like(ours, E, H, bias).eval()
    x = randn(g, B, N, E)
    kw, tkw = {}, {}
    if masked:
        keep = torch.ones(N, N, dtype=torch.bool).tril()
        kw["mask"], tkw["attn_mask"] = keep, ~keep
    out, w = ours(x, **kw)
    expected, w_ref = theirs(x, x, x, need_weights=True, average_attn_weights=False, **tkw)
    assert_close(out, expected)
    assert_close(w, w_ref)
    assert w.shape == (B, H, N, N)


def test_multi_head_self_attention_qkv_layout():
    """qkv_proj's outputs are (3, H, d_h): with only the key rows of head 1 non-zero, only the
    scores of head 1 vary."""
    E, H = 6, 3
    m = ch3()["MultiHeadSelfAttention"](E, H, bias=False).double()
    with torch.no_grad():
        m.qkv_proj.weight.zero_()
        m.qkv_proj.weight[0:E] = torch.eye(E, dtype=torch.float64)  # queries = x
        m.qkv_proj.weight[E + 2:E + 4] = torch.eye(E, dtype=torch.float64)[2:4]  # keys: head 1 only
    x = randn(gen(15), 1, 4, E)
    _, w = m(x)
    uniform = torch.full((1, 4, 4), 0.25, dtype=torch.float64)
    assert torch.allclose(w[:, 0], uniform) and torch.allclose(w[:, 2], uniform)
    assert not torch.allclose(w[:, 1], uniform)


def test_chapter3_on_meta():
    x = torch.empty(2, 5, 8, device="meta")
    s = ch3()["split_heads"](x, 2)
    assert s.shape == (2, 2, 5, 4) and ch3()["merge_heads"](s).shape == (2, 5, 8)
    m = ch3()["MultiHeadAttention"](8, 2, dropout=0.1).to("meta").train()
    out, w = m(x, torch.empty(2, 3, 8, device="meta"), mask=torch.ones(2, 1, 1, 3, dtype=torch.bool, device="meta"))
    assert (out.shape, w.shape, out.device.type) == ((2, 5, 8), (2, 2, 5, 3), "meta")
    m = ch3()["MultiHeadSelfAttention"](8, 4).to("meta")
    out, w = m(x)
    assert (out.shape, w.shape, out.device.type) == ((2, 5, 8), (2, 4, 5, 5), "meta")


# ========================================================= chapter 4: positional encoding
@pytest.mark.parametrize("d_model", [1, 6, 7])
def test_sinusoidal_table_matches_formula(d_model):
    max_len = 50
    pe = ch4()["sinusoidal_positional_encoding"](max_len, d_model)
    assert pe.shape == (max_len, d_model) and pe.dtype == torch.get_default_dtype()
    expected = torch.empty(max_len, d_model, dtype=torch.float64)
    for p in range(max_len):
        for col in range(d_model):
            angle = p / 10000 ** ((col - col % 2) / d_model)
            expected[p, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    assert_close(pe.double(), expected, torch.float32)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        pe64 = ch4()["sinusoidal_positional_encoding"](max_len, d_model)
    finally:
        torch.set_default_dtype(old)
    assert pe64.dtype == torch.float64
    assert_close(pe64, expected)


def test_sinusoidal_module():
    m = ch4()["SinusoidalPositionalEncoding"](7, max_len=20)
    assert "pe" in dict(m.named_buffers()) and "pe" in m.state_dict() and not list(m.parameters())
    x = randn(gen(16), 2, 9, 7)
    table = ch4()["sinusoidal_positional_encoding"](20, 7)
    assert_close(m(x), x + table[:9].double())
    assert m(x).dtype == torch.float64
    with pytest.raises(ValueError):
        m(randn(gen(), 1, 21, 7))
    assert m.to("meta").pe.device.type == "meta"


def test_learned_module():
    m = ch4()["LearnedPositionalEmbedding"](10, 4).double()
    assert set(dict(m.named_parameters())) == {"embedding.weight"} and isinstance(m.embedding, nn.Embedding)
    x = randn(gen(17), 3, 6, 4)
    assert_close(m(x), x + m.embedding.weight[:6])
    with pytest.raises(ValueError):
        m(randn(gen(), 1, 11, 4))


def _rope_expected(x: torch.Tensor, base: float) -> torch.Tensor:
    """Each interleaved pair as a complex number, multiplied by exp(i p theta_j)."""
    *batch, L, d = x.shape
    out = torch.empty_like(x)
    flat, oflat = x.reshape(-1, L, d), out.view(-1, L, d)
    for b in range(flat.shape[0]):
        for p in range(L):
            for j in range(d // 2):
                z = complex(flat[b, p, 2 * j], flat[b, p, 2 * j + 1]) * cmath.exp(1j * p * base ** (-2 * j / d))
                oflat[b, p, 2 * j], oflat[b, p, 2 * j + 1] = z.real, z.imag
    return out


@pytest.mark.parametrize("base", [10000.0, 100.0])
@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 6, 8)])
def test_rope_exact_values(shape, base):
    x = randn(gen(18), *shape)
    before = x.clone()
    y = ch4()["apply_rotary_embedding"](x, base=base)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close(y, _rope_expected(x, base))
    assert torch.equal(x, before)
    # explicit 2x2 rotation of one pair
    p, j, d = 3, 1, shape[-1]
    t = 3 * base ** (-2 * j / d)
    rot = torch.tensor([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]], dtype=torch.float64)
    assert_close(y[..., p, 2 * j:2 * j + 2], x[..., p, 2 * j:2 * j + 2] @ rot.T)


def test_rope_relative_position_property():
    g = gen(19)
    d, L = 8, 7
    q, k = randn(g, d), randn(g, d)
    rq = ch4()["apply_rotary_embedding"](q.expand(L, d))  # the same query at every position
    rk = ch4()["apply_rotary_embedding"](k.expand(L, d))
    scores = rq @ rk.T  # scores[m, n] depends on m - n only
    for m in range(L - 1):
        for n in range(L - 1):
            assert abs(scores[m + 1, n + 1] - scores[m, n]) < 1e-10
    assert_close(rq.norm(dim=-1), q.norm().expand(L))  # rotations keep lengths
    assert_close(rq[0], q)  # position 0 is not rotated
    with pytest.raises(ValueError):
        ch4()["apply_rotary_embedding"](randn(g, 3, 5))


def test_rope_float32_keeps_dtype():
    x = randn(gen(20), 2, 5, 6, dtype=torch.float32)
    y = ch4()["apply_rotary_embedding"](x)
    assert y.dtype == torch.float32
    assert_close(y, _rope_expected(x.double(), 10000.0).float(), torch.float32)


def test_chapter4_on_meta():
    with torch.device("meta"):
        pe = ch4()["sinusoidal_positional_encoding"](10, 5)
    assert pe.device.type == "meta" and pe.shape == (10, 5)
    x = torch.empty(2, 6, 8, device="meta")
    for m in (ch4()["SinusoidalPositionalEncoding"](8, 10), ch4()["LearnedPositionalEmbedding"](10, 8)):
        y = m.to("meta")(x)
        assert (y.shape, y.device.type, y.dtype) == ((2, 6, 8), "meta", torch.float32)
    y = ch4()["apply_rotary_embedding"](x.double())
    assert (y.shape, y.device.type, y.dtype) == ((2, 6, 8), "meta", torch.float64)


# ====================================================================== chapter 5: masks
def test_causal_mask_exact():
    m = ch5()["causal_mask"](5)
    assert m.dtype == torch.bool and m.shape == (5, 5)
    assert torch.equal(m, torch.tensor([[j <= i for j in range(5)] for i in range(5)]))
    assert ch5()["causal_mask"](3, device="meta").device.type == "meta"


def test_padding_and_decoder_masks_exact():
    tokens = torch.tensor([[5, 7, 0, 0], [0, 3, 4, 9]])
    p = ch5()["padding_mask"](tokens)
    assert p.dtype == torch.bool and p.shape == (2, 1, 1, 4)
    assert torch.equal(p[:, 0, 0], torch.tensor([[True, True, False, False], [False, True, True, True]]))
    assert torch.equal(ch5()["padding_mask"](tokens, pad_id=3)[1, 0, 0], torch.tensor([True, False, True, True]))
    d = ch5()["decoder_mask"](tokens)
    assert d.dtype == torch.bool and d.shape == (2, 1, 4, 4)
    expected = torch.tensor([[[tokens[b, j] != 0 and j <= i for j in range(4)] for i in range(4)] for b in range(2)])
    assert torch.equal(d[:, 0], expected)
    meta = tokens.to("meta")
    assert ch5()["padding_mask"](meta).device.type == "meta"
    assert ch5()["decoder_mask"](meta).device.type == "meta" and ch5()["decoder_mask"](meta).shape == (2, 1, 4, 4)


# =========================================================== chapter 6: AlphaFold attention
def af_module(c_in=6, c=3, N_head=2, attn_dim=-2, seed=21, **kw):
    m = ch6()["MultiHeadAttention"](c_in, c, N_head, attn_dim, **kw).double()
    distinct_weights(m, gen(seed))
    return m


def af_expected(m, x, bias=None, mask=None, gated=None, is_global=None):
    """Independent AlphaFold attention: loops over the batch positions and heads, explicit
    weight matrices, the gate sigmoid(x W_g^T + b_g) * o before linear_o."""
    gated = m.gated if gated is None else gated
    is_global = m.is_global if is_global is None else is_global
    H, c = m.N_head, m.c
    lin = lambda layer, t: t @ layer.weight.T + (layer.bias if layer.bias is not None else 0)  # noqa: E731
    xm = x.movedim(m.attn_dim, -2)  # (*, n, c_in), the other axes in their order
    batch, n = xm.shape[:-2], xm.shape[-2]
    indices = [()]
    for size in batch:
        indices = [i + (j,) for i in indices for j in range(size)]
    rows = []
    for idx in indices:
        xs = xm[idx]  # (n, c_in)
        Q, K, V = lin(m.linear_q, xs), lin(m.linear_k, xs), lin(m.linear_v, xs)
        heads = []
        for h in range(H):
            q = Q[:, h * c:(h + 1) * c]
            k = K if is_global else K[:, h * c:(h + 1) * c]
            v = V if is_global else V[:, h * c:(h + 1) * c]
            if is_global:
                q = q.mean(0, keepdim=True)
            s = q @ k.T / math.sqrt(c)  # (n_q, n)
            if bias is not None:
                s = s + bias[idx[:bias.dim() - 3]][h]
            if mask is not None:
                s = s.masked_fill(mask[idx] == 0, float("-inf"))
            w = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
            heads.append((w @ v).expand(n, c))  # global: the one row serves every position
        o = torch.cat(heads, dim=-1)  # (n, H * c)
        if gated:
            o = o * torch.sigmoid(lin(m.linear_g, xs))
        rows.append(o)
    out = torch.stack(rows).reshape(*batch, n, H * c)
    return lin(m.linear_o, out.movedim(-2, m.attn_dim))


def test_af_layer_names_and_shapes():
    m = ch6()["MultiHeadAttention"](6, 3, 2, -2, gated=True)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"linear_q.weight": (6, 6), "linear_k.weight": (6, 6), "linear_v.weight": (6, 6),
                      "linear_o.weight": (6, 6), "linear_o.bias": (6,),
                      "linear_g.weight": (6, 6), "linear_g.bias": (6,)}
    m = ch6()["MultiHeadAttention"](5, 4, 3, 1, is_global=True, use_bias_for_embeddings=True)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"linear_q.weight": (12, 5), "linear_q.bias": (12,), "linear_k.weight": (4, 5),
                      "linear_k.bias": (4,), "linear_v.weight": (4, 5), "linear_v.bias": (4,),
                      "linear_o.weight": (5, 12), "linear_o.bias": (5,)}


@pytest.mark.parametrize("attn_dim,shape", [(-2, (4, 5, 6)), (0, (4, 5, 6)), (1, (2, 4, 5, 6)), (-3, (2, 4, 5, 6)),
                                            (-2, (5, 6))])
def test_prepare_qkv_head_layout(attn_dim, shape):
    H, c = 2, 3
    m = ch6()["MultiHeadAttention"](6, c, H, attn_dim)
    g = gen(22)
    q, k, v = (randn(g, *shape) for _ in range(3))
    pq, pk, pv = m.prepare_qkv(q, k, v)
    for t, pt in ((q, pq), (k, pk), (v, pv)):
        moved = t.movedim(attn_dim, -2)
        expected = torch.stack([moved[..., h * c:(h + 1) * c] for h in range(H)], dim=-3)
        assert torch.equal(pt, expected)


@pytest.mark.parametrize("attn_dim,shape", [(-2, (4, 5, 6)), (0, (4, 5, 6)), (-3, (2, 4, 5, 6))])
def test_prepare_qkv_global(attn_dim, shape):
    H, c = 2, 3
    m = ch6()["MultiHeadAttention"](6, c, H, attn_dim, is_global=True)
    g = gen(23)
    q = randn(g, *shape)
    k, v = randn(g, *shape[:-1], c), randn(g, *shape[:-1], c)
    pq, pk, pv = m.prepare_qkv_global(q, k, v)
    moved = q.movedim(attn_dim, -2)
    n = moved.shape[-2]
    expected_q = torch.stack([moved[..., h * c:(h + 1) * c].sum(-2, keepdim=True) / n for h in range(H)], dim=-3)
    assert_close(pq, expected_q)
    assert torch.equal(pk, k.movedim(attn_dim, -2).unsqueeze(-3))
    assert torch.equal(pv, v.movedim(attn_dim, -2).unsqueeze(-3))


AF_CASES = [
    # (x shape, attn_dim, bias shape or None, mask shape or None)
    ((5, 6), -2, None, None),
    ((3, 5, 6), -2, (2, 5, 5), None),          # MSA row attention with a shared pair bias
    ((3, 5, 6), 1, (2, 5, 5), (3, 5)),
    ((5, 3, 6), 0, None, (3, 5)),              # column attention: attention axis first
    ((2, 3, 4, 6), -2, (2, 2, 4, 4), (2, 3, 4)),  # bias with a batch axis, left-aligned
    ((2, 4, 3, 6), -3, (2, 2, 4, 4), (2, 3, 4)),
]


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("case", AF_CASES, ids=lambda c: f"x{c[0]}-dim{c[1]}-b{bool(c[2])}-m{bool(c[3])}")
def test_af_gated_attention_against_independent_formula(case, use_bias):
    shape, attn_dim, bshape, mshape = case
    g = gen(24)
    m = af_module(attn_dim=attn_dim, gated=True, use_bias_for_embeddings=use_bias)
    x = randn(g, *shape).requires_grad_()
    bias = randn(g, *bshape) if bshape else None
    mask = (torch.rand(mshape, generator=g) > 0.3).double() if mshape else None
    if mask is not None:
        mask.view(-1, mshape[-1])[0] = 0  # a fully masked row of keys
        mask.view(-1, mshape[-1])[1, 0] = 1
    out = m(x, bias=bias, attention_mask=mask)
    assert out.shape == shape and out.dtype == torch.float64
    expected = af_expected(m, x, bias, mask)
    assert_close(out, expected)
    assert torch.isfinite(out).all()
    (gx,) = torch.autograd.grad(out.sum(), x)
    (gx_ref,) = torch.autograd.grad(expected.sum(), x)
    assert torch.isfinite(gx).all()
    assert_close(gx, gx_ref)
    # gating is really on: the same weights without the gate give something else
    ungated = af_expected(m, x, bias, mask, gated=False)
    assert (out - ungated).abs().max() > 1e-2


def test_af_ungated_matches_and_differs_from_gated():
    g = gen(25)
    gated = af_module(gated=True, seed=26)
    plain = ch6()["MultiHeadAttention"](6, 3, 2, -2).double()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("linear_g")})
    x = randn(g, 3, 5, 6)
    out_plain = plain(x)
    assert_close(out_plain, af_expected(plain, x))
    assert (gated(x) - out_plain).abs().max() > 1e-2
    assert "linear_g.weight" not in plain.state_dict()


def test_af_distinct_layers_matter():
    """Swapping two layers' weights changes the output (the checks would see a swapped layer)."""
    m = af_module(gated=True, seed=27)
    x = randn(gen(28), 3, 5, 6)
    out = m(x)
    swapped = af_module(gated=True, seed=27)
    with torch.no_grad():
        swapped.linear_k.weight.copy_(m.linear_q.weight)
        swapped.linear_q.weight.copy_(m.linear_k.weight)
    assert (swapped(x) - out).abs().max() > 1e-3


@pytest.mark.parametrize("attn_dim,shape,mshape", [(-2, (3, 5, 6), (3, 5)), (-3, (5, 3, 6), (3, 5)),
                                                   (0, (5, 6), (5,))])
def test_af_global_attention_against_independent_formula(attn_dim, shape, mshape):
    g = gen(29)
    m = af_module(attn_dim=attn_dim, gated=True, is_global=True, seed=30)
    x = randn(g, *shape).requires_grad_()
    mask = (torch.rand(mshape, generator=g) > 0.3).double()
    mask.view(-1, mshape[-1])[0, 0] = 1
    for kw in ({}, {"attention_mask": mask}):
        out = m(x, **kw)
        assert out.shape == shape
        expected = af_expected(m, x, mask=kw.get("attention_mask"))
        assert_close(out, expected)
        (gx,) = torch.autograd.grad(out.sum(), x)
        (gx_ref,) = torch.autograd.grad(expected.sum(), x)
        assert_close(gx, gx_ref)
    # the global formula written out once more, for one batch row, without the helper
    xs = x.detach().movedim(attn_dim, -2).reshape(-1, shape[attn_dim], 6)[0]  # (n, c_in)
    q = (xs @ m.linear_q.weight.T).mean(0).view(2, 3)  # (N_head, c): mean over positions
    k, v = xs @ m.linear_k.weight.T, xs @ m.linear_v.weight.T  # (n, c): one head
    o = torch.softmax(q @ k.T / math.sqrt(3), dim=-1) @ v  # (N_head, c)
    gate = torch.sigmoid(xs @ m.linear_g.weight.T + m.linear_g.bias)  # (n, N_head * c)
    expected_row = (gate * o.reshape(1, 6)) @ m.linear_o.weight.T + m.linear_o.bias
    got_row = m(x).detach().movedim(attn_dim, -2).reshape(-1, shape[attn_dim], 6)[0]
    assert_close(got_row, expected_row)


def test_af_fully_masked_row_gives_zero_weights():
    """All keys masked: zero weights, so the heads' output is 0 and the result is linear_o's bias."""
    m = af_module(gated=True, seed=31)
    x = randn(gen(32), 2, 4, 6)
    mask = torch.ones(2, 4)
    mask[1] = 0
    out = m(x, attention_mask=mask)
    assert torch.isfinite(out).all()
    assert_close(out[1], m.linear_o.bias.detach().expand(4, 6))
    assert (out[0] - m.linear_o.bias).abs().max() > 1e-3


def test_af_does_not_modify_inputs_or_use_torch_attention():
    m = af_module(gated=True)
    g = gen(33)
    x, bias, mask = randn(g, 3, 5, 6), randn(g, 2, 5, 5), torch.ones(3, 5)
    before = [t.clone() for t in (x, bias, mask)]
    with Recorder() as rec:
        m(x, bias=bias, attention_mask=mask)
    assert all(torch.equal(a, b) for a, b in zip((x, bias, mask), before))
    assert not any("scaled_dot_product" in op or "multi_head" in op for op in rec.ops), rec.ops


@pytest.mark.parametrize("is_global", [False, True])
def test_af_float32_and_meta(is_global):
    m = ch6()["MultiHeadAttention"](6, 3, 2, -3, gated=True, is_global=is_global)
    x = randn(gen(34), 2, 5, 3, 6, dtype=torch.float32)
    out = m(x, attention_mask=torch.ones(2, 3, 5))
    assert out.dtype == torch.float32 and out.shape == x.shape
    mm = m.to("meta")
    xm = x.to("meta")
    bias = torch.empty(2, 2, 1 if is_global else 5, 5, device="meta")
    out = mm(xm, bias=bias, attention_mask=torch.ones(2, 3, 5, device="meta"))
    assert (out.shape, out.dtype, out.device.type) == ((2, 5, 3, 6), torch.float32, "meta")
    q, k, v = (mm.prepare_qkv_global if is_global else mm.prepare_qkv)(
        xm, xm[..., :3] if is_global else xm, xm[..., :3] if is_global else xm)
    assert q.device.type == "meta" and q.shape == ((2, 3, 2, 1, 3) if is_global else (2, 3, 2, 5, 3))


# ============================================ chapter 7: efficient attention
def ch7():
    return ref("07_efficient_attention")


@pytest.mark.parametrize("block_size", [1, 3, 7, 8, 64])
@pytest.mark.parametrize("masked", [False, True])
def test_online_softmax_matches_torch_attention_and_logsumexp(block_size, masked):
    g = gen(70)
    q, k, v = randn(g, 2, 3, 5, 4), randn(g, 2, 3, 7, 4), randn(g, 2, 3, 7, 6)
    mask = torch.rand(5, 7, generator=g) > 0.4 if masked else None
    if masked:
        mask[:, 0] = True  # no fully masked row: PyTorch's convention for those is checked in ch2
    out, lse = ch7()["online_softmax_attention"](q, k, v, mask=mask, block_size=block_size)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    scores = q @ k.transpose(-2, -1) / 2.0
    if masked:
        scores = scores.masked_fill(~mask, float("-inf"))
    assert_close(lse, torch.logsumexp(scores, dim=-1))


def test_online_softmax_gradients_match_torch_attention():
    g = gen(71)
    inputs = [randn(g, 2, 4, 3).requires_grad_(), randn(g, 2, 9, 3).requires_grad_(),
              randn(g, 2, 9, 5).requires_grad_()]
    r = randn(g, 2, 4, 5)
    mine = torch.autograd.grad((ch7()["online_softmax_attention"](*inputs, block_size=4)[0] * r).sum(), inputs)
    theirs = torch.autograd.grad((F.scaled_dot_product_attention(*inputs) * r).sum(), inputs)
    for a, b in zip(mine, theirs):
        assert_close(a, b)


def test_online_softmax_fully_masked_query_and_no_full_score_matrix():
    g = gen(72)
    q, k, v = randn(g, 3, 4).requires_grad_(), randn(g, 40, 4), randn(g, 40, 2)
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[1] = False
    sizes = []

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and isinstance(out, torch.Tensor):
                sizes.append(out.numel())
            return out

    with Sizes():
        out, lse = ch7()["online_softmax_attention"](q, k, v, mask=mask, block_size=5)
    assert max(sizes) <= max(mask.numel(), k.numel()) and max(sizes) < 3 * 40 * 2
    assert torch.equal(out[1], torch.zeros(2, dtype=out.dtype)) and lse[1] == float("-inf")
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_repeat_kv_layout_is_llama_grouping():
    x = torch.arange(2 * 3 * 1 * 1).view(2, 3, 1, 1)
    y = ch7()["repeat_kv"](x, 2)
    assert y[0, :, 0, 0].tolist() == [0, 0, 1, 1, 2, 2]


def _copy_gqa(module, g):
    distinct_weights(module, g)
    return module


@pytest.mark.parametrize("H, H_kv", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_gqa_matches_torch_attention_with_enable_gqa(H, H_kv):
    g = gen(73)
    E = 2 * H
    m = _copy_gqa(ch7()["GroupedQueryAttention"](E, H, H_kv, bias=True).double(), g)
    x = randn(g, 2, 5, E)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    out, w, (k, v) = m(x, mask=causal)
    q = m.q_proj(x).view(2, 5, H, 2).transpose(1, 2)
    k_ref = m.k_proj(x).view(2, 5, H_kv, 2).transpose(1, 2)
    v_ref = m.v_proj(x).view(2, 5, H_kv, 2).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k_ref, v_ref, is_causal=True, enable_gqa=True)
    assert_close(out, m.out_proj(o.transpose(1, 2).reshape(2, 5, E)))
    assert_close(k, k_ref) and assert_close(v, v_ref)
    assert w.shape == (2, H, 5, 5) and k.shape == (2, H_kv, 5, 2)


def test_gqa_with_as_many_kv_heads_as_heads_is_chapter_3_attention():
    g = gen(74)
    gqa = _copy_gqa(ch7()["GroupedQueryAttention"](8, 4, 4, bias=False).double(), g)
    mha = ch3()["MultiHeadAttention"](8, 4, bias=False).double()
    mha.load_state_dict(gqa.state_dict())
    x = randn(g, 2, 6, 8)
    mask = torch.rand(6, 6, generator=g) > 0.3
    a, wa, _ = gqa(x, mask=mask)
    b, wb = mha(x, mask=mask)
    assert_close(a, b) and assert_close(wa, wb)


@pytest.mark.parametrize("H, H_kv", [(4, 2), (2, 1)])
def test_decoding_through_the_cache_equals_one_causal_pass(H, H_kv):
    g = gen(75)
    m = _copy_gqa(ch7()["GroupedQueryAttention"](4 * H, H, H_kv).double(), g)
    x = randn(g, 2, 7, 4 * H)
    full, _, (k_full, v_full) = m(x, mask=torch.ones(7, 7, dtype=torch.bool).tril())
    cache, outs = None, []
    for t in range(7):
        o, w, cache = m(x[:, t:t + 1], past_kv=cache)
        assert w.shape == (2, H, 1, t + 1)
        outs.append(o)
    assert_close(torch.cat(outs, dim=1), full)
    assert_close(cache[0], k_full) and assert_close(cache[1], v_full)
    assert cache[0].shape == (2, H_kv, 7, 4)


@pytest.mark.parametrize("L, window", [(6, 1), (6, 3), (4, 9), (1, 1)])
def test_sliding_window_mask_by_loops(L, window):
    mask = ch7()["sliding_window_mask"](L, window)
    expected = [[0 <= i - j < window for j in range(L)] for i in range(L)]
    assert mask.dtype == torch.bool and mask.tolist() == expected


def _alibi_slopes_from_the_paper(n):
    """ofirpress/attention_with_linear_biases, get_slopes_power_of_2."""
    start = 2 ** (-2 ** -(math.log2(n) - 3))
    return [start * start ** i for i in range(n)]


@pytest.mark.parametrize("H", [1, 2, 8, 16])
def test_alibi_slopes_match_the_papers_code(H):
    bias = ch7()["alibi_bias"](H, 5)
    slopes = torch.tensor(_alibi_slopes_from_the_paper(H), dtype=bias.dtype)
    assert_close(-bias[:, 1, 0], slopes)
    for i in range(5):
        for j in range(5):
            want = -slopes * (i - j) if j <= i else torch.full((H,), float("-inf"), dtype=bias.dtype)
            assert_close(bias[:, i, j], want)
    with pytest.raises(ValueError):
        ch7()["alibi_bias"](12, 3)


def test_chapter7_on_meta():
    r = ch7()
    t = lambda *s: torch.randn(*s, device="meta")  # noqa: E731
    out, lse = r["online_softmax_attention"](t(2, 3, 4), t(2, 9, 4), t(2, 9, 5), block_size=4)
    assert out.shape == (2, 3, 5) and lse.shape == (2, 3) and out.device.type == "meta"
    m = r["GroupedQueryAttention"](8, 4, 2).to("meta")
    o, w, (k, v) = m(t(2, 3, 8), past_kv=(t(2, 2, 4, 2), t(2, 2, 4, 2)))
    assert o.shape == (2, 3, 8) and w.shape == (2, 4, 3, 7) and k.shape == (2, 2, 7, 2)
    assert r["sliding_window_mask"](5, 2, device="meta").device.type == "meta"
    assert r["alibi_bias"](4, 5, device="meta").device.type == "meta"


# ============================================ every chapter on CUDA, where there is a GPU
def _portable_calls(device: str) -> list:
    """(name, output) pairs from every reference, run with inputs and modules on `device`."""
    g = gen(40)
    t = lambda *shape: randn(g, *shape, dtype=torch.float32).to(device)  # noqa: E731
    out = []
    out.append(("softmax", ch1()["softmax"](t(3, 4) * 1000, dim=0)))
    out.append(("attention_pool", ch1()["attention_pool"](t(2, 4), t(2, 5, 4), t(2, 5, 3))[0]))
    mask = (torch.rand(3, 5, generator=g) > 0.3).to(device)
    mask[0] = False
    out.append(("sdpa", ch2()["scaled_dot_product_attention"](t(2, 3, 4), t(2, 5, 4), t(2, 5, 6), mask=mask)[0]))
    torch.manual_seed(0)
    for name, module, args in [
        ("SelfAttention", ch2()["SelfAttention"](4, 3), (t(2, 5, 4),)),
        ("MultiHeadAttention", ch3()["MultiHeadAttention"](8, 2), (t(2, 5, 8), t(2, 3, 8))),
        ("MultiHeadSelfAttention", ch3()["MultiHeadSelfAttention"](8, 2), (t(2, 5, 8),)),
        ("SinusoidalPositionalEncoding", ch4()["SinusoidalPositionalEncoding"](8, 10), (t(2, 5, 8),)),
        ("LearnedPositionalEmbedding", ch4()["LearnedPositionalEmbedding"](10, 8), (t(2, 5, 8),)),
        ("af", ch6()["MultiHeadAttention"](6, 3, 2, -2, gated=True), (t(3, 5, 6),)),
        ("af_global", ch6()["MultiHeadAttention"](6, 3, 2, -2, gated=True, is_global=True), (t(3, 5, 6),)),
        ("GroupedQueryAttention", ch7()["GroupedQueryAttention"](8, 4, 2), (t(2, 5, 8),)),
    ]:
        distinct_weights(module, gen(41))
        result = module.to(device)(*args)
        out.append((name, result[0] if isinstance(result, tuple) else result))
    out.append(("rope", ch4()["apply_rotary_embedding"](t(2, 5, 8))))
    with torch.device(device):
        out.append(("sinusoidal", ch4()["sinusoidal_positional_encoding"](7, 5)))
    out.append(("causal", ch5()["causal_mask"](4, device=device)))
    tokens = torch.tensor([[1, 2, 0], [3, 0, 0]], device=device)
    out.append(("decoder", ch5()["decoder_mask"](tokens)))
    out.append(("online", ch7()["online_softmax_attention"](t(2, 3, 4), t(2, 5, 4), t(2, 5, 6), mask=mask,
                                                              block_size=2)[0]))
    out.append(("window", ch7()["sliding_window_mask"](5, 2, device=device)))
    out.append(("alibi", ch7()["alibi_bias"](4, 5, device=device).exp()))
    return out


@pytest.mark.cuda
def test_references_on_cuda_match_cpu():
    for (name, got), (_, expected) in zip(_portable_calls("cuda"), _portable_calls("cpu")):
        assert got.device.type == "cuda", name
        assert got.dtype == expected.dtype, name
        if got.is_floating_point():
            assert_close(got.cpu(), expected, torch.float32, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(got.cpu(), expected), name


def test_portable_calls_run_on_cpu():
    for name, value in _portable_calls("cpu"):
        assert value.device.type == "cpu" and (not value.is_floating_point() or torch.isfinite(value).all()), name

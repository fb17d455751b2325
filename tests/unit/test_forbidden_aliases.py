"""Forbidden built-ins found by what runs, not by what they are called (issue 27.4).

Each alias below is PyTorch's softmax or attention under another name, written as a student
would hand it in: the static check (the grader's own reading of the source, an allow-list of
torch namespaces) flags it, and where it runs a watched op, the run-time recorder (at the
dispatcher, so it sees the ops that other ops call inside) records it. Honest code that uses
allowed torch namespaces is not flagged."""
from __future__ import annotations

import pytest

from autograder.runtime.execute import _Recorder
from autograder.source.forbidden import foreign_namespace
from test_static_check import CH1, CH2, check, flagged

SOFTMAX_ALIASES = {
    "softmin": """
        def softmax(x, dim=-1):
            return F.softmin(-x, dim)
        """,
    "nn.Softmin": """
        def softmax(x, dim=-1):
            return nn.Softmin(dim)(-x)
        """,
    "torch._refs": """
        import torch._refs
        def softmax(x, dim=-1):
            return torch._refs.softmax(x, dim)
        """,
    "torch._decomp": """
        from torch._decomp import decomposition_table
        def softmax(x, dim=-1):
            return decomposition_table[torch.ops.aten._softmax.default](x, dim, False)
        """,
    "torch.masked": """
        def softmax(x, dim=-1):
            return torch.masked.softmax(x, dim)
        """,
}

ATTENTION_ALIASES = {
    "torch.onnx.ops.attention": """
        import torch.onnx.ops
        def scaled_dot_product_attention(q, k, v, mask=None):
            out = torch.onnx.ops.attention(q, k, v, attn_mask=mask)
            return out[0], out[3]
        """,
    "ONNX decomposition": """
        from torch.onnx.ops import _impl
        def scaled_dot_product_attention(q, k, v, mask=None):
            out = _impl.attention_23(q, k, v, attn_mask=mask)
            return out[0], out[3]
        """,
    "flex_attention": """
        from torch.nn.attention.flex_attention import flex_attention
        def scaled_dot_product_attention(q, k, v, mask=None):
            return flex_attention(q, k, v), None
        """,
    "nn.attention in the function": """
        def scaled_dot_product_attention(q, k, v, mask=None):
            from torch.nn.attention import sdpa_kernel
            with sdpa_kernel([]):
                return q, None
        """,
}

HONEST = """
def softmax(x, dim=-1):
    x = torch.nn.init.zeros_(torch.empty(0)).sum() + x
    e = torch.exp(x - torch.linalg.vector_norm(x, ord=float("inf"), dim=dim, keepdim=True) * 0
                  - x.amax(dim=dim, keepdim=True))
    return e / torch.special.expit(torch.zeros(())).mul(2) / e.sum(dim=dim, keepdim=True)
"""


@pytest.mark.parametrize("name", sorted(SOFTMAX_ALIASES))
def test_a_softmax_under_another_name_is_flagged(name):
    assert flagged(check(CH1, SOFTMAX_ALIASES[name])).get("softmax"), name


@pytest.mark.parametrize("name", sorted(ATTENTION_ALIASES))
def test_attention_under_another_name_is_flagged(name):
    assert flagged(check(CH2, ATTENTION_ALIASES[name])).get("scaled_dot_product_attention"), name


def test_allowed_namespaces_are_not_flagged():
    assert not flagged(check(CH1, HONEST))
    for path in ("torch.nn.functional.softmin", "torch.linalg.norm", "torch.nn.init.zeros_",
                 "torch.utils.checkpoint.checkpoint", "torch.exp", "torch.Tensor.exp", "torch.jit.script"):
        assert foreign_namespace(path) is None, path
    for path, first in (("torch.onnx.ops.attention", "torch.onnx"), ("torch._refs.softmax", "torch._refs"),
                        ("torch.nn.attention.flex_attention.flex_attention", "torch.nn.attention")):
        assert foreign_namespace(path) == first


def test_the_recorder_sees_the_softmax_inside_softmin_and_the_attention_inside_onnx():
    import torch.nn.functional as F
    import torch.onnx.ops

    seen: set = set()
    x = torch.randn(2, 2, 3, 4)
    with _Recorder(seen):
        F.softmin(x, -1)
    assert "aten._softmax" in seen
    seen.clear()
    with _Recorder(seen):
        torch.onnx.ops.attention(x, x, x)
    assert any("scaled_dot_product" in s for s in seen)
    seen.clear()
    with _Recorder(seen):
        torch.nn.MultiheadAttention(4, 2, batch_first=True)(x[0], x[0], x[0])
    assert "multi_head_attention_forward" in seen
    seen.clear()
    x.exp() / x.exp().sum(-1, keepdim=True)  # outside the block: nothing
    with _Recorder(seen):
        x.exp() / x.exp().sum(-1, keepdim=True)  # a softmax written out: nothing either
    assert not seen

"""Chapter 6 grading (the AlphaFold-style module): the reference scores full marks, realistic
mistakes lose credit on the exercise they touch only, hints name the mistake, equivalent
formulations score full marks, PyTorch's ready-made attention scores zero.
What every chapter shares is in test_grading.py."""
import functools
import textwrap

import pytest
import torch

from autograder.cases import build_cases
from autograder.runtime.execute import execute
from autograder.references.solutions import load_reference

from grading_helpers import GRADER, check_buggy, check_equivalent, failures, full, grade_in, namespace_of

CH = "06_gated_global_attention"
namespace = functools.partial(namespace_of, CH)  # the reference with `src` run on top
grade = functools.partial(grade_in, CH)


# The module written independently of the reference: forward does its own head split (so a broken
# prepare_qkv only costs prepare_qkv), works in a (*, L, H, c) layout with einsum, and masks by filling
# with the dtype's lowest value and multiplying by the mask. A template: each buggy variant changes one marked line.
AF = """
class MultiHeadAttention(nn.Module):
    def __init__(self, c_in, c, N_head, attn_dim, gated=False, is_global=False, use_bias_for_embeddings=False):
        super().__init__()
        self.c, self.N_head, self.attn_dim, self.gated, self.is_global = c, N_head, attn_dim, gated, is_global
        kv = c if is_global else c * N_head                                     # @kv
        self.linear_q = nn.Linear(c_in, c * N_head, bias=use_bias_for_embeddings)
        self.linear_k = nn.Linear(c_in, kv, bias=use_bias_for_embeddings)
        self.linear_v = nn.Linear(c_in, kv, bias=use_bias_for_embeddings)
        self.linear_o = nn.Linear(c * N_head, c_in)
        if gated:
            self.linear_g = nn.Linear(c_in, c * N_head)

    def prepare_qkv(self, q, k, v):
        out = []
        for t in (q, k, v):
            t = torch.movedim(t, self.attn_dim, -2)                             # @p-move (*, L, N_head*c)
            t = t.unflatten(-1, (self.N_head, self.c))                          # @p-split (*, L, N_head, c)
            n = t.dim()
            out.append(t.permute(*range(n - 3), n - 2, n - 3, n - 1))           # @p-perm (*, N_head, L, c)
        return tuple(out)

    def prepare_qkv_global(self, q, k, v):
        q = torch.movedim(q, self.attn_dim, -2)
        q = q.reshape(*q.shape[:-1], self.N_head, self.c).mean(dim=-3)         # @g-mean (*, N_head, c)
        q = q.unsqueeze(-2)                                                     # @g-keep (*, N_head, 1, c)
        k = torch.movedim(k, self.attn_dim, -2)[..., None, :, :]                # @g-k (*, 1, k, c)
        v = torch.movedim(v, self.attn_dim, -2)[..., None, :, :]                # @g-v (*, 1, v, c)
        return q, k, v

    def forward(self, x, bias=None, attention_mask=None):
        H, c = self.N_head, self.c
        xm = x.movedim(self.attn_dim, -2)                                       # @f-move (*, L, c_in)
        q = self.linear_q(xm).unflatten(-1, (H, c))                             # (*, L, H, c)
        k, v = self.linear_k(xm), self.linear_v(xm)
        if self.is_global:
            q = q.mean(-3, keepdim=True)                                        # @f-global (*, 1, H, c)
            k = k.unsqueeze(-2).expand(*k.shape[:-1], H, c)                     # (*, L, H, c)
            v = v.unsqueeze(-2).expand(*v.shape[:-1], H, c)
        else:
            k, v = k.unflatten(-1, (H, c)), v.unflatten(-1, (H, c))
        s = torch.einsum("...qhc,...khc->...hqk", q, k) / math.sqrt(c)         # @f-scale (*, H, q, k)
        if bias is not None:
            b = bias
            while b.dim() < s.dim():
                b = b.unsqueeze(bias.dim() - 3)                                 # @f-bias
            s = s + b
        if attention_mask is not None:
            keep = (attention_mask != 0)[..., None, None, :]                    # @f-mask (*, 1, 1, k)
            w = torch.softmax(s.masked_fill(~keep, torch.finfo(s.dtype).min), dim=-1) * keep  # @f-dead
        else:
            w = torch.softmax(s, dim=-1)                                        # @f-softmax
        o = torch.einsum("...hqk,...khc->...qhc", w, v).flatten(-2)             # (*, q, H*c)
        if self.gated:
            o = o * torch.sigmoid(self.linear_g(xm))                            # @f-gate
        return self.linear_o(o).movedim(-2, self.attn_dim)                      # @f-out
"""


def patch(template: str, marker: str, new: str) -> str:
    """Replace the line marked `# @marker` by `new`, keeping its indentation."""
    lines = template.splitlines()
    hits = [i for i, line in enumerate(lines) if line.rstrip().endswith(f"# @{marker}") or f"# @{marker} " in line]
    assert len(hits) == 1, marker
    line = lines[hits[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[hits[0]] = textwrap.indent(textwrap.dedent(new), indent)
    return "\n".join(lines)


# (id, exercise, source, words the hint of the first CPU failure must contain, or None)
BUGGY = [
    ("prepare-attn-dim-ignored", "prepare_qkv", patch(AF, "p-move", "pass"), "attn_dim is ignored"),
    ("prepare-heads-c-major", "prepare_qkv", patch(
        patch(AF, "p-split", "t = t.unflatten(-1, (self.c, self.N_head)).transpose(-1, -2)"),
        "p-perm", "out.append(t.transpose(-3, -2))"), "wrong order"),
    ("prepare-reshape-no-transpose", "prepare_qkv",
     patch(AF, "p-perm", "out.append(t.reshape(*t.shape[:-3], self.N_head, t.shape[-3], self.c))"),
     "mixes positions"),
    ("global-no-keepdim", "prepare_qkv_global", patch(AF, "g-keep", "pass"), "keepdim=True"),
    ("global-sum-not-mean", "prepare_qkv_global",
     patch(AF, "g-mean", "q = q.reshape(*q.shape[:-1], self.N_head, self.c).sum(dim=-3)"), "averag"),
    ("global-keys-unsqueezed-last", "prepare_qkv_global",
     patch(patch(AF, "g-k", "k = torch.movedim(k, self.attn_dim, -2)[..., None, :]"),
           "g-v", "v = torch.movedim(v, self.attn_dim, -2)[..., None, :]"), "k.unsqueeze(-3)"),
    ("scale-by-sqrt-c-times-heads", "MultiHeadAttention",
     patch(AF, "f-scale", 's = torch.einsum("...qhc,...khc->...hqk", q, k) / math.sqrt(c * H)'),
     "sqrt(c * N_head)"),
    ("unscaled", "MultiHeadAttention",
     patch(AF, "f-scale", 's = torch.einsum("...qhc,...khc->...hqk", q, k)'), "unscaled"),
    ("gate-after-linear-o", "MultiHeadAttention", patch(patch(
        AF, "f-gate", "pass"), "f-out", """
        out = self.linear_o(o)
        if self.gated:
            out = torch.sigmoid(self.linear_g(xm)) * out
        return out.movedim(-2, self.attn_dim)"""), "after linear_o"),
    ("gate-without-sigmoid", "MultiHeadAttention",
     patch(AF, "f-gate", "o = o * self.linear_g(xm)"), "sigmoid"),
    ("gate-ignored", "MultiHeadAttention", patch(AF, "f-gate", "pass"), "gating has no effect"),
    ("bias-right-aligned", "MultiHeadAttention", patch(AF, "f-bias", "break"), "broadcast from the right"),
    ("mask-on-queries", "MultiHeadAttention", patch(patch(
        AF, "f-mask", "keep = (attention_mask != 0)[..., None, :, None]"),
        "f-dead", "w = torch.softmax(s.masked_fill(~keep, torch.finfo(s.dtype).min), dim=-1) * keep"),
        "acts on the queries"),
    ("mask-inverted", "MultiHeadAttention",
     patch(AF, "f-mask", "keep = (attention_mask == 0)[..., None, None, :]"), "inverted"),
    ("attn-dim-ignored", "MultiHeadAttention", patch(patch(
        AF, "f-move", "xm = x"), "f-out", "return self.linear_o(o)"), "attn_dim is ignored"),
    ("softmax-over-queries", "MultiHeadAttention",
     patch(AF, "f-scale", 's = torch.einsum("...qhc,...khc->...hkq", q, k) / math.sqrt(c)'), None),
    ("worksheet-offset-mask", "MultiHeadAttention",
     patch(AF, "f-dead", "w = torch.softmax(s + (~keep) * -1e8, dim=-1)"), "-1e8"),
    ("fully-masked-nan", "MultiHeadAttention",
     patch(AF, "f-dead", 'w = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)'), "NaN"),
    ("mask-laid-out-like-x", "MultiHeadAttention",  # silent where N_seq = N_res (issue #12)
     patch(AF, "f-mask", "keep = (attention_mask.movedim(self.attn_dim + 1, -1) != 0)[..., None, None, :]"),
     None),  # fails loudly first (S != R); named where it is silent, see the test below
    ("global-averages-outputs", "MultiHeadAttention", patch(patch(
        AF, "f-global", "pass"), "f-gate", """
        if self.is_global:
            o = o.mean(-2, keepdim=True)
        o = o * torch.sigmoid(self.linear_g(xm))"""), "averages the queries"),
]


@pytest.mark.parametrize("name, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_implementation_loses_credit_on_its_exercise_only(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)


def test_multi_head_keys_in_global_mode_cost_the_global_exercises_and_are_explained():
    # linear_k / linear_v built for N_head heads even when global: a construction mistake, so the
    # global method (graded on the module as constructed) and the global forward cases fail.
    result = grade(namespace(patch(AF, "kv", "kv = c * N_head")))
    assert full(result["prepare_qkv"])
    for ex in ("prepare_qkv_global", "MultiHeadAttention"):
        assert result[ex]["score"] < result[ex]["max"]
    first = result["prepare_qkv_global"]["first"]
    assert first.aspect == "params" and "one key/value head" in first.hint
    failed = {c[0] for c in failures(result["MultiHeadAttention"])}
    assert failed and all("global" in case for case in failed), failed


def test_bias_broadcast_from_the_right_fails_silently_when_B_equals_S_and_is_named():
    src = next(b[2] for b in BUGGY if b[0] == "bias-right-aligned")
    e = grade(namespace(src))["MultiHeadAttention"]
    silent = [c for t in e["tests"] if t.device == "cpu" for c in t.cases
              if not c.passed and c.case.startswith("B == S")]
    assert silent and silent[0].aspect == "values" and "broadcast from the right" in silent[0].hint


def test_worksheet_offset_mask_fails_only_fully_masked_rows():
    src = next(b[2] for b in BUGGY if b[0] == "worksheet-offset-mask")
    e = grade(namespace(src))["MultiHeadAttention"]
    cpu_failed = {c.case for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed}
    assert cpu_failed and all("fully masked" in case for case in cpu_failed), cpu_failed


# The worksheet's structure (forward calls prepare_qkv / prepare_qkv_global), with the course's
# fully-masked-row convention.
WORKSHEET = """
class MultiHeadAttention(nn.Module):
    def __init__(self, c_in, c, N_head, attn_dim, gated=False, is_global=False, use_bias_for_embeddings=False):
        super().__init__()
        self.c_in, self.c, self.N_head, self.gated, self.attn_dim, self.is_global = (
            c_in, c, N_head, gated, attn_dim, is_global)
        self.linear_q = nn.Linear(c_in, c * N_head, bias=use_bias_for_embeddings)
        c_kv = c if is_global else c * N_head
        self.linear_k = nn.Linear(c_in, c_kv, bias=use_bias_for_embeddings)
        self.linear_v = nn.Linear(c_in, c_kv, bias=use_bias_for_embeddings)
        self.linear_o = nn.Linear(c * N_head, c_in)
        if gated:
            self.linear_g = nn.Linear(c_in, c * N_head)

    def prepare_qkv(self, q, k, v):
        q, k, v = (t.movedim(self.attn_dim, -2) for t in (q, k, v))
        q = q.view(q.shape[:-1] + (self.N_head, -1)).transpose(-2, -3)
        k = k.view(k.shape[:-1] + (self.N_head, -1)).transpose(-2, -3)
        v = v.view(v.shape[:-1] + (self.N_head, -1)).transpose(-2, -3)
        return q, k, v

    def prepare_qkv_global(self, q, k, v):
        q, k, v = (t.movedim(self.attn_dim, -2) for t in (q, k, v))
        q = q.view(q.shape[:-1] + (self.N_head, self.c)).transpose(-2, -3)
        k, v = k.unsqueeze(-3), v.unsqueeze(-3)
        return torch.mean(q, dim=-2, keepdim=True), k, v

    def forward(self, x, bias=None, attention_mask=None):
        q, k, v = self.linear_q(x), self.linear_k(x), self.linear_v(x)
        q, k, v = (self.prepare_qkv_global if self.is_global else self.prepare_qkv)(q, k, v)
        q = q / math.sqrt(self.c)
        a = torch.einsum("...qc,...kc->...qk", q, k)
        if bias is not None:
            bias_batch_shape = bias.shape[:-3]
            bias_bc_shape = bias_batch_shape + (1,) * (a.ndim - len(bias_batch_shape) - 3) + bias.shape[-3:]
            a = a + bias.view(bias_bc_shape)
        if attention_mask is not None:
            a = a.masked_fill(attention_mask[..., None, None, :] == 0, float("-inf"))
        dead = torch.isneginf(a).all(dim=-1, keepdim=True)
        a = torch.softmax(a.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
        o = torch.einsum("...qk,...kc->...qc", a, v)
        o = o.transpose(-3, -2)
        o = torch.flatten(o, start_dim=-2)
        o = o.moveaxis(-2, self.attn_dim)
        if self.gated:
            g = torch.sigmoid(self.linear_g(x))
            o = g * o
        return self.linear_o(o)
"""

CORRECT = [
    ("independent-einsum-template", AF),
    ("worksheet-structure-with-zero-rows", WORKSHEET),
]


@pytest.mark.parametrize("name, src", CORRECT, ids=[c[0] for c in CORRECT])
def test_equivalent_implementations_score_full_marks(name, src):
    check_equivalent(CH, src)


def test_a_prepare_qkv_mistake_also_costs_forward_when_forward_uses_it():
    src = WORKSHEET
    for t in "qkv":  # the heads' channels taken as (c, N_head)
        src = src.replace(f"{t} = {t}.view({t}.shape[:-1] + (self.N_head, -1))",
                          f"{t} = {t}.view({t}.shape[:-1] + (-1, self.N_head)).transpose(-1, -2)")
    assert src.count("(-1, self.N_head)") == 3
    result = grade(namespace(src))
    assert result["prepare_qkv"]["score"] < result["prepare_qkv"]["max"]
    assert "wrong order" in result["prepare_qkv"]["first"].hint
    assert full(result["prepare_qkv_global"])
    assert result["MultiHeadAttention"]["score"] < result["MultiHeadAttention"]["max"]


@pytest.mark.parametrize("src", ["""
    Reference = MultiHeadAttention

    class MultiHeadAttention(Reference):
        def forward(self, x, bias=None, attention_mask=None):
            q, k, v = self.linear_q(x), self.linear_k(x), self.linear_v(x)
            q, k, v = (self.prepare_qkv_global if self.is_global else self.prepare_qkv)(q, k, v)
            am = None
            if bias is not None:
                am = bias.reshape(*bias.shape[:-3], *(1,) * (q.dim() - bias.dim()), *bias.shape[-3:])
            if attention_mask is not None:
                keep = (attention_mask != 0)[..., None, None, :]
                am = keep if am is None else am.masked_fill(~keep, float("-inf"))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=am)        # (*, N_head, q, c)
            o = o.transpose(-3, -2).flatten(-2).movedim(-2, self.attn_dim)
            if self.gated:
                o = torch.sigmoid(self.linear_g(x)) * o
            return self.linear_o(o)
    """], ids=["F.scaled_dot_product_attention"])
def test_pytorch_ready_made_attention_scores_zero_with_a_note(src):
    result = grade(namespace(src))
    e = result["MultiHeadAttention"]
    assert e["score"] == 0
    assert e["notes"] and all("ready-made attention" in n for n in e["notes"])
    for other in ("prepare_qkv", "prepare_qkv_global"):
        assert full(result[other]), other


def test_every_layer_gets_its_own_weights_and_gating_matters():
    ref = load_reference(CH)
    cases = build_cases(CH, "MultiHeadAttention", ref, seed=GRADER.seed)
    for c in cases:
        values = [v.flatten() for v in c.state.values()]
        for i in range(len(values)):
            for j in range(i + 1, len(values)):
                assert values[i].shape != values[j].shape or not torch.allclose(values[i], values[j]), c.case
    gated = [c for c in cases if c.init.get("gated")]
    assert any(c.init.get("is_global") for c in gated) and len(gated) >= 5
    for c in gated:  # the same module without its gate gives another output
        ungated = execute(namespace(patch(AF, "f-gate", "pass")), c)
        assert not torch.allclose(execute(ref, c).outputs[0], ungated.outputs[0], atol=1e-3), c.case


def test_a_mask_laid_out_like_x_fails_silently_where_N_seq_equals_N_res_and_is_named():
    src = next(b[2] for b in BUGGY if b[0] == "mask-laid-out-like-x")
    e = grade(namespace(src))["MultiHeadAttention"]
    square = [c for t in e["tests"] if t.device == "cpu" for c in t.cases if "N_seq = N_res" in c.case]
    assert square and not square[0].passed and square[0].aspect == "values"
    assert "wrong layout" in square[0].hint

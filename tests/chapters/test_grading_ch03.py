"""Chapter 3 grading: the reference scores full marks, realistic mistakes lose credit on the
exercise they touch only, hints name the mistake, equivalent formulations score full marks,
PyTorch's ready-made attention scores zero, training-mode dropout is graded by properties that
hold whatever the random stream.
What every chapter shares is in test_grading.py."""
import dataclasses
import functools
import textwrap

import pytest
import torch

from autograder.cases import build_cases
from autograder.cases import ch03_multi_head_attention as ch03
from autograder.runtime.execute import execute
from autograder.cases.inputs import generator
from autograder.references.solutions import load_reference

from grading_helpers import GRADER, check_buggy, check_equivalent, failures, full, grade_in, namespace_of

CH = "03_multi_head_attention"
namespace = functools.partial(namespace_of, CH)  # the reference with `src` run on top
grade = functools.partial(grade_in, CH)


# A multi-head attention written independently of the reference (einsum, its own head split, an
# nn.Dropout layer), as a template: the buggy variants below change one marked line each.
MHA = """
class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:                                        # @check
            raise ValueError("embed_dim must be divisible by num_heads")
        self.h, self.d = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def _heads(self, x):
        return x.unflatten(-1, (self.h, self.d)).transpose(1, 2)        # @split (B, H, L, d)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key                              # @key
        value = key if value is None else value                          # @value
        q, k, v = self._heads(self.q_proj(query)), self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.d)    # @scale
        if mask is not None:
            if mask.dtype == torch.bool:
                s = s.masked_fill(~mask, float("-inf"))                  # @mask
            else:
                s = s + mask
        dead = torch.isneginf(s).all(-1, keepdim=True)                   # @dead
        w = torch.softmax(s.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)  # @softmax
        o = torch.einsum("bhqk,bhkd->bhqd", self.drop(w), v)             # @dropout
        o = o.transpose(1, 2).flatten(2)                                 # @merge (B, L_q, E)
        return self.out_proj(o), w                                       # @out
"""

MHSA = """
class MultiHeadSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x, mask=None):
        B, N, E = x.shape
        q, k, v = self.qkv_proj(x).view(B, N, 3, self.h, self.d).permute(2, 0, 3, 1, 4)  # @layout
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        dead = torch.isneginf(s).all(-1, keepdim=True)
        w = torch.softmax(s.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, N, E)), w
"""


def patch(template: str, marker: str, new: str) -> str:
    """Replace the line marked `# @marker` (up to the marker) by `new`, keeping its indentation."""
    lines = template.splitlines()
    hits = [i for i, line in enumerate(lines) if line.rstrip().endswith(f"# @{marker}") or f"# @{marker} " in line]
    assert len(hits) == 1, marker
    line = lines[hits[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[hits[0]] = textwrap.indent(textwrap.dedent(new), indent)
    return "\n".join(lines)


# (id, exercise, source, words the hint of the first CPU failure must contain, or None)
BUGGY = [
    ("split-dh-order", "split_heads", """
        def split_heads(x, num_heads):
            *lead, L, D = x.shape
            return x.view(*lead, L, D // num_heads, num_heads).transpose(-1, -2).transpose(-3, -2)
        """, "wrong order"),
    ("split-reshape-no-transpose", "split_heads", """
        def split_heads(x, num_heads):
            *lead, L, D = x.shape
            return x.reshape(*lead, num_heads, L, D // num_heads)
        """, "mixes positions"),
    ("split-hardcoded-batch", "split_heads", """
        def split_heads(x, num_heads):
            B, L, D = x.shape
            return x.view(B, L, num_heads, D // num_heads).transpose(1, 2)
        """, None),
    ("merge-no-transpose", "merge_heads", """
        def merge_heads(x):
            *lead, H, L, d = x.shape
            return x.reshape(*lead, L, H * d)
        """, "without transposing back"),
    ("merge-dh-order", "merge_heads", """
        def merge_heads(x):
            *lead, H, L, d = x.shape
            return x.permute(*range(len(lead)), -2, -1, -3).reshape(*lead, L, H * d)
        """, "wrong order"),
    ("mha-unscaled", "MultiHeadAttention",
     patch(MHA, "scale", 's = torch.einsum("bhqd,bhkd->bhqk", q, k)'), "unscaled"),
    ("mha-scaled-by-sqrt-E", "MultiHeadAttention",
     patch(MHA, "scale", 's = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.h * self.d)'),
     "sqrt(embed_dim)"),
    ("mha-softmax-over-queries", "MultiHeadAttention",
     patch(MHA, "softmax", 'w = torch.softmax(s.masked_fill(dead, 0.0), dim=-2).masked_fill(dead, 0.0)'),
     "wrong axis"),
    ("mha-mask-inverted", "MultiHeadAttention",
     patch(MHA, "mask", 's = s.masked_fill(mask, float("-inf"))'), "inverted"),
    ("mha-value-defaults-to-query", "MultiHeadAttention",
     patch(MHA, "value", 'value = query if value is None else value'), "defaults to key"),
    ("mha-no-out-proj", "MultiHeadAttention", patch(MHA, "out", "return o, w"), "out_proj is missing"),
    ("mha-heads-dh-order", "MultiHeadAttention", patch(patch(
        MHA, "split", "return x.unflatten(-1, (self.d, self.h)).permute(0, 3, 1, 2)"),
        "merge", "o = o.permute(0, 2, 3, 1).flatten(2)"), "split and merged in the wrong order"),
    ("mha-merge-no-transpose", "MultiHeadAttention",
     patch(MHA, "merge", "o = o.reshape(o.shape[0], o.shape[2], -1)"), "transposing"),
    ("mha-no-value-error", "MultiHeadAttention", patch(MHA, "check", "if False:"), "raise ValueError"),
    ("mha-dropout-always-on", "MultiHeadAttention",
     patch(MHA, "dropout", 'o = torch.einsum("bhqk,bhkd->bhqd", F.dropout(w, self.drop.p, training=True), v)'),
     "eval mode"),
    ("mha-fully-masked-nan", "MultiHeadAttention", patch(patch(
        MHA, "dead", "dead = None"), "softmax", "w = torch.softmax(s, dim=-1)"), "NaN"),
    ("mha-fully-masked-uniform", "MultiHeadAttention",
     patch(MHA, "mask", 's = s.masked_fill(~mask, -1e9)'), "uniform average"),
    ("mhsa-layout-h3d", "MultiHeadSelfAttention",
     patch(MHSA, "layout", "q, k, v = self.qkv_proj(x).view(B, N, self.h, 3, self.d).permute(3, 0, 2, 1, 4)"),
     "(B, N, 3, H, d_h)"),
    ("mhsa-three-projections", "MultiHeadSelfAttention", """
        class MultiHeadSelfAttention(MultiHeadAttention):
            def __init__(self, embed_dim, num_heads, bias=True):
                super().__init__(embed_dim, num_heads, bias)

            def forward(self, x, mask=None):
                return super().forward(x, mask=mask)
        """, "fused qkv_proj"),
    ("mhsa-no-scale", "MultiHeadSelfAttention", MHSA.replace(" / math.sqrt(self.d)", ""), "unscaled"),
    ("mha-bias-false-ignored", "MultiHeadAttention", MHA.replace("bias=bias", "bias=True"), "bias=False"),
    ("mhsa-bias-false-ignored", "MultiHeadSelfAttention", MHSA.replace("bias=bias", "bias=True"), "bias=False"),
    ("mha-assert-not-value-error", "MultiHeadAttention",
     patch(MHA, "check", "assert embed_dim % num_heads == 0\nif False:"), "raise ValueError"),
    ("mha-float-mask-ignored", "MultiHeadAttention", MHA.replace("                s = s + mask\n", "                pass\n"),
     None),
]


@pytest.mark.parametrize("name, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_implementation_loses_credit_on_its_exercise_only(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)


def test_a_hardcoded_batch_split_fails_on_unbatched_and_extra_dims_only():
    src = next(b[2] for b in BUGGY if b[0] == "split-hardcoded-batch")
    e = grade(namespace(src))["split_heads"]
    failed = {c[0] for c in failures(e)}
    assert failed and all("unbatched" in c or "leading dims" in c or "batch (2, 3)" in c for c in failed), failed


CORRECT = [
    ("independent-einsum-template", MHA + MHSA),
    ("permute-reshape-helpers-manual-softmax", """
        def split_heads(x, num_heads):
            *lead, L, D = x.shape
            n = len(lead)
            return x.reshape(*lead, L, num_heads, -1).permute(*range(n), n + 1, n, n + 2)

        def merge_heads(x):
            return torch.cat(x.unbind(-3), dim=-1)                      # heads side by side

        def _attend(q, k, v, mask):
            s = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            if mask is not None:
                bias = torch.where(mask, 0.0, float("-inf")).to(s.dtype) if mask.dtype == torch.bool else mask
                s = s + bias
            m = s.amax(-1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s - m)
            w = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
            return w

        class MultiHeadAttention(nn.Module):
            def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
                super().__init__()
                if embed_dim % num_heads != 0:
                    raise ValueError("bad")
                self.num_heads, self.p = num_heads, dropout
                for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    setattr(self, name, nn.Linear(embed_dim, embed_dim, bias))

            def forward(self, query, key=None, value=None, mask=None):
                if key is None:
                    key = query
                if value is None:
                    value = key
                q = split_heads(self.q_proj(query), self.num_heads)
                k = split_heads(self.k_proj(key), self.num_heads)
                v = split_heads(self.v_proj(value), self.num_heads)
                w = _attend(q, k, v, mask)
                o = F.dropout(w, self.p, self.training) @ v
                return self.out_proj(merge_heads(o)), w

        class MultiHeadSelfAttention(nn.Module):
            def __init__(self, embed_dim, num_heads, bias=True):
                super().__init__()
                self.num_heads = num_heads
                self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
                self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

            def forward(self, x, mask=None):
                q, k, v = self.qkv_proj(x).chunk(3, dim=-1)             # (B, N, E) each
                q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))
                w = _attend(q, k, v, mask)
                return self.out_proj(merge_heads(w @ v)), w
        """),
]


@pytest.mark.parametrize("name, src", CORRECT, ids=[c[0] for c in CORRECT])
def test_equivalent_implementations_score_full_marks(name, src):
    check_equivalent(CH, src)


@pytest.mark.parametrize("src", [
    """
    class MultiHeadAttention(nn.Module):    # nn.MultiheadAttention with the contract's names
        def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
            super().__init__()
            if embed_dim % num_heads:
                raise ValueError("bad")
            self.num_heads, self.p = num_heads, dropout
            self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
            self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
            self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
            self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

        def forward(self, query, key=None, value=None, mask=None):
            key = query if key is None else key
            value = key if value is None else value
            E = query.shape[-1]
            mha = nn.MultiheadAttention(E, self.num_heads, dropout=self.p, bias=self.q_proj.bias is not None,
                                        batch_first=True).to(query)
            with torch.no_grad():
                mha.in_proj_weight.copy_(torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]))
                if self.q_proj.bias is not None:
                    mha.in_proj_bias.copy_(torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))
                    mha.out_proj.bias.copy_(self.out_proj.bias)
                mha.out_proj.weight.copy_(self.out_proj.weight)
            attn_mask = None if mask is None else (~mask if mask.dtype == torch.bool else mask)
            if attn_mask is not None and attn_mask.dim() == 4:
                attn_mask = attn_mask.expand(query.shape[0], self.num_heads, -1, key.shape[1]).flatten(0, 1)
            return mha(query, key, value, attn_mask=attn_mask, average_attn_weights=False)
    """,
    patch(MHA, "dropout", "o, w = F.scaled_dot_product_attention(q, k, v, attn_mask=mask), w"),
    "sdpa = torch.nn.functional.scaled_dot_product_attention\n" + patch(
        MHA, "dropout", "o = sdpa(q, k, v, attn_mask=mask)"),
], ids=["nn.MultiheadAttention", "F.scaled_dot_product_attention", "aliased-sdpa"])
def test_pytorch_ready_made_attention_scores_zero_with_a_note(src):
    result = grade(namespace(src))
    e = result["MultiHeadAttention"]
    assert e["score"] == 0
    assert e["notes"] and all("ready-made attention" in n for n in e["notes"])
    for other in ("split_heads", "merge_heads", "MultiHeadSelfAttention"):
        assert full(result[other]), other


def test_every_parameter_gets_its_own_weights():
    ref = load_reference(CH)
    for ex in ("MultiHeadAttention", "MultiHeadSelfAttention"):
        for c in build_cases(CH, ex, ref, seed=GRADER.seed):
            if c.state is None or ch03.is_dropout_probe(c):
                continue
            values = [v.flatten() for v in c.state.values()]
            for i in range(len(values)):
                for j in range(i + 1, len(values)):
                    a, b = values[i], values[j]
                    assert a.shape != b.shape or not torch.allclose(a, b), (ex, c.case)


# ----------------------------------------------------------------------------- training-mode dropout
def _probe():
    ref = load_reference(CH)
    c = ch03._dropout_probe(generator(GRADER.seed, CH, "probe"), ref["MultiHeadAttention"], train=True)
    return dataclasses.replace(c, chapter=CH, exercise="MultiHeadAttention", target="MultiHeadAttention")


def _dropout_variant(line: str) -> dict:
    return namespace(patch(MHA, "dropout", line))


DROPOUT_OK = {
    "reference": None,
    "template-nn-Dropout": "",
    "own-bernoulli-mask": """
        keep = torch.rand(w.shape, dtype=w.dtype, device=w.device) >= self.drop.p if self.training else None
        o = torch.einsum("bhqk,bhkd->bhqd", w * keep / (1 - self.drop.p) if self.training else w, v)""",
    "dropout-on-transposed-weights": """
        o = torch.einsum("bhkq,bhkd->bhqd", self.drop(w.transpose(-1, -2)), v)""",
}
DROPOUT_BAD = {
    "never-in-training": ('o = torch.einsum("bhqk,bhkd->bhqd", w, v)', "no attention weight was dropped"),
    "no-rescaling": ('o = torch.einsum("bhqk,bhkd->bhqd", self.drop(w) * (1 - self.drop.p), v)',
                     "scaled by 1/(1-p)"),
    "on-heads-output": ('o = self.drop(torch.einsum("bhqk,bhkd->bhqd", w, v))', "not multiplied by"),
    "returns-dropped-weights": ('w = self.drop(w); o = torch.einsum("bhqk,bhkd->bhqd", w, v)',
                                "before dropout"),
    "before-softmax": ('o = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(self.drop(s), -1), v)',
                       "scaled by 1/(1-p)"),
}


@pytest.mark.parametrize("name", list(DROPOUT_OK), ids=list(DROPOUT_OK))
def test_training_mode_dropout_properties_accept_any_random_stream(name):
    c = _probe()
    ref = load_reference(CH)
    expected = execute(ref, c)
    ns = ref if DROPOUT_OK[name] is None else (
        namespace(MHA) if not DROPOUT_OK[name] else _dropout_variant(DROPOUT_OK[name]))
    for seed in (0, 1, 2):  # other streams than the reference's draw
        assert ch03.compare(c, execute(ns, dataclasses.replace(c, seed=seed)), expected) is None, seed


@pytest.mark.parametrize("name", list(DROPOUT_BAD), ids=list(DROPOUT_BAD))
def test_training_mode_dropout_properties_reject_wrong_dropout(name):
    line, words = DROPOUT_BAD[name]
    c = _probe()
    expected = execute(load_reference(CH), c)
    m = ch03.compare(c, execute(_dropout_variant(line), c), expected)
    assert m is not None and words in m.message, (m and m.message)


def test_chapter_compare_is_the_ordinary_comparison_elsewhere():
    ref = load_reference(CH)
    c = build_cases(CH, "MultiHeadAttention", ref, seed=GRADER.seed)[0]
    expected = execute(ref, c)
    assert ch03.compare(c, execute(ref, c), expected) is None
    bad = namespace(patch(MHA, "scale", 's = torch.einsum("bhqd,bhkd->bhqk", q, k)'))
    assert ch03.compare(c, execute(bad, c), expected).aspect == "values"


def test_dropout_cases_in_eval_mode_and_with_p_zero_are_graded_by_value():
    ref = load_reference(CH)
    names = [c.case for c in build_cases(CH, "MultiHeadAttention", ref, seed=GRADER.seed)]
    assert any("eval mode" in n for n in names) and any("dropout=0.0 in training mode" in n for n in names)


def test_training_mode_dropout_is_graded_by_its_properties():
    """The grader routes comparisons through this chapter's `compare`: the training-mode probe
    passes the reference and an own-RNG dropout, and a module that never drops loses that case only."""
    names = [c.case for c in build_cases(CH, "MultiHeadAttention", load_reference(CH), seed=GRADER.seed)]
    assert any("training mode: weights dropped" in n for n in names)

    assert full(grade(namespace())["MultiHeadAttention"])
    own_rng = _dropout_variant(DROPOUT_OK["own-bernoulli-mask"])
    assert full(grade(own_rng)["MultiHeadAttention"])
    never = grade(_dropout_variant(DROPOUT_BAD["never-in-training"][0]))["MultiHeadAttention"]
    assert [c.case for t in never["tests"] for c in t.cases if not c.passed] == [
        n for n in names if "training mode: weights dropped" in n]

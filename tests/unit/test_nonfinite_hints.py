"""NaN never matches (issue: hints that name the mistake): a NaN on either side is no evidence
for a mistake model, NaN weights are never "right", and a NaN or inf the reference does not have
gets its own diagnosis, by where it is, before any value hint."""
from __future__ import annotations

import torch

from grading_helpers import grade_in, namespace_of

from autograder.cases import KEPT_KEYS_NAN, FULLY_MASKED_NAN, OVERFLOW_NAN, matches

CH2, CH3, CH7 = "02_scaled_dot_product_attention", "03_multi_head_attention", "07_efficient_attention"


def _cpu_hints(e) -> list[tuple[str, str | None]]:
    return [(c.case, c.hint) for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed]


def test_nan_matches_nothing_not_even_nan():
    nan = torch.tensor([float("nan"), 1.0])
    assert not matches(nan, nan.clone())
    assert not matches(nan, torch.tensor([0.0, 1.0])) and not matches(torch.tensor([0.0, 1.0]), nan)
    inf = torch.tensor([float("-inf"), 1.0])
    assert matches(inf, inf.clone())  # an inf is a value: -inf where -inf is expected matches


# A plain softmax: a float mask's fully -inf row gives NaN weights and a NaN output. Before, NaN
# counted as 0 next to the reference's zero weights, so the report said "the weights are right
# but the output is not: multiply the weights by v".
PLAIN_SOFTMAX = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    w = torch.softmax(s, dim=-1)
    return w @ v, w
'''


def test_nan_weights_are_never_called_right_and_a_fully_masked_row_is_named():
    e = grade_in(CH2, namespace_of(CH2, PLAIN_SOFTMAX))["scaled_dot_product_attention"]
    failed = _cpu_hints(e)
    assert failed and all(h for _, h in failed), failed
    assert not any("weights are right" in h for _, h in failed), failed
    assert all("fully masked" in h or "all masked" in h for _, h in failed), failed


# (mask == 0) * -inf added to the scores: 0 * -inf = NaN wherever the mask keeps a key.
TIMES_INF = '''
class MultiHeadSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.h, self.d = num_heads, embed_dim // num_heads
        self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x, mask=None):
        B, N, E = x.shape
        q, k, v = self.qkv_proj(x).reshape(B, N, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:
            s = s + (mask == 0) * float("-inf") if mask.dtype == torch.bool else s + mask
        dead = torch.isneginf(s).all(-1, keepdim=True)
        w = torch.softmax(s.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, N, E)), w
'''


def test_zero_times_inf_is_told_as_such():
    e = grade_in(CH3, namespace_of(CH3, TIMES_INF))["MultiHeadSelfAttention"]
    failed = _cpu_hints(e)
    boolean = [(case, h) for case, h in failed if "float" not in case]
    assert boolean and all(h == KEPT_KEYS_NAN for _, h in boolean), failed


# An online softmax that forgets fully masked queries: 0/0 there (output NaN, lse NaN).
ONLINE_NO_ZERO = '''
def online_softmax_attention(q, k, v, mask=None, block_size=64):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    l = torch.zeros(q.shape[:-1], dtype=q.dtype)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for j in range(0, k.shape[-2], block_size):
        s = q @ k[..., j:j + block_size, :].transpose(-2, -1) * scale
        if mask is not None:
            mb = mask[..., j:j + block_size]
            s = s.masked_fill(~mb, float("-inf")) if mb.dtype == torch.bool else s + mb
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
        p = torch.exp(s - safe[..., None])
        a = torch.exp(m - safe)
        l = a * l + p.sum(-1)
        acc = a[..., None] * acc + p @ v[..., j:j + block_size, :]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
'''


def test_an_online_softmax_that_divides_by_zero_on_a_fully_masked_query_is_told_so():
    e = grade_in(CH7, namespace_of(CH7, ONLINE_NO_ZERO))["online_softmax_attention"]
    failed = _cpu_hints(e)
    assert failed and all(h and "fully masked query" in h for _, h in failed), failed


def test_the_generic_diagnoses_are_distinct():
    assert len({KEPT_KEYS_NAN, FULLY_MASKED_NAN, OVERFLOW_NAN}) == 3


def test_nan_in_lse_on_queries_that_have_keys_is_not_blamed_on_fully_masked_ones():
    """lse holds one value per query: its NaN is placed against the mask's queries as it is
    (not reduced over its last axis), so NaN on every query is not "a fully masked query"."""
    from autograder.cases import chapter_module, nonfinite_hint
    from autograder.shared.calls import Call, Outcome
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False
    c = Call(CH7, "online_softmax_attention", "c", "online_softmax_attention",
             args=[torch.zeros(2, 4, 3), torch.zeros(2, 6, 3), torch.zeros(2, 6, 2)], kwargs={"mask": mask})
    lse = torch.zeros(2, 4)
    lse[:, 1] = float("-inf")
    spec = chapter_module(CH7).HINTS["online_softmax_attention"]
    expected = Outcome(outputs=[torch.zeros(2, 4, 2), lse])
    everywhere = Outcome(outputs=[torch.zeros(2, 4, 2), torch.full((2, 4), float("nan"))])
    only_dead = Outcome(outputs=[torch.zeros(2, 4, 2), torch.where(lse.isinf(), float("nan"), lse)])
    spec = type(spec)(fully_masked=spec.fully_masked)  # the diagnosis by where only, without the models
    assert nonfinite_hint(spec, c, everywhere, expected, 1).startswith(spec.fully_masked + "; or")
    some = torch.zeros(2, 4)
    some[0, 2] = float("nan")
    some[:, 1] = float("-inf")
    assert nonfinite_hint(spec, c, Outcome(outputs=[torch.zeros(2, 4, 2), some]), expected, 1) == \
        KEPT_KEYS_NAN
    assert nonfinite_hint(spec, c, only_dead, expected, 1) == spec.fully_masked

"""Chapter 7 grading (online softmax, repeat_kv, grouped-query attention with a KV cache, sliding
windows, ALiBi): realistic mistakes lose credit on the exercise they touch only, and the hint
names the mistake (accumulator not rescaled, max not added back to lse, heads tiled instead of
grouped, cache appended in the wrong order, window off by one, slopes starting at 1, a bias that
is not causal); a version that builds the whole score matrix loses the memory cases and is told
why; equivalent formulations score full marks. What every chapter shares is in
test_grading_common.py."""
import functools

import pytest

from autograder.runtime.execute import execute
from autograder.references.cache import REFERENCES
from autograder.references.solutions import load_reference

from grading_helpers import GRADER, check_buggy, check_equivalent, failures, grade_in, namespace_of

CH = "07_efficient_attention"
namespace = functools.partial(namespace_of, CH)
grade = functools.partial(grade_in, CH)


def _online(rescale_acc="alpha.unsqueeze(-1) * acc", rescale_l="alpha * l",
            lse="torch.where(seen, m, 0.0) + torch.log(l_safe)", scale="1.0 / math.sqrt(q.size(-1))",
            safe="torch.where(torch.isneginf(m_new), 0.0, m_new)", stop="min(start + block_size, L_k)",
            guard="torch.where(seen, l, 1.0)") -> str:
    """The reference's online softmax, with one piece of it replaced."""
    return f'''
def online_softmax_attention(q, k, v, mask=None, block_size=64):
    scale = {scale}
    L_q, L_k = q.size(-2), k.size(-2)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                   mask.shape[:-2] if mask is not None else ())
    m = torch.full((*batch, L_q), float("-inf"), dtype=q.dtype, device=q.device)
    l = torch.zeros((*batch, L_q), dtype=q.dtype, device=q.device)
    acc = torch.zeros((*batch, L_q, v.size(-1)), dtype=q.dtype, device=q.device)
    for start in range(0, L_k, block_size):
        stop = {stop}
        s = q @ k[..., start:stop, :].transpose(-2, -1) * scale
        if mask is not None:
            mb = mask if mask.size(-1) == 1 else mask[..., start:stop]
            s = torch.where(mb, s, float("-inf")) if mb.dtype == torch.bool else s + mb.to(s.dtype)
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_safe = {safe}
        p = torch.exp(s - m_safe.unsqueeze(-1))
        alpha = torch.exp(m - m_safe)
        l = {rescale_l} + p.sum(dim=-1)
        acc = {rescale_acc} + p @ v[..., start:stop, :]
        m = m_new
    seen = l > 0
    l_safe = {guard}
    output = acc / l_safe.unsqueeze(-1)
    lse = torch.where(seen, {lse}, float("-inf"))
    return output, lse
'''


FULL_MATRIX = '''
def online_softmax_attention(q, k, v, mask=None, block_size=64):
    out, _ = attention(q, k, v, mask)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = torch.where(mask, s, float("-inf")) if mask.dtype == torch.bool else s + mask
    dead = torch.isneginf(s).all(-1)  # (no NaN gradient through a fully masked row's logsumexp)
    lse = torch.logsumexp(torch.where(dead[..., None], 0.0, s), dim=-1)
    return out, torch.where(dead, float("-inf"), lse)
'''


def _gqa(kv_line="k = torch.cat([past_kv[0], k], dim=2)\n            v = torch.cat([past_kv[1], v], dim=2)",
         rep="repeat_kv(k, n_rep), repeat_kv(v, n_rep)", ret="self.out_proj(out), weights, (k, v)",
         check="if embed_dim % num_heads != 0 or num_heads % num_kv_heads != 0:\n            raise ValueError('sizes')",
         kv_out="num_kv_heads * self.head_dim", merge="out.transpose(1, 2).reshape(B, L, E)") -> str:
    return f'''
class GroupedQueryAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=False):
        super().__init__()
        {check}
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, {kv_out}, bias=bias)
        self.v_proj = nn.Linear(embed_dim, {kv_out}, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x, mask=None, past_kv=None):
        B, L, E = x.shape
        H, H_kv, d_h = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, L, H, d_h).transpose(1, 2)
        k = self.k_proj(x).view(B, L, H_kv, d_h).transpose(1, 2)
        v = self.v_proj(x).view(B, L, H_kv, d_h).transpose(1, 2)
        if past_kv is not None:
            {kv_line}
        n_rep = H // H_kv
        out, weights = attention(q, {rep}, mask)
        out = {merge}
        return {ret}
'''


# (id, exercise, source, words the hint of the first CPU failure must contain, or None)
BUGGY = [
    ("accumulator-not-rescaled", "online_softmax_attention", _online(rescale_acc="acc"), "accumulator"),
    ("sum-not-rescaled", "online_softmax_attention", _online(rescale_l="l"), "sum of exponentials is not rescaled"),
    ("max-not-added-back-to-lse", "online_softmax_attention",
     _online(lse="torch.log(l_safe)"), "lse misses the maximum"),
    ("unscaled-scores", "online_softmax_attention", _online(scale="1.0"), "unscaled"),
    ("no-guard-for-minus-inf-max", "online_softmax_attention", _online(safe="m_new"), "finite stand-in"),
    ("fully-masked-query-divides-by-zero", "online_softmax_attention", _online(guard="l"), "zero output"),
    ("last-block-dropped", "online_softmax_attention",
     _online(stop="start + block_size if start + block_size <= L_k else start"), None),  # (it raises: amax of an empty block)
    ("whole-score-matrix", "online_softmax_attention", FULL_MATRIX, "never q @ k^T for all keys"),
    ("repeat-tiled", "repeat_kv", "def repeat_kv(x, n_rep):\n    return x.repeat(*([1] * (x.dim() - 3)), n_rep, 1, 1)\n",
     "tiled"),
    ("repeat-along-the-wrong-axis", "repeat_kv",
     "def repeat_kv(x, n_rep):\n    return torch.repeat_interleave(x, n_rep, dim=-2)\n", "head axis"),
    ("gqa-heads-tiled", "GroupedQueryAttention",
     _gqa(rep="k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)"), "tiled instead of grouped"),
    ("gqa-cache-appended-first", "GroupedQueryAttention",
     _gqa(kv_line="k = torch.cat([k, past_kv[0]], dim=2)\n            v = torch.cat([v, past_kv[1]], dim=2)"),
     "wrong order"),
    ("gqa-cache-ignored", "GroupedQueryAttention", _gqa(kv_line="pass"), None),
    ("gqa-cache-returned-repeated", "GroupedQueryAttention",
     _gqa(ret="self.out_proj(out), weights, (repeat_kv(k, n_rep), repeat_kv(v, n_rep))"), "num_kv_heads heads"),
    ("gqa-no-valueerror", "GroupedQueryAttention", _gqa(check="pass"), None),
    ("gqa-heads-merged-without-transpose", "GroupedQueryAttention", _gqa(merge="out.reshape(B, L, E)"),
     "weights are right"),
    ("window-off-by-one", "sliding_window_mask", '''
def sliding_window_mask(seq_len, window, device=None):
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    return (i - j >= 0) & (i - j <= window)
''', "off by one"),
    ("window-not-causal", "sliding_window_mask", '''
def sliding_window_mask(seq_len, window, device=None):
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    return (i - j).abs() < window
''', "not causal"),
    ("window-on-a-fixed-device", "sliding_window_mask", '''
def sliding_window_mask(seq_len, window, device=None):
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    return (i - j >= 0) & (i - j < window)
''', None),
    ("alibi-slopes-start-at-1", "alibi_bias", '''
def alibi_bias(num_heads, seq_len, device=None):
    if num_heads & (num_heads - 1):
        raise ValueError("power of two")
    slopes = 2.0 ** (-8.0 * torch.arange(num_heads, device=device) / num_heads)
    pos = torch.arange(seq_len, device=device)
    d = (pos[:, None] - pos[None, :]).to(torch.get_default_dtype())
    return (-slopes[:, None, None] * d).masked_fill(d < 0, float("-inf"))
''', "slopes start at 1"),
    ("alibi-not-causal", "alibi_bias", '''
def alibi_bias(num_heads, seq_len, device=None):
    if num_heads & (num_heads - 1):
        raise ValueError("power of two")
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, device=device) / num_heads)
    pos = torch.arange(seq_len, device=device)
    d = (pos[:, None] - pos[None, :]).to(torch.get_default_dtype())
    return -slopes[:, None, None] * d.abs()
''', "not causal"),
    ("alibi-no-valueerror", "alibi_bias", '''
def alibi_bias(num_heads, seq_len, device=None):
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, device=device) / num_heads)
    pos = torch.arange(seq_len, device=device)
    d = (pos[:, None] - pos[None, :]).to(torch.get_default_dtype())
    return (-slopes[:, None, None] * d).masked_fill(d < 0, float("-inf"))
''', None),
    ("alibi-positive-bias", "alibi_bias", '''
def alibi_bias(num_heads, seq_len, device=None):
    if num_heads & (num_heads - 1):
        raise ValueError("power of two")
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, device=device) / num_heads)
    pos = torch.arange(seq_len, device=device)
    d = (pos[:, None] - pos[None, :]).to(torch.get_default_dtype())
    return (slopes[:, None, None] * d).masked_fill(d < 0, float("-inf"))
''', "wrong sign"),
]


@pytest.mark.parametrize("name, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_implementation_loses_credit_on_its_exercise_only(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)


def test_the_whole_score_matrix_fails_only_the_memory_cases_and_says_why():
    e = grade(namespace(FULL_MATRIX))["online_softmax_attention"]
    failed = [c for c in failures(e) if c[1] == "cpu"]
    assert failed and all(c[0].startswith("memory:") for c in failed), failed
    assert all("score matrix" in c[2] for c in failed), failed


def test_the_memory_case_runs_on_the_cpu_only():
    """The meta device holds no memory to cap: running the 2^26-score case there checked
    nothing the small cases do not, and cost a third of a second of meta kernels a student.
    Nor does CUDA run it: its child is capped with no GPU visible, and on a real GPU (H100,
    stop 37) the reference's CUDA memory case failed there ("Error 2: out of memory" from
    cudaGetDeviceCount), 158.89/159."""
    from autograder.grading.variants import variants
    cases = REFERENCES.cases(CH, "online_softmax_attention", GRADER.seed, False)
    capped = {i for i, c in enumerate(cases) if c.capped_memory}
    assert capped
    assert capped <= {i for i, _ in variants(cases, "cpu")}
    meta = {i for i, _ in variants(cases, "fake-cuda")}
    assert not capped & meta and meta  # the other cases keep their meta run
    cuda = {i for i, _ in variants(cases, "cuda")}
    assert not capped & cuda and cuda


def test_the_reference_stays_within_the_memory_limit_that_a_full_matrix_exceeds():
    from autograder.cases.ch07_efficient_attention import memory_limit
    ref = load_reference(CH)
    full = namespace(FULL_MATRIX)
    import dataclasses
    memory = [dataclasses.replace(c, measure_memory=True)
              for c in REFERENCES.cases(CH, "online_softmax_attention", GRADER.seed, False) if c.capped_memory]
    memory += [c for c in REFERENCES.cases(CH, "online_softmax_attention", GRADER.seed, True) if c.measure_memory]
    assert len(memory) >= 2
    for c in memory:
        mine, theirs = execute(ref, c), execute(full, c)
        limit = memory_limit(c, mine)
        assert 0 < mine.largest_tensor[0] <= limit < theirs.largest_tensor[0], (c.case, mine.largest_tensor, limit)


def test_pytorch_ready_made_attention_scores_zero():
    src = ("def online_softmax_attention(q, k, v, mask=None, block_size=64):\n"
           "    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"
           "    return out, torch.logsumexp(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -1)\n")
    e = grade(namespace(src))["online_softmax_attention"]
    assert e["score"] == 0 and e["notes"] and "ready-made attention" in e["notes"][0]


CORRECT = [
    ("online-with-logaddexp-and-lists", '''
def online_softmax_attention(q, k, v, mask=None, block_size=64):
    d = q.shape[-1]
    outs_m, outs_l, acc = None, None, None
    for kb, vb, start in zip(k.split(block_size, -2), v.split(block_size, -2), range(0, k.shape[-2], block_size)):
        s = torch.einsum("...qd,...kd->...qk", q, kb) / d ** 0.5
        if mask is not None:
            mb = mask[..., start:start + kb.shape[-2]] if mask.shape[-1] > 1 else mask
            s = s.masked_fill(~mb, -torch.inf) if mb.dtype == torch.bool else s + mb
        bm = s.amax(-1, keepdim=True)
        m_new = bm if outs_m is None else torch.maximum(outs_m, bm)
        shift = torch.nan_to_num(m_new, neginf=0.0)
        p = (s - shift).exp()
        if outs_m is None:
            outs_l, acc = p.sum(-1, keepdim=True), p @ vb
        else:
            a = (outs_m - shift).exp()
            outs_l, acc = a * outs_l + p.sum(-1, keepdim=True), a * acc + p @ vb
        outs_m = m_new
    out = torch.where(outs_l > 0, acc / outs_l.clamp_min(torch.finfo(acc.dtype).tiny), 0.0)
    lse = torch.where(outs_l > 0, torch.nan_to_num(outs_m, neginf=0.0) + outs_l.clamp_min(torch.finfo(acc.dtype).tiny).log(),
                      -torch.inf)
    return out, lse.squeeze(-1)
'''),
    ("repeat-by-expand-and-reshape", '''
def repeat_kv(x, n_rep):
    *lead, h, L, d = x.shape
    return x.unsqueeze(-3).expand(*lead, h, n_rep, L, d).reshape(*lead, h * n_rep, L, d)
'''),
    ("gqa-grouped-einsum-without-repeat", '''
class GroupedQueryAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=False):
        super().__init__()
        if embed_dim % num_heads or num_heads % num_kv_heads:
            raise ValueError("sizes")
        self.h, self.g = num_heads, num_kv_heads
        self.d = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * self.d, bias=bias)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * self.d, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x, mask=None, past_kv=None):
        B, L, E = x.shape
        r = self.h // self.g
        q = self.q_proj(x).view(B, L, self.g, r, self.d).permute(0, 2, 3, 1, 4)   # (B, G, r, L, d)
        k = self.k_proj(x).view(B, L, self.g, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.g, self.d).transpose(1, 2)
        if past_kv is not None:
            k, v = torch.cat((past_kv[0], k), -2), torch.cat((past_kv[1], v), -2)
        s = torch.einsum("bgrld,bgmd->bgrlm", q, k) / math.sqrt(self.d)
        s = s.reshape(B, self.h, L, k.shape[-2])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        dead = torch.isneginf(s).all(-1, keepdim=True)
        w = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
        o = torch.einsum("bgrlm,bgmd->bgrld", w.view(B, self.g, r, L, -1), v)
        return self.out_proj(o.reshape(B, self.h, L, self.d).transpose(1, 2).reshape(B, L, E)), w, (k, v)
'''),
    ("window-from-tril-and-triu", '''
def sliding_window_mask(seq_len, window, device=None):
    ones = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    return ones.tril() & ones.triu(-(window - 1))
'''),
    ("alibi-with-log2-check-and-where", '''
def alibi_bias(num_heads, seq_len, device=None):
    if num_heads <= 0 or not math.log2(num_heads).is_integer():
        raise ValueError("num_heads must be a power of two")
    start = 2 ** (-8 / num_heads)
    slopes = torch.tensor([start ** (h + 1) for h in range(num_heads)], device=device,
                          dtype=torch.get_default_dtype())
    i = torch.arange(seq_len, device=device).view(-1, 1)
    j = torch.arange(seq_len, device=device).view(1, -1)
    dist = (j - i).to(slopes.dtype)
    return torch.where(j <= i, slopes.view(-1, 1, 1) * dist, torch.tensor(float("-inf"), device=device,
                                                                        dtype=slopes.dtype))
'''),
]


@pytest.mark.parametrize("name, src", CORRECT, ids=[c[0] for c in CORRECT])
def test_equivalent_implementations_score_full_marks(name, src):
    check_equivalent(CH, src)


def test_lse_is_called_lse_in_the_report():
    """The second returned tensor of online_softmax_attention is the contract's `lse`, not "the
    weights"."""
    src = FULL_MATRIX.replace("return out, torch.where(dead, float(\"-inf\"), lse)",
                              "return out, torch.where(dead, float(\"-inf\"), lse) + 1.0")
    assert src != FULL_MATRIX
    e = grade(namespace(src))["online_softmax_attention"]
    messages = [c.message for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed]
    assert messages and any(m.startswith("lse differs") for m in messages), messages
    assert not any("weights" in m for m in messages), messages


# ----------------------------------------------------------------------------- held-out ports (issue 22)
# Mistakes as public code makes them: each must get its own hint, in the grader and the self-check.
PORTED_MISTAKES = [
    ("blocks-by-floor", "online_softmax_attention", '''
def online_softmax_attention(q, k, v, mask=None, block_size=64):
    n_blocks = k.shape[-2] // block_size          # floor: a partial last block is never read
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    l = torch.zeros(q.shape[:-1], dtype=q.dtype)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for b in range(n_blocks):
        sl = slice(b * block_size, (b + 1) * block_size)
        s = q @ k[..., sl, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            mb = mask[..., sl]
            s = s.masked_fill(~mb, float("-inf")) if mb.dtype == torch.bool else s + mb
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
        p = torch.exp(s - safe[..., None])
        a = torch.exp(m - safe)
        l, acc, m = a * l + p.sum(-1), a[..., None] * acc + p @ v[..., sl, :], m_new
    seen = l > 0
    out = acc / torch.where(seen, l, 1.0)[..., None]
    return out, torch.where(seen, torch.where(seen, m, 0.0) + torch.log(torch.where(seen, l, 1.0)), float("-inf"))
''', "ceil(L_k / block_size)"),
    ("lse-in-base-2", "online_softmax_attention",
     _online(lse="(torch.where(seen, m, 0.0) + torch.log(l_safe)) / math.log(2)"), "base 2"),
    ("gqa-finite-fill", "GroupedQueryAttention", '''
class GroupedQueryAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=False):
        super().__init__()
        if embed_dim % num_heads or num_heads % num_kv_heads:
            raise ValueError("sizes")
        self.h, self.h_kv, self.d = num_heads, num_kv_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * self.d, bias=bias)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * self.d, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x, mask=None, past_kv=None):
        B, L, E = x.shape
        q = self.q_proj(x).view(B, L, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.h_kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.h_kv, self.d).transpose(1, 2)
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        n = self.h // self.h_kv
        s = q @ repeat_kv(k, n).transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:   # as Llama-style code does: a large finite fill, no -inf
            s = s.masked_fill(~mask, torch.finfo(s.dtype).min) if mask.dtype == torch.bool \\
                else s + mask.clamp(min=torch.finfo(s.dtype).min)
        w = torch.softmax(s, dim=-1)
        out = (w @ repeat_kv(v, n)).transpose(1, 2).reshape(B, L, E)
        return self.out_proj(out), w, (k, v)
''', "large finite number"),
    ("repeat-kv-4d-only", "repeat_kv", '''
def repeat_kv(x, n_rep):
    b, h_kv, L, d = x.shape                      # HF's repeat_kv: (batch, heads, seq, dim) only
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h_kv, n_rep, L, d).reshape(b, h_kv * n_rep, L, d)
''', "any number of leading axes"),
    ("alibi-reference-code-slopes", "alibi_bias", '''
def alibi_bias(num_heads, seq_len, device=None):
    def get_slopes(n):                            # the ALiBi repository's get_slopes
        def power_of_2(n):
            start = 2 ** (-2 ** -(math.log2(n) - 3))
            return [start * start ** i for i in range(n)]
        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + get_slopes(2 * closest)[0::2][: n - closest]
    slopes = torch.tensor(get_slopes(num_heads), device=device, dtype=torch.get_default_dtype())
    pos = torch.arange(seq_len, device=device)
    d = (pos[:, None] - pos[None, :]).to(torch.get_default_dtype())
    return (-slopes[:, None, None] * d).masked_fill(d < 0, float("-inf"))
''', "power of two"),
    ("alibi-by-key-position", "alibi_bias", '''
def alibi_bias(num_heads, seq_len, device=None):
    if num_heads & (num_heads - 1):
        raise ValueError("power of two")
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, device=device) / num_heads)
    j = torch.arange(seq_len, device=device).to(torch.get_default_dtype())
    bias = slopes[:, None, None] * j[None, None, :]        # BLOOM: m_h * key position
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    return bias.expand(num_heads, seq_len, seq_len).masked_fill(~causal, float("-inf"))
''', "key position"),
]


@pytest.mark.parametrize("name, exercise, src, words", PORTED_MISTAKES, ids=[b[0] for b in PORTED_MISTAKES])
def test_a_ported_mistake_is_named_by_its_hint(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)

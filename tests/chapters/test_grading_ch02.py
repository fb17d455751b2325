"""Chapter 2 grading (scaled dot-product attention, SelfAttention): realistic mistakes lose credit
on the exercise they touch only and the hint names the mistake (unscaled scores, softmax over the
wrong axis, inverted mask, -1e9 instead of zeroed fully masked rows, ...); equivalent
formulations score full marks; PyTorch's ready-made attention scores zero.
What every chapter shares is in test_grading.py."""
import functools

import pytest
import torch

from autograder.references.cache import REFERENCES

from grading_helpers import GRADER, check_buggy, check_equivalent, failures, grade_in, namespace_of

CH = "02_scaled_dot_product_attention"
namespace = functools.partial(namespace_of, CH)  # the reference with `src` run on top
grade = functools.partial(grade_in, CH)


# The reference's way of handling fully masked rows, for variants that change something else.
_FULL_ROWS = """
    fully = torch.isneginf(scores).all(dim=-1, keepdim=True)
    w = torch.softmax(scores.masked_fill(fully, 0.0), dim=-1).masked_fill(fully, 0.0)
"""


def _sdpa(scores_line: str, mask_block: str | None = None, rows: str = _FULL_ROWS,
          out: str = "w @ v, w") -> str:
    mask_block = mask_block or """
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
"""
    body = f"    scores = {scores_line}\n" + mask_block.strip("\n") + "\n" + rows.strip("\n") + f"\n    return {out}\n"
    return "def scaled_dot_product_attention(q, k, v, mask=None):\n" + body


def _self_attention(names=("W_q", "W_k", "W_v"), bias=False, call=None) -> str:
    q, k, v = names
    call = call or f"scaled_dot_product_attention(self.{q}(x), self.{k}(x), self.{v}(x), mask)"
    layers = "".join(f"        self.{n} = nn.Linear(d_model, d_k, bias={bias})\n" for n in names)
    return ("class SelfAttention(nn.Module):\n    def __init__(self, d_model, d_k):\n"
            f"        super().__init__()\n{layers}\n    def forward(self, x, mask=None):\n        return {call}\n")


# (id, exercise, source, words the hint of the first CPU failure must contain, or None)
BUGGY = [
    ("unscaled", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1)"), "scores look unscaled"),
    ("divided-by-d_k", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / q.size(-1)"), "divided by d_k"),
    ("scaled-by-sqrt-d_v", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(v.size(-1))"), None),
    ("softmax-over-queries", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))",
           rows="""
    fully = torch.isneginf(scores).all(dim=-1, keepdim=True)
    w = torch.softmax(scores.masked_fill(fully, 0.0), dim=-2).masked_fill(fully, 0.0)
"""), "wrong axis"),
    ("inverted-mask", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", mask_block="""
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
"""), "inverted"),
    ("minus-1e9-fill", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", mask_block="""
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9) if mask.dtype == torch.bool else scores + mask
""", rows="    w = torch.softmax(scores, dim=-1)"), "-1e9"),
    ("nan-on-fully-masked-rows", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", rows="    w = torch.softmax(scores, dim=-1)"),
     "NaN"),
    ("nan-to-num-after-softmax", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))",
           rows="    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)"),
     "nan_to_num after the softmax leaves NaN in the backward pass"),
    ("transpose-last-two-of-3d-only", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(1, 2) / math.sqrt(q.size(-1))"), None),
    ("float-mask-ignored", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", mask_block="""
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
"""), None),
    ("float-mask-treated-as-bool", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", mask_block="""
    if mask is not None:
        scores = scores.masked_fill(~mask.bool(), float("-inf"))
"""), None),
    ("output-not-the-weighted-sum", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", out="w @ v / w.size(-1), w"),
     "weights are right but the output is not"),
    ("outputs-swapped", "scaled_dot_product_attention",
     _sdpa("q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", out="w, w @ v"), None),
    ("mask-modified-in-place", "scaled_dot_product_attention", """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            mask.clamp_(min=-1e4)     # edits the caller's mask (and -inf no longer removes a key)
            scores = scores + mask
    fully = torch.isneginf(scores).all(dim=-1, keepdim=True)
    w = torch.softmax(scores.masked_fill(fully, 0.0), dim=-1).masked_fill(fully, 0.0)
    return w @ v, w
""", None),
    ("gradient-cut-by-detach", "scaled_dot_product_attention",
     _sdpa("q @ k.detach().transpose(-2, -1) / math.sqrt(q.size(-1))"), None),
    ("always-float32", "scaled_dot_product_attention",
     _sdpa("(q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))",
           out="(w @ v.float()), w"), None),
    ("self-attention-keys-from-W_q", "SelfAttention",
     _self_attention(call="scaled_dot_product_attention(self.W_q(x), self.W_q(x), self.W_v(x), mask)"), None),
    ("self-attention-with-bias", "SelfAttention", _self_attention(bias=True), None),
    ("self-attention-mask-dropped", "SelfAttention",
     _self_attention(call="scaled_dot_product_attention(self.W_q(x), self.W_k(x), self.W_v(x))"), None),
    ("self-attention-other-parameter-names", "SelfAttention", _self_attention(names=("query", "key", "value")), None),
]


@pytest.mark.parametrize("name, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_implementation_loses_credit_on_its_exercise_only(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)


def test_a_fully_masked_row_filled_with_minus_1e9_fails_only_the_cases_with_such_rows():
    src = next(b[2] for b in BUGGY if b[0] == "minus-1e9-fill")
    e = grade(namespace(src))["scaled_dot_product_attention"]
    failed = {c[0] for c in failures(e) if c[1] == "cpu"}
    with_full_rows = set()
    for c in REFERENCES.cases(CH, "scaled_dot_product_attention", GRADER.seed, False):
        mask = c.kwargs.get("mask")
        dead = None if mask is None else ~mask if mask.dtype == torch.bool else torch.isneginf(mask)
        if dead is not None and dead.all(-1).any():
            with_full_rows.add(c.case)
    assert failed and failed <= with_full_rows, failed - with_full_rows


def test_self_attention_over_a_wrong_function_points_to_that_function():
    """The notebook's SelfAttention calls its own scaled_dot_product_attention, as the exercise
    asks; when that is wrong, SelfAttention's failure names it rather than saying nothing."""
    self_attention = next(c[1] for c in CORRECT if c[0] == "self-attention-fused-projection-split-in-forward")
    result = grade(namespace(next(b[2] for b in BUGGY if b[0] == "unscaled") + self_attention))
    assert "unscaled" in result["scaled_dot_product_attention"]["first"].hint
    first = result["SelfAttention"]["first"]
    assert first is not None and "`scaled_dot_product_attention` fails its own tests" in first.hint


def test_a_parameter_misnamed_is_reported_by_name():
    src = next(b[2] for b in BUGGY if b[0] == "self-attention-other-parameter-names")
    first = grade(namespace(src))["SelfAttention"]["first"]
    assert first.aspect == "params" and "W_q" in first.message, (first.aspect, first.message)


@pytest.mark.parametrize("src", [
    "def scaled_dot_product_attention(q, k, v, mask=None):\n"
    "    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"
    "    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -1)\n"
    "    return out, w",
    "def scaled_dot_product_attention(q, k, v, mask=None):\n"
    "    out = torch._C._nn.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"
    "    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -1)\n"
    "    return out, w",
])
def test_pytorch_ready_made_attention_scores_zero_with_a_note(src):
    e = grade(namespace(src))["scaled_dot_product_attention"]
    assert e["score"] == 0
    assert e["notes"] and all("ready-made attention" in n for n in e["notes"])


CORRECT = [
    ("einsum-and-where", """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = torch.where(mask, scores, -torch.inf) if mask.dtype == torch.bool else scores + mask
    dead = torch.isneginf(scores).all(-1, keepdim=True)
    w = torch.where(dead, 0.0, torch.softmax(torch.where(dead, 0.0, scores), dim=-1))
    return torch.einsum("...qk,...kd->...qd", w, v), w
"""),
    ("scale-the-queries-first-and-zero-rows-by-multiplying", """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = (q / math.sqrt(q.size(-1))) @ k.mT
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        else:
            scores = scores + mask
    alive = (scores > float("-inf")).any(dim=-1, keepdim=True)
    safe = torch.where(alive, scores, torch.zeros_like(scores))
    w = torch.softmax(safe, dim=-1) * alive
    return torch.matmul(w, v), w
"""),
    ("own-stable-softmax-with-a-helper", """
def _stable_softmax(s):
    m = s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)

def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = k.size(-1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * d_k ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    w = _stable_softmax(scores)
    return w @ v, w
"""),
    ("self-attention-fused-projection-split-in-forward", """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_k, bias=False)

    def forward(self, x, mask=None):
        w = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight], dim=0)
        q, k, v = (x @ w.T).chunk(3, dim=-1)
        return scaled_dot_product_attention(q, k, v, mask=mask)
"""),
]


@pytest.mark.parametrize("name, src", CORRECT, ids=[c[0] for c in CORRECT])
def test_equivalent_implementations_score_full_marks(name, src):
    check_equivalent(CH, src)


def test_zeros_of_the_right_shape_earn_no_portability_credit():
    """The meta device checks shapes, dtypes and devices only: its share counts only for cases
    that are correct on the CPU."""
    e = grade(namespace("""
def scaled_dot_product_attention(q, k, v, mask=None):
    w = torch.zeros(*q.shape[:-1], k.shape[-2], dtype=q.dtype, device=q.device)
    return (w @ v) * q.sum() * 0 , w
"""))["scaled_dot_product_attention"]
    assert e["score"] == 0, failures(e)
    meta = next(t for t in e["tests"] if t.device == "fake-cuda")
    assert all(not c.passed and "fails on the CPU" in c.message for c in meta.cases)

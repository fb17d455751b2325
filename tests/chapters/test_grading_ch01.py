"""Chapter 1 grading: the reference scores full marks, realistic mistakes lose credit on the
exercise they touch only, hints name the mistake, equivalent formulations score full marks.
What every chapter shares (full marks for the reference, zero for the stubs, the quick cases) is in
test_grading.py."""
import functools

import pytest
import torch

from autograder.references.cache import REFERENCES

from grading_helpers import GRADER, check_buggy, check_equivalent, full, grade_in, namespace_of

CH = "01_intuition"
pytestmark = pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")  # a buggy variant's .T
namespace = functools.partial(namespace_of, CH)  # the reference with `src` run on top
grade = functools.partial(grade_in, CH)


# (id, exercise, source, words the hint of the first CPU failure must contain, or None)
BUGGY = [
    ("softmax-naive-exp", "softmax", """
        def softmax(x, dim=-1):
            e = torch.exp(x)
            return e / e.sum(dim=dim, keepdim=True)
        """, "subtract the maximum"),
    ("softmax-global-max", "softmax", """
        def softmax(x, dim=-1):
            e = torch.exp(x - x.max())
            return e / e.sum(dim=dim, keepdim=True)
        """, "not of the whole tensor"),
    ("softmax-ignores-dim", "softmax", """
        def softmax(x, dim=-1):
            e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
            return e / e.sum(dim=-1, keepdim=True)
        """, "sum to 1 along dim -1 instead of dim=1"),
    ("softmax-no-keepdim", "softmax", """
        def softmax(x, dim=-1):
            e = torch.exp(x - x.max(dim=dim).values)
            return e / e.sum(dim=dim)
        """, "keepdim=True"),
    ("softmax-not-normalised", "softmax", """
        def softmax(x, dim=-1):
            return torch.exp(x - x.max(dim=dim, keepdim=True).values)
        """, "not normalised"),
    ("softmax-neg-inf-replaced", "softmax", """
        def softmax(x, dim=-1):
            x = torch.where(torch.isinf(x), torch.zeros_like(x), x)
            e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
            return e / e.sum(dim=dim, keepdim=True)
        """, "-inf entries must get probability exactly 0"),
    ("softmax-all-neg-inf-row-nan", "softmax", """
        def softmax(x, dim=-1):   # the textbook stable softmax: NaN for an all -inf slice
            e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
            return e / e.sum(dim=dim, keepdim=True)
        """, "entirely -inf must give all zeros"),
    ("softmax-in-place-shift", "softmax", """
        def softmax(x, dim=-1):
            x -= x.max(dim=dim, keepdim=True).values
            e = torch.exp(x)
            return e / e.sum(dim=dim, keepdim=True).clamp_min(1e-300)
        """, None),
    ("softmax-float32", "softmax", """
        def softmax(x, dim=-1):
            x = x.float()
            e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
            return e / e.sum(dim=dim, keepdim=True)
        """, None),
    ("softmax-detached", "softmax", """
        def softmax(x, dim=-1):
            x = x.detach()
            s = torch.where(torch.isfinite(x), x, torch.full_like(x, -1e300)).amax(dim, keepdim=True)
            e = torch.exp(x - s)
            return e / e.sum(dim=dim, keepdim=True).clamp_min(1e-300)
        """, None),
    ("pool-scaled", "attention_pool", """
        def attention_pool(query, keys, values):
            scores = (keys @ query.unsqueeze(-1)).squeeze(-1) / math.sqrt(query.shape[-1])
            w = softmax(scores, dim=-1)
            return (w.unsqueeze(-2) @ values).squeeze(-2), w
        """, "unscaled"),
    ("pool-raw-scores-as-weights", "attention_pool", """
        def attention_pool(query, keys, values):
            w = (keys @ query.unsqueeze(-1)).squeeze(-1)
            return (w.unsqueeze(-2) @ values).squeeze(-2), w
        """, "not normalised"),
    ("pool-exp-not-divided", "attention_pool", """
        def attention_pool(query, keys, values):
            w = torch.exp((keys @ query.unsqueeze(-1)).squeeze(-1))
            return (w.unsqueeze(-2) @ values).squeeze(-2), w
        """, "not normalised"),
    ("pool-dot-T", "attention_pool", """
        def attention_pool(query, keys, values):
            w = softmax(query @ keys.T, dim=-1)
            return w @ values, w
        """, "batch dimensions"),
    ("pool-softmax-dim0", "attention_pool", """
        def attention_pool(query, keys, values):
            w = softmax((keys @ query.unsqueeze(-1)).squeeze(-1), dim=0)
            return (w.unsqueeze(-2) @ values).squeeze(-2), w
        """, "batch axis"),
    ("pool-mean-not-sum", "attention_pool", """
        def attention_pool(query, keys, values):
            w = softmax((keys @ query.unsqueeze(-1)).squeeze(-1), dim=-1)
            return (w.unsqueeze(-1) * values).mean(-2), w
        """, "weights are right but the output is not"),
    ("pool-sums-keys", "attention_pool", """
        def attention_pool(query, keys, values):
            w = softmax((keys @ query.unsqueeze(-1)).squeeze(-1), dim=-1)
            return (w.unsqueeze(-2) @ keys).squeeze(-2), w
        """, "weighted sum of the values"),
    ("pool-naive-softmax", "attention_pool", """
        def attention_pool(query, keys, values):
            e = torch.exp((keys @ query.unsqueeze(-1)).squeeze(-1))
            w = e / e.sum(-1, keepdim=True)
            return (w.unsqueeze(-2) @ values).squeeze(-2), w
        """, None),  # passes the ordinary cases; the first failure is the large-scores case
    ("pool-returns-output-only", "attention_pool", """
        def attention_pool(query, keys, values):
            w = softmax((keys @ query.unsqueeze(-1)).squeeze(-1), dim=-1)
            return (w.unsqueeze(-2) @ values).squeeze(-2)
        """, None),
]


@pytest.mark.parametrize("name, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_implementation_loses_credit_on_its_exercise_only(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)


def test_naive_softmax_in_attention_pool_fails_only_large_scores_and_is_told_why():
    src = next(b[2] for b in BUGGY if b[0] == "pool-naive-softmax")
    e = grade(namespace(src))["attention_pool"]
    failed = [c for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed]
    assert [c.case for c in failed] == ["large dot products (+1000 and -800): the weights must stay finite"]
    assert "numerically stable softmax" in failed[0].hint


def test_an_in_place_edit_loses_credit_and_does_not_leak_into_later_gradings():
    src = next(b[2] for b in BUGGY if b[0] == "softmax-in-place-shift")
    cases = REFERENCES.cases(CH, "softmax", GRADER.seed, False)
    before = [c.args[0].clone() for c in cases]
    e = grade(namespace(src))["softmax"]
    assert e["score"] < 0.1 * e["max"]
    for c, x in zip(cases, before):
        assert torch.equal(c.args[0].nan_to_num(), x.nan_to_num()), c.case
    assert all(full(e) for e in grade(namespace()).values())


@pytest.mark.parametrize("src", [
    "def softmax(x, dim=-1):\n    return torch.softmax(x, dim)",
    "def softmax(x, dim=-1):\n    return x.softmax(dim)",
    "sm = F.softmax\ndef softmax(x, dim=-1):\n    return sm(x, dim=dim)",
    "def softmax(x, dim=-1):\n    return torch.exp(torch.log_softmax(x, dim))",
    "def softmax(x, dim=-1):\n    return torch.ops.aten._softmax(x, dim % x.dim(), False)",
])
def test_torch_softmax_in_softmax_scores_zero_with_a_note(src):
    result = grade(namespace(src))
    assert result["softmax"]["score"] == 0
    assert any("softmax" in n for n in result["softmax"]["notes"])
    assert full(result["attention_pool"])


CORRECT = [
    ("softmax-logsumexp", """
        def softmax(x, dim=-1):
            return torch.nan_to_num(torch.exp(x - torch.logsumexp(x, dim, keepdim=True)), nan=0.0)
        """),
    ("softmax-movedim-masked", """
        def softmax(x, dim=-1):
            z = x.movedim(dim, -1)                                   # (..., n)
            finite = torch.isfinite(z)
            m = torch.where(finite, z, torch.full_like(z, float("-inf"))).max(-1, keepdim=True).values
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.where(finite, torch.exp(z - m), torch.zeros_like(z))
            s = e.sum(-1, keepdim=True)
            return (e / torch.where(s == 0, torch.ones_like(s), s)).movedim(-1, dim)
        """),
    ("softmax-max-not-detached-clamped", """
        def softmax(x, dim=-1):
            m = x.max(dim=dim, keepdim=True).values
            m = m.nan_to_num(neginf=0.0)
            e = (x - m).exp()
            return e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        """),
    ("pool-einsum-torch-softmax", """
        def attention_pool(query, keys, values):
            w = torch.softmax(torch.einsum("...nd,...d->...n", keys, query), dim=-1)
            return torch.einsum("...n,...nv->...v", w, values), w
        """),
    ("pool-broadcast-sums-own-softmax", """
        def attention_pool(query, keys, values):
            w = softmax((keys * query.unsqueeze(-2)).sum(-1))          # (..., n)
            return (w.unsqueeze(-1) * values).sum(-2), w               # (..., d_v)
        """),
]


@pytest.mark.parametrize("name, src", CORRECT, ids=[c[0] for c in CORRECT])
def test_equivalent_implementations_score_full_marks(name, src):
    check_equivalent(CH, src)


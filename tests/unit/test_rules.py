"""Every rule an exercise's text states (tests/rules.py) is exercised on purpose: for every
exercise and 20 seeds, by a grader case and by a self-check quick case (the self-check runs at
its own seed; the seeds here show no rule hangs on the chance of a random mask)."""
from __future__ import annotations

import pytest
import torch

from autograder.shared.calls import Call
from autograder.cases import build_cases
from autograder.shared.contract import CHAPTERS
from autograder.cases.inputs import SELF_CHECK_SEED, grading_seed
from autograder.references.solutions import load_reference
from rules import RULES, FULLY_MASKED_BOOL, FULLY_MASKED_FLOAT, rules, unexercised

SEEDS = [SELF_CHECK_SEED, grading_seed(), *range(18)]
EXERCISES = [(ch.id, ex.name) for ch in CHAPTERS.values() for ex in ch.exercises]


def test_the_rules_name_exercises_of_the_contract():
    assert set(RULES) <= set(EXERCISES)


@pytest.mark.parametrize("chapter, exercise", [k for k in EXERCISES if k in RULES])
def test_every_stated_rule_has_a_grader_case_and_a_self_check_case(chapter, exercise):
    ref = load_reference(chapter)
    for seed in SEEDS:
        for quick in (False, True):
            calls = build_cases(chapter, exercise, ref, seed=seed, quick=quick)
            missing = unexercised(chapter, exercise, calls)
            assert not missing, (f"{'self-check' if quick else 'grader'} cases of {exercise} at seed {seed} "
                                 f"exercise no {missing}")


def _with(mask) -> Call:
    return Call("c", "e", "case", "t", kwargs={"mask": mask})


def test_the_predicates_look_at_the_inputs():
    """A rule is exercised by what the inputs hold, not by a case's name."""
    keep = torch.ones(3, 4, dtype=torch.bool)
    assert not FULLY_MASKED_BOOL.exercised(_with(keep))
    keep[1] = False
    assert FULLY_MASKED_BOOL.exercised(_with(keep)) and not FULLY_MASKED_FLOAT.exercised(_with(keep))
    bias = torch.zeros(2, 3, 4)
    assert not FULLY_MASKED_FLOAT.exercised(_with(bias))
    bias[1, 2, :3] = float("-inf")
    assert not FULLY_MASKED_FLOAT.exercised(_with(bias))
    bias[1, 2, 3] = float("-inf")
    assert FULLY_MASKED_FLOAT.exercised(_with(bias))
    assert [r.name for r in rules("07_efficient_attention", "online_softmax_attention")][-2:] == \
        ["a wholly masked key block", "memory"]


# ------------------------------------------------------------------ rules that chance used to test
from autograder.shared.contract import CHAPTERS as _CH  # noqa: E402
from autograder.runtime.execute import execute  # noqa: E402
from autograder.grading.judge import judge  # noqa: E402
from rules import BLOCK_MASKED  # noqa: E402

from grading_helpers import namespace_of  # noqa: E402

# nan_to_num after the softmax: zero rows in the forward pass, NaN gradients through a float
# mask's -inf row (a stated rule). Before, the grader's float-mask case had such a row only by
# the chance of its seed: 5/5 at the grader, while the self-check's seed flagged it.
MHSA_NAN_TO_NUM = """
import math
import torch
from torch import nn

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
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        w = torch.nan_to_num(torch.softmax(s, dim=-1))
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, N, E)), w
"""

# Blocks merged through logsumexp / logaddexp, with torch.where guarding the forward pass: right
# values, but a wholly -inf block gives exp(-inf - (-inf)) = NaN in the branch where() drops, and
# its gradient is NaN (the torch.where trap). Before, the grader caught it and the self-check did not.
ONLINE_LOGADDEXP = """
import torch

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    scale = q.shape[-1] ** -0.5
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for j in range(0, k.shape[-2], block_size):
        s = q @ k[..., j:j + block_size, :].transpose(-2, -1) * scale
        if mask is not None:
            m = mask[..., j:j + block_size]
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
        b_lse = torch.logsumexp(s, dim=-1)
        p = torch.where(torch.isneginf(b_lse)[..., None], torch.zeros_like(s), torch.exp(s - b_lse[..., None]))
        new = torch.logaddexp(lse, b_lse)
        dead = torch.isneginf(new)
        a_old = torch.where(dead, torch.zeros_like(lse), torch.exp(lse - new))
        a_new = torch.where(dead, torch.zeros_like(lse), torch.exp(b_lse - new))
        acc = acc * a_old[..., None] + a_new[..., None] * (p @ v[..., j:j + block_size, :])
        lse = new
    return acc, lse
"""


@pytest.mark.parametrize("chapter, exercise, src, rule", [
    ("03_multi_head_attention", "MultiHeadSelfAttention", MHSA_NAN_TO_NUM, FULLY_MASKED_FLOAT),
    ("07_efficient_attention", "online_softmax_attention", ONLINE_LOGADDEXP, BLOCK_MASKED),
])
def test_chance_dependent_mistakes_are_caught_at_every_seed_by_grader_and_self_check(chapter, exercise, src, rule):
    ns, ref = namespace_of(chapter, src), load_reference(chapter)
    ex = _CH[chapter].exercise(exercise)
    for seed in SEEDS:
        for quick in (False, True):
            calls = [c for c in build_cases(chapter, exercise, ref, seed=seed, quick=quick) if rule.exercised(c)]
            verdicts = [judge(ex, c, execute(ns, c), execute(ref, c)) for c in calls]
            failed = [v.mismatch for v in verdicts if v.mismatch]
            assert failed, f"{'self-check' if quick else 'grader'} at seed {seed} passes {exercise} with this mistake"
            assert any(m.aspect == "grads" for m in failed), [m.message for m in failed]
    # and the correct reference passes the same cases
    for c in build_cases(chapter, exercise, ref, seed=SEEDS[1], quick=False):
        assert judge(ex, c, execute(ref, c), execute(ref, c)).mismatch is None, c.case

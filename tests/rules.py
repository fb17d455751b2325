"""The rules each exercise's text states, as data, and what makes a case exercise each one.

A rule may cost points only where the exercise's text states it (shared/exercise-api.md; the
book's exercise cells say the same). Each rule listed here must be exercised on purpose, not by
the chance of a random mask: `exercised(call)` looks at the case's actual inputs (a boolean
mask with a row of False, a float mask with a row of -inf, dropout > 0 in training mode, ...),
and tests/unit/test_rules.py proves that for every exercise and many seeds both the grader's cases
and the self-check's quick cases contain one that does. The self-check is therefore never
silent about a rule the grader scores.

What every case exercises without being listed: the dtype and device rule (the grader runs
every case again on the meta device in float32, the self-check its first case, and on CUDA in
float32 and half precision where a GPU is present) and the in-place rule (checked on every call).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from autograder.shared.calls import Call


@dataclass(frozen=True)
class Rule:
    name: str
    stated: str                          # the contract's words
    exercised: Callable[[Call], bool]    # whether this case's inputs put the rule to the test


def _mask(call: Call, name: str = "mask"):
    m = call.kwargs.get(name)
    return m if isinstance(m, torch.Tensor) and m.dim() >= 1 else None


def _dead_rows(mask: torch.Tensor) -> torch.Tensor:
    """Which query rows have no key left (boolean rows of False, float rows of -inf)."""
    dead = ~mask if mask.dtype == torch.bool else torch.isneginf(mask)
    return dead.all(-1)


def _fully_masked(kind: str) -> Callable[[Call], bool]:
    def exercised(call: Call) -> bool:
        m = _mask(call)
        if m is None or (m.dtype == torch.bool) != (kind == "bool"):
            return False
        return bool(_dead_rows(m).any())
    return exercised


def _fully_masked_through_model(call: Call) -> bool:
    """TinyTransformer: the mask reaches every block; a fully masked row must stay finite
    through the blocks, the final LayerNorm and the head (and in the gradients)."""
    return _fully_masked("bool")(call) and "params" in call.grad


def _block_masked_with_grads(call: Call) -> bool:
    """online_softmax_attention: a query that has keys left, one of whose key blocks is wholly
    masked, with gradients asked for (merging blocks through logsumexp/logaddexp gives NaN
    gradients there: the torch.where trap)."""
    m, bs = _mask(call), call.kwargs.get("block_size", 64)
    if m is None or not call.grad or not isinstance(bs, int) or bs < 1:
        return False
    dead = ~m if m.dtype == torch.bool else torch.isneginf(m)
    L_k = dead.shape[-1]
    blocks = [dead[..., j: j + bs].all(-1) for j in range(0, L_k, bs)]
    some_block = torch.stack(blocks, -1).any(-1)
    return bool((some_block & ~dead.all(-1)).any())


def _dropout(call: Call) -> float:
    return float((call.init or {}).get("dropout") or 0.0)


FULLY_MASKED_BOOL = Rule(
    "fully masked row, boolean mask",
    "A query row whose keys are all masked out gets zero weights and a zero output, never NaN and "
    "never a uniform average (and finite gradients: all functions are differentiable)",
    _fully_masked("bool"))
FULLY_MASKED_FLOAT = Rule(
    "fully masked row, float mask",
    "the same for a floating-point mask whose row is all -inf (added to the scores)",
    _fully_masked("float"))
FULLY_MASKED_MODEL = Rule(
    "fully masked row through the whole model",
    "every block gets the same mask; the contract's zero rows keep the logits and gradients finite",
    _fully_masked_through_model)
BLOCK_MASKED = Rule(
    "a wholly masked key block",
    "output equals chapter 2's output for every block_size (and autograd gives its gradients)",
    _block_masked_with_grads)
GRADIENTS = Rule("gradients", "all are differentiable (autograd gives the reference's gradients)",
                 lambda c: bool(c.grad))
VALUE_ERROR = Rule("ValueError", "raises ValueError where the contract names it",
                   lambda c: c.expect_error == "ValueError")
DROPOUT_EVAL = Rule("dropout off in eval mode", "dropout acts in training mode only",
                    lambda c: _dropout(c) > 0 and not c.train)
DROPOUT_TRAIN = Rule("dropout in training mode", "dropout acts in training mode (p > 0)",
                     lambda c: _dropout(c) > 0 and c.train)
MEMORY = Rule("memory", "no tensor of L_q x L_k scores (the grader measures this)",
              lambda c: c.capped_memory or c.measure_memory)

_MASKED = (FULLY_MASKED_BOOL, FULLY_MASKED_FLOAT, GRADIENTS)
_MHA = _MASKED + (VALUE_ERROR, DROPOUT_EVAL, DROPOUT_TRAIN)

RULES: dict[tuple[str, str], tuple[Rule, ...]] = {
    ("01_intuition", "softmax"): (GRADIENTS,),
    ("01_intuition", "attention_pool"): (GRADIENTS,),
    ("02_scaled_dot_product_attention", "scaled_dot_product_attention"): _MASKED,
    ("02_scaled_dot_product_attention", "SelfAttention"): _MASKED,
    ("03_multi_head_attention", "split_heads"): (GRADIENTS,),
    ("03_multi_head_attention", "merge_heads"): (GRADIENTS,),
    ("03_multi_head_attention", "MultiHeadAttention"): _MHA,
    ("03_multi_head_attention", "MultiHeadSelfAttention"): _MASKED,
    ("04_positional_encoding", "SinusoidalPositionalEncoding"): (GRADIENTS, VALUE_ERROR),
    ("04_positional_encoding", "LearnedPositionalEmbedding"): (GRADIENTS, VALUE_ERROR),
    ("04_positional_encoding", "apply_rotary_embedding"): (GRADIENTS,),
    ("06_gated_global_attention", "MultiHeadAttention"): (GRADIENTS,),
    ("07_efficient_attention", "online_softmax_attention"): _MASKED + (BLOCK_MASKED, MEMORY),
    ("07_efficient_attention", "repeat_kv"): (GRADIENTS,),
    ("07_efficient_attention", "GroupedQueryAttention"): _MASKED + (VALUE_ERROR,),
    ("07_efficient_attention", "alibi_bias"): (VALUE_ERROR,),
    ("08_transformer", "MultiHeadAttention"): _MHA,
    ("08_transformer", "FeedForward"): (GRADIENTS, DROPOUT_EVAL, DROPOUT_TRAIN),
    ("08_transformer", "TransformerBlock"): _MASKED + (DROPOUT_EVAL, DROPOUT_TRAIN),
    ("08_transformer", "TinyTransformer"): (FULLY_MASKED_MODEL, GRADIENTS, VALUE_ERROR, DROPOUT_EVAL,
                                            DROPOUT_TRAIN),
}


def rules(chapter: str, exercise: str) -> tuple[Rule, ...]:
    return RULES.get((chapter, exercise), ())


def unexercised(chapter: str, exercise: str, calls: list[Call]) -> list[str]:
    """The rules of the exercise that none of `calls` exercises."""
    return [r.name for r in rules(chapter, exercise) if not any(r.exercised(c) for c in calls)]

"""Cases and hints of the exercises of other kinds than "implement", every chapter's together:

- "predict the output" (`predict_*`, contract kind "answer"): one call that reads the value the
  student wrote (Call.answer); compared by autograder/answers.py, to 0.01, in the grader only.
  The hints of likely wrong answers name the reasoning that was missed, never the right value
  nor a fact that gives it (this source is public: tests/test_written_answers.py).
- "find the bug" (`fixed_*`): the notebook shows a buggy function from the chapter's common
  mistakes; the student writes the corrected one under the `fixed_*` name, graded like any
  function, on a few small cases, the quick ones among them showing the bug.

Kept apart from the chNN modules (which the main exercises own); cases/__init__.py looks here
first (CASES, HINTS).
"""
from __future__ import annotations

import torch

from ..answers import answer_hints
from . import Hints, Mistake, call


def _answer(name):
    def cases(gen, ref, quick):
        return [call("your written answer", answer=True)]
    return cases


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


# -------------------------------------------------------------------------- chapter 1
def _softmax_rows_cases(gen, ref, quick):
    mixed = torch.stack([_randn(gen, 5) - 1000.0, _randn(gen, 5), _randn(gen, 5) * 30 + 500.0])
    cs = [call("rows of very different magnitudes (-1000, 0, +500)", mixed, grad=["args.0"]),
          call("(2, 3, 4) ordinary values", _randn(gen, 2, 3, 4), grad=["args.0"])]
    if quick:
        return cs
    return cs + [call("one row", _randn(gen, 7) * 5, grad=["args.0"]),
                 call("(4, 6) rows far apart", _randn(gen, 4, 6) + torch.tensor([[-800.], [0.], [300.], [900.]],
                                                                          dtype=torch.float64))]


def _softmax_global_max(c):
    x = c.args[0]
    e = torch.exp(x - x.max())
    return e / e.sum(-1, keepdim=True)


# -------------------------------------------------------------------------- chapter 2
def _visible_mask(gen, *shape):
    m = torch.rand(*shape, generator=gen) < 0.6
    first = torch.randint(shape[-1], shape[:-1], generator=gen)
    return m | torch.nn.functional.one_hot(first, shape[-1]).bool()  # every query sees a key


def _masked_attention_cases(gen, ref, quick):
    g = ["args.0", "args.1", "args.2"]
    cs = [call("(2, 3, 4) queries, 5 keys, boolean mask", _randn(gen, 2, 3, 4), _randn(gen, 2, 5, 4),
               _randn(gen, 2, 5, 3), _visible_mask(gen, 2, 3, 5), grad=g),
          call("unbatched, 4 queries and keys, causal mask", _randn(gen, 4, 2), _randn(gen, 4, 2),
               _randn(gen, 4, 2), torch.ones(4, 4, dtype=torch.bool).tril(), grad=g)]
    if quick:
        return cs
    return cs + [call("(2, 2, 3, 8), mask broadcast over heads", _randn(gen, 2, 2, 3, 8), _randn(gen, 2, 2, 6, 8),
                      _randn(gen, 2, 2, 6, 8), _visible_mask(gen, 2, 1, 3, 6), grad=g)]


def _sdpa(q, k, v, mask, after_softmax=False):
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if after_softmax:
        w = torch.softmax(s, -1) * mask
    else:
        w = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
    return [w @ v, w]


# -------------------------------------------------------------------------- chapter 3
def _heads(q, k, v, h, scale_dim=None):
    B, L, D = q.shape[0], q.shape[-2], q.shape[-1]
    split = lambda x: x.reshape(*x.shape[:-1], h, D // h).transpose(-3, -2)
    s = split(q) @ split(k).transpose(-2, -1) / (scale_dim or D // h) ** 0.5
    o = torch.softmax(s, -1) @ split(v)
    return o.transpose(-3, -2).reshape(*q.shape[:-1], D)


def _heads_cases(gen, ref, quick):
    g = ["args.0", "args.1", "args.2"]
    cs = [call("B=2, L=3, D=8, 2 heads", _randn(gen, 2, 3, 8), _randn(gen, 2, 3, 8), _randn(gen, 2, 3, 8), 2, grad=g),
          call("B=1, L_q=2, L_k=5, D=12, 3 heads", _randn(gen, 1, 2, 12), _randn(gen, 1, 5, 12), _randn(gen, 1, 5, 12), 3,
               grad=g)]
    if quick:
        return cs
    return cs + [call("B=3, L=4, D=16, 4 heads", _randn(gen, 3, 4, 16), _randn(gen, 3, 4, 16), _randn(gen, 3, 4, 16), 4,
                      grad=g),
                 call("one head", _randn(gen, 2, 3, 4), _randn(gen, 2, 3, 4), _randn(gen, 2, 3, 4), 1)]


# -------------------------------------------------------------------------- chapter 4
def _pe_angles_cases(gen, ref, quick):
    cs = [call("max_len=5, d_model=8", 5, 8, as_default=True),
          call("max_len=10, d_model=64", 10, 64, as_default=True)]
    if quick:
        return cs
    return cs + [call("max_len=3, d_model=7 (odd)", 3, 7, as_default=True),
                 call("max_len=1, d_model=2", 1, 2, as_default=True)]


def _angles(c, pair_index=False):
    L, d = c.args[0], c.args[1]
    i = torch.arange(0, (d + 1) // 2, dtype=torch.float64) if pair_index else torch.arange(0, d, 2, dtype=torch.float64)
    return torch.arange(L, dtype=torch.float64)[:, None] / 10000 ** (i / d)


# -------------------------------------------------------------------------- chapter 5
def _masked_softmax_cases(gen, ref, quick):
    m = torch.rand(2, 3, 4, generator=gen) < 0.6
    m[0, 1] = False  # a fully masked row
    m[1, 0] = True
    m[1, 2] = False
    cs = [call("(2, 3, 4), two fully masked rows", _randn(gen, 2, 3, 4) * 3, m),
          call("(5,) one row, keys 1 and 3 visible", _randn(gen, 5), torch.tensor([False, True, False, True, False]))]
    if quick:
        return cs
    full = torch.zeros(3, 3, dtype=torch.bool)
    return cs + [call("(3, 3) every row fully masked", _randn(gen, 3, 3), full),
                 call("(2, 4, 4) causal mask, broadcast", _randn(gen, 2, 4, 4), torch.ones(4, 4, dtype=torch.bool).tril())]


def _masked_softmax(c, fill=None):
    s, m = c.args
    if fill is not None:
        return torch.softmax(s.masked_fill(~m, fill), -1)
    w = torch.softmax(s.masked_fill(~m, float("-inf")), -1)
    return torch.nan_to_num(w, nan=0.0)


# -------------------------------------------------------------------------- chapter 6
def _global_cases(gen, ref, quick):
    def mask(*shape):
        m = (torch.rand(*shape, generator=gen) < 0.6).double()
        m[..., 0] = 1.0  # every row has a position to average
        return m
    cs = [call("q (2, 5, 4), mask (2, 5) with zeros", _randn(gen, 2, 5, 4), mask(2, 5), grad=["args.0"]),
          call("q (3, 2, 6, 8), mask (3, 2, 6)", _randn(gen, 3, 2, 6, 8), mask(3, 2, 6), grad=["args.0"])]
    if quick:
        return cs
    return cs + [call("mask all ones", _randn(gen, 2, 4, 3), torch.ones(2, 4, dtype=torch.float64), grad=["args.0"])]


def _global_query(c, divide_by_length=False):
    q, m = c.args
    s = (q * m[..., None]).sum(-2)
    return s / (q.shape[-2] if divide_by_length else m.sum(-1, keepdim=True))


# -------------------------------------------------------------------------- chapter 7
def _stats_cases(gen, ref, quick):
    def stats(*shape):
        return _randn(gen, *shape) * 3, torch.rand(*shape, generator=gen, dtype=torch.float64) * 4 + 1
    m1, l1 = stats(2, 5)
    m2, l2 = stats(2, 5)
    cs = [call("(2, 5) statistics", m1, l1, m2, l2, grad=["args.1", "args.3"])]
    m1, l1 = stats(4)
    m2, l2 = stats(4)
    cs.append(call("(4,) statistics, first block's maximum larger", torch.maximum(m1, m2) + 1, l1, m2, l2))
    if quick:
        return cs
    m1, l1 = stats(3, 2, 6)
    m2, l2 = stats(3, 2, 6)
    return cs + [call("(3, 2, 6) statistics", m1, l1, m2, l2, grad=["args.1", "args.3"])]


def _merge(c, rescale=True):
    m1, l1, m2, l2 = c.args
    m = torch.maximum(m1, m2)
    return [m, l1 * torch.exp(m1 - m) + l2 * torch.exp(m2 - m) if rescale else l1 + l2]


# -------------------------------------------------------------------------- chapter 8
def _loss_cases(gen, ref, quick):
    cs = [call("B=2, L=5, V=7", _randn(gen, 2, 5, 7), torch.randint(7, (2, 5), generator=gen), grad=["args.0"]),
          call("B=1, L=3, V=4", _randn(gen, 1, 3, 4), torch.randint(4, (1, 3), generator=gen), grad=["args.0"])]
    if quick:
        return cs
    return cs + [call("B=3, L=8, V=11", _randn(gen, 3, 8, 11), torch.randint(11, (3, 8), generator=gen), grad=["args.0"])]


def _loss(c, shift=True):
    logits, tokens = c.args
    V = logits.shape[-1]
    if shift:
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1))


CASES = {
    ("01_intuition", "predict_softmax_large"): _answer("predict_softmax_large"),
    ("01_intuition", "fixed_softmax_rows"): _softmax_rows_cases,
    ("02_scaled_dot_product_attention", "predict_equal_keys_output"): _answer("predict_equal_keys_output"),
    ("02_scaled_dot_product_attention", "fixed_masked_attention"): _masked_attention_cases,
    ("03_multi_head_attention", "predict_split_heads_shape"): _answer("predict_split_heads_shape"),
    ("03_multi_head_attention", "fixed_heads_attention"): _heads_cases,
    ("04_positional_encoding", "predict_pe_first_row"): _answer("predict_pe_first_row"),
    ("04_positional_encoding", "fixed_pe_angles"): _pe_angles_cases,
    ("05_masks", "predict_fully_masked_weights"): _answer("predict_fully_masked_weights"),
    ("05_masks", "fixed_masked_softmax"): _masked_softmax_cases,
    ("06_gated_global_attention", "predict_zero_gate_factor"): _answer("predict_zero_gate_factor"),
    ("06_gated_global_attention", "fixed_global_query"): _global_cases,
    ("07_efficient_attention", "predict_window_row"): _answer("predict_window_row"),
    ("07_efficient_attention", "fixed_merge_softmax_stats"): _stats_cases,
    ("08_transformer", "predict_feedforward_params"): _answer("predict_feedforward_params"),
    ("08_transformer", "fixed_next_token_loss"): _loss_cases,
}

HINTS = {
    ("01_intuition", "predict_softmax_large"): Hints(explain=answer_hints(
        ([float("nan")] * 3, "a stable softmax subtracts the row's maximum first, so exp(1000) is never computed "
                             "and nothing overflows"),
        ([1 / 3] * 3, "a -inf entry is not an ordinary score: work out exp(-inf), and so the weight it gets"),
        ([1.0, 0.0, 0.0], "two of the entries are equal, and the softmax cannot tell equal entries apart: "
                          "look again at the weights you gave those two"))),
    ("01_intuition", "fixed_softmax_rows"): Hints((
        Mistake("the buggy version is unchanged: subtract each row's own maximum "
                "(x.amax(-1, keepdim=True)), not the maximum of the whole tensor", _softmax_global_max),)),
    ("02_scaled_dot_product_attention", "predict_equal_keys_output"): Hints(explain=answer_hints(
        ([[5.0, 6.0]], "the output mixes every value, not one of them: work out each key's score against "
                       "this query, then the weights those scores give"),
        ([[1.0, 2.0]], "the output mixes every value, not one of them: work out each key's score against "
                       "this query, then the weights those scores give"),
        ([[9.0, 12.0]], "that is the values' plain sum, as if every weight were 1: what do a softmax's "
                        "weights add up to?"))),
    ("02_scaled_dot_product_attention", "fixed_masked_attention"): Hints((
        Mistake("the mask is still applied after the softmax: mask the scores (masked_fill with -inf) before "
                "the softmax, so that each row of weights sums to 1",
                lambda c: _sdpa(*c.args, after_softmax=True)),)),
    ("03_multi_head_attention", "predict_split_heads_shape"): Hints(explain=answer_hints(
        ([2, 5, 3, 4], "check the order of the axes in split_heads's contract: where does the head "
                       "axis go, relative to the sequence axis?"),
        ([2, 3, 5, 12], "the heads share the features among them, they do not each get all of them: "
                        "how many does each head get?"))),
    ("03_multi_head_attention", "fixed_heads_attention"): Hints((
        Mistake("the scores are still scaled by sqrt(D): each head's dot products run over d_h = D // num_heads "
                "features, so divide by sqrt(D // num_heads)",
                lambda c: _heads(*c.args, scale_dim=c.args[0].shape[-1])),)),
    ("04_positional_encoding", "predict_pe_first_row"): Hints(explain=answer_hints(
        ([1, 0, 1, 0, 1, 0], "check which columns hold sines and which cosines (PE[p, 2i] and PE[p, 2i+1]), "
                             "then what each gives at position 0"),
        ([0] * 6, "not every column is a sine: look at what the odd columns hold, and what that gives at "
                  "position 0"))),
    ("04_positional_encoding", "fixed_pe_angles"): Hints((
        Mistake("the exponent still uses the pair index i: it must be 2i / d_model (torch.arange(0, d_model, 2))",
                lambda c: _angles(c, pair_index=True)),)),
    ("05_masks", "predict_fully_masked_weights"): Hints(explain=answer_hints(
        ([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]], "that is the course's convention, not what this code does: -1e9 is "
                                              "an ordinary (very negative) number, and the softmax of the "
                                              "second row is computed from it like from any other scores"),
        ([[0.5, 0.5, 0.0], [float("nan")] * 3], "-1e9 is a finite number, not -inf: follow the softmax of the "
                                                 "second row with it, as with any other scores"))),
    ("05_masks", "fixed_masked_softmax"): Hints((
        Mistake("a fully masked row still gets uniform weights (the -1e9 fill): give such rows zero weights",
                lambda c: _masked_softmax(c, fill=-1e9)),
        Mistake("a fully masked row gives NaN (-inf without handling the all-masked row): turn such rows into zeros",
                lambda c: _masked_softmax(c, fill=float("-inf"))))),
    ("06_gated_global_attention", "predict_zero_gate_factor"): Hints(explain=answer_hints(
        (0.0, "the gate is not linear_g(x) itself: it goes through a sigmoid, sigmoid(linear_g(x)); "
              "work out what the sigmoid gives here"),
        (1.0, "the gate is sigmoid(linear_g(x)): work out linear_g(x) when its weights and bias are zero, "
              "then the sigmoid of that"))),
    ("06_gated_global_attention", "fixed_global_query"): Hints((
        Mistake("still divided by the full length: a masked mean divides by the number of positions "
                "whose mask is 1 (mask.sum(-1, keepdim=True))", lambda c: _global_query(c, divide_by_length=True)),)),
    ("07_efficient_attention", "predict_window_row"): Hints(explain=answer_hints(
        ([0, 1, 1, 1, 1, 0], "off by one: count the visible keys again with the condition of "
                             "sliding_window_mask's contract (does the window count the query's own position?)"),
        ([0, 0, 0, 1, 1, 1], "the mask is causal: can a query see a key that comes after it?"),
        ([0, 1, 1, 1, 0, 0], "look at the query's own position: does the window count it?"))),
    ("07_efficient_attention", "fixed_merge_softmax_stats"): Hints((
        Mistake("the sums are still added as they are: rescale each by exp(m_block - m_new) to the new maximum "
                "before adding", lambda c: _merge(c, rescale=False)),)),
    ("08_transformer", "predict_feedforward_params"): Hints(explain=answer_hints(
        (512, "nn.Linear has a bias by default: count each layer's bias too"),
        (544, "fc2 has a bias too: count its parameters"),
        (520, "fc1 has a bias too: count its parameters"))),
    ("08_transformer", "fixed_next_token_loss"): Hints((
        Mistake("the targets are not shifted: position t predicts token t + 1, so compare logits[:, :-1] with "
                "tokens[:, 1:]", lambda c: _loss(c, shift=False)),)),
}

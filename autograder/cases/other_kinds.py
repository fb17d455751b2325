"""Cases and hints of the exercises whose task is not "implement" (`Exercise.task`,
shared/kinds.py), every chapter's together; their strategies (cases/kinds.py) read them here:

- a written answer ("predict the output", task WRITTEN_ANSWER, contract kind "answer"): one call
  that reads the value the student wrote (Call.answer, made by its strategy); compared by
  autograder/cases/written_answers.py, to 0.01, in the grader only. The hints of likely wrong
  answers, and those wrong answers, are the instructor's data (the solution notebooks' answer
  cells, answers.hint_table): this source is public, and a table of wrong answers here would
  give the right ones away (tests/course/test_written_answers.py). HINTS holds each one's
  `answer_hints`.
- find the bug (task FIND_THE_BUG): the notebook shows a buggy function from the chapter's
  common mistakes; the student writes the corrected one (under a `fixed_*` name), graded like
  any function, on a few small cases (CASES), the quick ones among them showing the bug. On
  the unchanged bug the self-check names the symptom (which output is wrong, on which input, by
  how much), never the fix; the grader's report adds the fix (`Bug`, `symptoms_only`).

Kept apart from the chNN modules, which the implemented exercises own.
"""
from __future__ import annotations

import contextlib
import dataclasses
import contextvars
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from ..shared.contract import CHAPTERS
from ..shared.kinds import WRITTEN_ANSWER
from .written_answers import answer_hints
from . import Hints, call, predict
from ..selfcheck.hint_engine import bug_hint


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
    D = q.shape[-1]
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
    ("01_intuition", "fixed_softmax_rows"): _softmax_rows_cases,
    ("02_scaled_dot_product_attention", "fixed_masked_attention"): _masked_attention_cases,
    ("03_multi_head_attention", "fixed_heads_attention"): _heads_cases,
    ("04_positional_encoding", "fixed_pe_angles"): _pe_angles_cases,
    ("05_masks", "fixed_masked_softmax"): _masked_softmax_cases,
    ("06_gated_global_attention", "fixed_global_query"): _global_cases,
    ("07_efficient_attention", "fixed_merge_softmax_stats"): _stats_cases,
    ("08_transformer", "fixed_next_token_loss"): _loss_cases,
}


# -------------------------------------------------------------------------- find the bug: symptoms
_FIXES_SHOWN = contextvars.ContextVar("fixes_shown", default=True)


@contextlib.contextmanager
def symptoms_only():
    """While the student works (the self-check), a find-the-bug hint names the symptom alone:
    the fix is the exercise. The grader's report, read once the work is handed in, adds it."""
    token = _FIXES_SHOWN.set(False)
    try:
        yield
    finally:
        _FIXES_SHOWN.reset(token)


@dataclass(frozen=True)
class Bug:
    """The buggy function's behaviour (`model`), what it looks like on a call (`symptom`:
    (call, student outputs, expected outputs) -> words with numbers) and the fix, in words."""

    model: Callable
    symptom: Callable
    fix: str


def bug_hints(*bugs: Bug) -> Hints:
    def explain(call, student, expected, mismatch):
        return bug_hint([(predict(bug.model, call), partial(_symptom, bug, call)) for bug in bugs],
                        call, student, expected, mismatch)
    explain.bugs = bugs
    return Hints(explain=explain)


def _symptom(bug: Bug, call, student, expected) -> str:
    """The bug's symptom on the student's and the expected outputs, and, in the grader's report,
    its fix (not in the self-check: `symptoms_only`)."""
    text = bug.symptom(call, [t.double() for t in student.outputs], [t.double() for t in expected.outputs])
    return f"{text}. The fix: {bug.fix}" if _FIXES_SHOWN.get() else text


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]) if t.dim() else t.reshape(1, 1)


def _wrong_rows(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    g, w = _rows(got), _rows(want)
    return ~torch.isclose(g, w, rtol=1e-5, atol=1e-8).all(-1)


def _row_name(r: int, t: torch.Tensor) -> str:
    """Row `r` of _rows(t), by its index in t."""
    return f"row {_index(r, t.shape[:-1])}" if t.dim() > 2 else f"row {r}"


def _index(flat: int, shape) -> tuple:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape)))


def _worst(got: torch.Tensor, want: torch.Tensor) -> float:
    d = (got - want).abs()
    return float(torch.nan_to_num(d, nan=float("inf")).max())


def _softmax_rows_symptom(c, got, want):
    x = _rows(c.args[0].double())
    bad = _wrong_rows(got[0], want[0])
    nan = int(torch.isnan(_rows(got[0])).any(-1).sum())
    r = int(bad.nonzero()[0, 0])
    return (f"{int(bad.sum())} of {bad.numel()} rows come out wrong ({nan} of them NaN); every wrong row's own "
            f"largest value is far below the largest value of the whole input ({_row_name(r, c.args[0])}: {float(x[r].max()):.4g}, "
            f"against {float(x.max()):.4g}), and the row that holds the input's largest value is right")


def _masked_attention_symptom(c, got, want):
    sums = _rows(got[1]).sum(-1)
    r = int(sums.argmin())
    return (f"the masked keys get weight 0, but the rows of weights do not sum to 1 ({_row_name(r, got[1])} sums to "
            f"{float(sums[r]):.3f}), so the output is off by up to {_worst(got[0], want[0]):.3g}")


def _heads_symptom(c, got, want):
    v = c.args[2].double()
    uniform = v.mean(-2, keepdim=True)  # what equal weights on every key give
    far = lambda t: float((t - uniform).abs().mean())  # noqa: E731
    return (f"the output is off by up to {_worst(got[0], want[0]):.3g}, and it lies closer to the plain "
            f"average of the values (what equal weights give) than the right output does: mean distance "
            f"{far(got[0]):.3g} against {far(want[0]):.3g}, as if each head's weights were too flat")


def _angles_symptom(c, got, want):
    g, w = got[0], want[0]
    p = g.shape[0] - 1
    col = int((g[p] - w[p]).abs().argmax())
    return (f"column 0 is right, the later columns are too large: at position {p}, column {col} is "
            f"{float(g[p, col]):.4g} where it should be {float(w[p, col]):.4g} "
            f"({float(g[p, col] / w[p, col]):.3g} times too large): the angles shrink too slowly from one "
            f"column to the next")


def _dead_rows(c):
    s, m = c.args
    return _rows(torch.broadcast_to(~m, s.shape)).all(-1)


def _uniform_fill_symptom(c, got, want):
    dead = _dead_rows(c)
    n = c.args[0].shape[-1]
    return (f"the {int(dead.sum())} row(s) whose keys are all masked get {1 / n:.3g} on every key (weights "
            f"that sum to 1) instead of all zeros; the rows with a visible key are right")


def _nan_fill_symptom(c, got, want):
    dead = _dead_rows(c)
    return (f"the {int(dead.sum())} row(s) whose keys are all masked come out as NaN instead of all zeros; "
            f"the rows with a visible key are right")


def _global_symptom(c, got, want):
    q, m = c.args
    ratio = (_rows(got[0]).norm(dim=-1) / _rows(want[0]).norm(dim=-1))
    length = m.shape[-1]
    kept = m.reshape(-1, length).sum(-1)
    r = int(kept.argmin())
    return (f"the result is too small wherever the mask drops positions: {_row_name(r, m)} keeps {int(kept[r])} of "
            f"{length} positions, and its result is {float(ratio[r]):.3g} times the right one; where the "
            f"mask keeps every position the result is right")


def _merge_symptom(c, got, want):
    m1, _, m2, _ = (a.double() for a in c.args)
    flat = int((got[1] - want[1]).abs().argmax())
    i = _index(flat, got[1].shape)
    return (f"m is right; l is wrong wherever the two blocks' maxima differ: at index {i} (m1 = "
            f"{float(m1[i]):.3g}, m2 = {float(m2[i]):.3g}) l is {float(got[1][i]):.4g} where it should be "
            f"{float(want[1][i]):.4g}; where m1 equals m2 it is right")


def _loss_symptom(c, got, want):
    logits, tokens = c.args
    V = logits.shape[-1]
    copy = torch.nn.functional.one_hot(tokens, V).double() * 50.0  # logits sure of the token they read
    return (f"the loss is {float(got[0]):.4g} where it should be {float(want[0]):.4g} (off by "
            f"{abs(float(got[0] - want[0])):.3g}); and logits that merely repeat the token each position "
            f"reads score a loss of {float(_loss(dataclasses.replace(c, args=[copy, tokens]), shift=False)):.2g} "
            f"from this function, as if copying the input were predicting the next token")


HINTS = {  # a written answer's: the hints of likely wrong answers (written_answers.answer_hints)
    **{(ch.id, ex.name): Hints(explain=answer_hints(ch.id, ex.name))
       for ch in CHAPTERS.values() for ex in ch.exercises if ex.task is WRITTEN_ANSWER},
    ("01_intuition", "fixed_softmax_rows"): bug_hints(Bug(
        _softmax_global_max, _softmax_rows_symptom,
        "the buggy version is unchanged: subtract each row's own maximum (x.amax(-1, keepdim=True)), not the "
        "maximum of the whole tensor")),
    ("02_scaled_dot_product_attention", "fixed_masked_attention"): bug_hints(Bug(
        lambda c: _sdpa(*c.args, after_softmax=True), _masked_attention_symptom,
        "the mask is still applied after the softmax: mask the scores (masked_fill with -inf) before the "
        "softmax, so that each row of weights sums to 1")),
    ("03_multi_head_attention", "fixed_heads_attention"): bug_hints(Bug(
        lambda c: _heads(*c.args, scale_dim=c.args[0].shape[-1]), _heads_symptom,
        "the scores are still scaled by sqrt(D): each head's dot products run over d_h = D // num_heads "
        "features, so divide by sqrt(D // num_heads)")),
    ("04_positional_encoding", "fixed_pe_angles"): bug_hints(Bug(
        lambda c: _angles(c, pair_index=True), _angles_symptom,
        "the exponent still uses the pair index i: it must be 2i / d_model (torch.arange(0, d_model, 2))")),
    ("05_masks", "fixed_masked_softmax"): bug_hints(
        Bug(lambda c: _masked_softmax(c, fill=-1e9), _uniform_fill_symptom,
            "a fully masked row still gets uniform weights (the -1e9 fill): give such rows zero weights"),
        Bug(lambda c: _masked_softmax(c, fill=float("-inf")), _nan_fill_symptom,
            "a fully masked row gives NaN (-inf without handling the all-masked row): turn such rows into zeros")),
    ("06_gated_global_attention", "fixed_global_query"): bug_hints(Bug(
        lambda c: _global_query(c, divide_by_length=True), _global_symptom,
        "still divided by the full length: a masked mean divides by the number of positions whose mask is 1 "
        "(mask.sum(-1, keepdim=True))")),
    ("07_efficient_attention", "fixed_merge_softmax_stats"): bug_hints(Bug(
        lambda c: _merge(c, rescale=False), _merge_symptom,
        "the sums are still added as they are: rescale each by exp(m_block - m_new) to the new maximum before "
        "adding")),
    ("08_transformer", "fixed_next_token_loss"): bug_hints(Bug(
        lambda c: _loss(c, shift=False), _loss_symptom,
        "the targets are not shifted: position t predicts token t + 1, so compare logits[:, :-1] with "
        "tokens[:, 1:]")),
}


def fix_text(chapter: str, exercise: str) -> str:
    """The fix of a find-the-bug exercise, in the grader's words (of its first bug)."""
    return HINTS[chapter, exercise].explain.bugs[0].fix

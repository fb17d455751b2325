"""Chapter 4: sinusoidal_positional_encoding, SinusoidalPositionalEncoding,
LearnedPositionalEmbedding and apply_rotary_embedding.

sinusoidal_positional_encoding builds a tensor from no input, so it runs with the call's device
and dtype as torch's defaults (`as_default`): float64 and float32 on the CPU, and the meta device
in the portability test (a table built with numpy or on a fixed device shows there).

SinusoidalPositionalEncoding's table must be the student's own, so no state is loaded. One case
(STRUCTURE_CASE) requires a buffer named `pe` of the reference's shape, (max_len, d_model); the
others grade behaviour only, so a (1, max_len, d) or (max_len, 1, d) buffer (annotated-
transformer, the PyTorch tutorial) loses that case, not every case its forward gets right. Its cases run in
float32: the module builds its table at construction, in torch's default dtype (float32), before
the executor casts it, so a float64 comparison would fail correct tables computed by another,
equally good float32 formula.
"""
from __future__ import annotations

import math

import torch

from .inputs import distinct_state, randn
from . import Hints, Mistake, call
from ..selfcheck.rules.ch04_positional_encoding import (  # noqa: F401  (compare: the chapter's rule)
    EXPLAIN, STRUCTURE_CASE, _table_args, compare)


def cases(exercise, gen, ref, quick):
    if exercise == "sinusoidal_positional_encoding":
        return _table_cases(quick)
    if exercise == "SinusoidalPositionalEncoding":
        return _sinusoidal_module_cases(gen, quick)
    if exercise == "LearnedPositionalEmbedding":
        return _learned_cases(gen, ref, quick)
    if exercise == "apply_rotary_embedding":
        return _rope_cases(gen, quick)
    raise KeyError(exercise)


# ----------------------------------------------------------------------------- cases
def _table_cases(quick):
    cs = [
        call("max_len=12, d_model=8", 12, 8, as_default=True),
        call("odd d_model=7 (the last column is a sine), max_len=9", 9, 7, as_default=True),
    ]
    if quick:
        return cs
    return cs + [
        call("max_len=64, d_model=32 (positions and frequencies both vary widely)", 64, 32, as_default=True),
        call("max_len=5, d_model=5 (square, odd)", 5, 5, as_default=True),
        call("max_len=1, d_model=2", 1, 2, as_default=True),
        call("keyword arguments max_len=20, d_model=6", kwargs={"max_len": 20, "d_model": 6}, as_default=True),
        call("float32 default dtype: the table is float32, max_len=16, d_model=10", 16, 10,
             as_default=True, dtype="float32"),
    ]


def _sinusoidal_module_cases(gen, quick):
    g = ["args.0"]
    f32 = {"dtype": "float32", "grad": g}
    cs = [
        call(STRUCTURE_CASE, randn(gen, 2, 5, 8), init={"d_model": 8, "max_len": 20}, **f32),
        call("d_model=6, max_len=12, x (3, 4, 6)", randn(gen, 3, 4, 6), init={"d_model": 6, "max_len": 12}, **f32),
        call("L > max_len raises ValueError (x (1, 11, 4), max_len=10)", randn(gen, 1, 11, 4),
             init={"d_model": 4, "max_len": 10}, expect_error="ValueError"),
        call("L == max_len works (x (3, 16, 6), max_len=16)", randn(gen, 3, 16, 6),
             init={"d_model": 6, "max_len": 16}, **f32),
    ]
    if quick:
        return cs
    return cs + [
        call("default max_len, d_model=12, x (1, 7, 12)", randn(gen, 1, 7, 12),
             init={"d_model": 12}, **f32),
        call("d_model=16, max_len=40, x (4, 1, 16) (L = 1)", randn(gen, 4, 1, 16),
             init={"d_model": 16, "max_len": 40}, **f32),
        call("d_model=32, max_len=64, x (2, 30, 32)", randn(gen, 2, 30, 32),
             init={"d_model": 32, "max_len": 64}, **f32),
        call("L > default max_len raises ValueError (x (1, 5001, 2))", torch.zeros(1, 5001, 2),
             init={"d_model": 2}, expect_error="ValueError"),
    ]


def _learned_cases(gen, ref, quick):
    cls = ref["LearnedPositionalEmbedding"]
    g = ["args.0", "params"]

    def case(name, max_len, d_model, xshape, **fields):
        state = distinct_state(cls(max_len, d_model), gen)
        fields.setdefault("grad", g)
        return call(name, randn(gen, *xshape), init={"max_len": max_len, "d_model": d_model},
                    state=state, **fields)

    cs = [
        case("max_len=10, d_model=6, x (2, 7, 6)", 10, 6, (2, 7, 6)),
        case("L > max_len raises ValueError (x (2, 9, 4), max_len=8)", 8, 4, (2, 9, 4),
             expect_error="ValueError", grad=[]),
        case("L == max_len works (x (1, 10, 4), max_len=10)", 10, 4, (1, 10, 4)),
    ]
    if quick:
        return cs
    return cs + [
        case("x (3, 1, 5) (L = 1), max_len=12", 12, 5, (3, 1, 5)),
        case("max_len=50, d_model=16, x (4, 13, 16)", 50, 16, (4, 13, 16)),
        case("float32 keeps float32, x (2, 6, 8)", 20, 8, (2, 6, 8), dtype="float32"),
    ]


def _rope_cases(gen, quick):
    g = ["args.0"]
    cs = [
        call("unbatched x (6, 8)", randn(gen, 6, 8), grad=g),
        call("batch (2,), x (2, 7, 6), base=100.0", randn(gen, 2, 7, 6), kwargs={"base": 100.0}, grad=g),
    ]
    if quick:
        return cs
    return cs + [
        call("batch (2, 3), x (2, 3, 5, 4)", randn(gen, 2, 3, 5, 4), grad=g),
        call("d = 2, L = 9 (a single pair)", randn(gen, 9, 2), grad=g),
        call("L = 1: position 0 leaves x unchanged", randn(gen, 3, 1, 8), grad=g),
        call("long sequence, x (40, 32)", randn(gen, 40, 32), grad=g),
        call("base given positionally: (x, 500.0), x (3, 4, 10)", randn(gen, 3, 4, 10), 500.0, grad=g),
        call("float32 keeps float32, x (2, 12, 16)", randn(gen, 2, 12, 16), dtype="float32", grad=g),
    ]


# ----------------------------------------------------------------------------- mistake models
def _table(max_len, d_model, *, swap=False, exponent="2i", concat=False, transpose=False):
    """The sinusoidal table (float64) with one deliberate mistake switched on."""
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)           # (max_len, 1)
    col = torch.arange(d_model, dtype=torch.float64)                        # (d_model,)
    pair = torch.div(col, 2, rounding_mode="floor")                         # i of column 2i / 2i+1
    power = {"2i": 2 * pair, "i": pair, "j": col}[exponent] / d_model
    angle = pos / 10000.0 ** power                                          # (max_len, d_model)
    even = (col % 2 == 0)
    if concat:  # [sin of every pair | cos of every pair]
        half = (d_model + 1) // 2
        freqs = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / d_model)
        a = pos * freqs
        table = torch.cat([torch.sin(a), torch.cos(a)[:, : d_model - half]], dim=1)
    elif swap:
        table = torch.where(even, torch.cos(angle), torch.sin(angle))
    else:
        table = torch.where(even, torch.sin(angle), torch.cos(angle))
    return table.T if transpose else table


_TABLE_MISTAKES = [
    ({"swap": True}, "sin and cos are swapped: even columns 2i hold the sine, odd columns 2i+1 the cosine"),
    ({"exponent": "i"}, "the exponent is i/d_model: use 10000^(2i/d_model), where 2i is the even column index"),
    ({"exponent": "j"}, "the cosine column 2i+1 must use the same frequency as the sine column 2i: the "
                        "exponent is 2i/d_model for both, not (2i+1)/d_model"),
    ({"concat": True}, "the sines and cosines are concatenated ([sin | cos]); they must interleave: "
                       "PE[:, 0::2] = sin, PE[:, 1::2] = cos"),
]


def _x(call):
    return call.args[0].double()


def _with_table(kw, fn=lambda x, pe: x + pe, offset=0):
    """The module's output x + pe[:L] with the table built with mistake `kw` (and positions
    starting at `offset`), combined with x by `fn`."""
    def model(call):
        x = _x(call)
        L, d_model = x.shape[-2], x.shape[-1]
        return fn(x, _table(L + offset, d_model, **kw)[offset:])
    return model


def _embedding(call, offset=0):
    x = _x(call)
    L = x.shape[-2]
    return call.state["embedding.weight"].double()[offset:L + offset]


def _rope(x, base=10000.0, *, halves=False, sign=1.0, exponent="2i", repeat=False, offset=0):
    """Rotary embedding (float64) with one deliberate mistake switched on."""
    x = x.double()
    L, d = x.shape[-2], x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    power = {"2i": 2 * i / d, "i": i / d}[exponent]
    theta = base ** (-power)                                                 # (d/2,)
    angle = (torch.arange(L, dtype=torch.float64) + offset).unsqueeze(1) * theta * sign  # (L, d/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if halves:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    if repeat:  # each column gets the angle of pair (col mod d/2): .repeat(2) for .repeat_interleave(2)
        cos_full, sin_full = cos.repeat(1, 2), sin.repeat(1, 2)
    else:
        cos_full, sin_full = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    rot = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)     # (-x1, x0) per pair
    return x * cos_full + rot * sin_full


def _rope_base(call):
    if "base" in call.kwargs:
        return float(call.kwargs["base"])
    return float(call.args[1]) if len(call.args) > 1 else 10000.0


def _rope_model(**kw):
    return lambda c: _rope(c.args[0], _rope_base(c), **kw)


HINTS = {
    "sinusoidal_positional_encoding": Hints(
        tuple(Mistake(text, lambda c, kw=kw: _table(*_table_args(c), **kw)) for kw, text in _TABLE_MISTAKES),
        correct=lambda c: _table(*_table_args(c)), explain=EXPLAIN["sinusoidal_positional_encoding"]),
    "SinusoidalPositionalEncoding": Hints(
        tuple(Mistake(text, _with_table(kw)) for kw, text in _TABLE_MISTAKES) + (
            Mistake("forward returns the table alone: return x + pe[:L]",
                    _with_table({}, lambda x, pe: pe.expand_as(x))),
            Mistake("x is scaled by sqrt(d_model): forward returns x + pe[:L], x unscaled",
                    _with_table({}, lambda x, pe: x * math.sqrt(x.shape[-1]) + pe)),
            Mistake("positions start at 0: add pe[:L], the rows 0 … L-1", _with_table({}, offset=1)),
        ), correct=_with_table({}), explain=EXPLAIN["SinusoidalPositionalEncoding"]),
    "LearnedPositionalEmbedding": Hints((
        Mistake("forward returns the embedding alone: return x + embedding(positions)",
                lambda c: _embedding(c).expand_as(c.args[0])),
        Mistake("positions start at 0: embed torch.arange(L) (0 … L-1), not 1 … L",
                lambda c: _x(c) + _embedding(c, offset=1)),
    ), correct=lambda c: _x(c) + _embedding(c), explain=EXPLAIN["LearnedPositionalEmbedding"]),
    "apply_rotary_embedding": Hints((
        Mistake("the first half is rotated against the second half (GPT-NeoX style); the contract rotates "
                "interleaved pairs (x[..., 2i], x[..., 2i+1])", _rope_model(halves=True)),
        Mistake("the rotation goes the wrong way: (x0, x1) becomes (x0 cos θ − x1 sin θ, x0 sin θ + x1 cos θ)",
                _rope_model(sign=-1.0)),
        Mistake("the frequency exponent is i/d: the pair i rotates by p · base^(-2i/d)", _rope_model(exponent="i")),
        Mistake("the two entries of a pair must share one angle: expand the d/2 angles with "
                "repeat_interleave(2), not repeat(2)", _rope_model(repeat=True)),
        Mistake("positions start at 0 (the first row is not rotated), not at 1", _rope_model(offset=1)),
        Mistake("the `base` argument is ignored: the angle of pair i is p · base^(-2i/d)",
                lambda c: _rope(c.args[0], 10000.0), when=lambda c: _rope_base(c) != 10000.0),
    ), correct=_rope_model(), explain=EXPLAIN["apply_rotary_embedding"]),
}

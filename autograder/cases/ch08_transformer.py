"""Chapter 8: MultiHeadAttention (chapter 3's, same cases), FeedForward, TransformerBlock and
TinyTransformer.

Every parameter gets its own random values (LayerNorm weights and biases included, so a block
that skips a LayerNorm or swaps ln_1 and ln_2 shows); the reference's weights are loaded by name.
The cases cover leading dimensions (FeedForward), masks of every layout chapter 3 knows, dropout
in eval mode (it must be off) and in training mode with p = 0, float32, unbatched-free shapes
the contract names, L < max_len (positions start at 0), L > max_len (ValueError), and one to
three blocks (every block's weights returned, every block masked).
"""
from __future__ import annotations

import dataclasses
import math
from functools import partial

import torch

from .inputs import bool_mask, distinct_state, float_mask, randn
from . import Hints, Mistake, call
from . import ch03_multi_head_attention as ch03
from ..selfcheck.rules import ch08_transformer as rules


def cases(exercise, gen, ref, quick):
    if exercise == "MultiHeadAttention":
        return ch03._mha_cases(gen, ref, quick)
    if exercise == "FeedForward":
        return _ff_cases(gen, ref, quick)
    if exercise == "TransformerBlock":
        return _block_cases(gen, ref, quick)
    if exercise == "TinyTransformer":
        return _tiny_cases(gen, ref, quick)
    raise KeyError(exercise)


FF_DROPOUT_P = 0.25
BLOCK_DROPOUT_P = 0.25


def compare(call, student, expected, notes=None):
    """The chapter's comparison (`selfcheck.rules.ch08_transformer.compare`), with what its
    training-mode dropout properties need of the models (`dropout_probe`)."""
    return rules.compare(call, student, expected, notes, probe=dropout_probe(call))


def dropout_probe(call) -> dict | None:
    """What the training-mode dropout properties compare with, computed by the mistake-free models
    (None for any other call): FeedForward's eval-mode output; TransformerBlock's two possible
    h = x + a (its one attention weight dropped or kept) and ff(ln_2(h)) / (1-p) for each."""
    if not (call.train and (call.init or {}).get("dropout")):
        return None
    p = float(call.init["dropout"])
    if call.exercise == "FeedForward":
        return {"eval_out": _ff_model(call)[0]}
    if call.exercise != "TransformerBlock":
        return None
    st, x = _state(call), call.args[0].double()                   # x (B, 1, E)
    v = _lin(_ln(x, st, "ln_1"), st, "attn.v_proj")
    bias = st.get("attn.out_proj.bias", torch.zeros(x.shape[-1], dtype=torch.float64))
    options = [x + bias, x + _lin(v / (1 - p), st, "attn.out_proj")]  # weight dropped, or kept
    ff = [torch.stack([_ff(_ln(h[b], st, "ln_2"), st, "ff.") / (1 - p) for b in range(h.shape[0])])
          for h in options]
    return {"options": options, "ff": ff}


def causal(L):
    return torch.ones(L, L, dtype=torch.bool).tril()


def tokens(gen, *shape, vocab):
    return torch.randint(vocab, shape, generator=gen)


# ----------------------------------------------------------------------------- FeedForward
def _ff_call(name, gen, cls, *, E, hidden, shape, dropout=None, train=False, dtype="float64"):
    init = {"embed_dim": E, "hidden_dim": hidden}
    if dropout is not None:
        init["dropout"] = dropout
    state = distinct_state(cls(**init), gen)
    random = train and bool(dropout)  # (random values: graded by properties, no gradients)
    return call(name, randn(gen, *shape, E, scale=2.0), init=init, state=state, train=train,
                grad=[] if random else ["args.0", "params"], dtype=dtype)


def _ff_cases(gen, ref, quick):
    cls = ref["FeedForward"]
    cs = [
        _ff_call("x (B=2, L=5, E=8), hidden_dim=32", gen, cls, E=8, hidden=32, shape=(2, 5)),
        _ff_call("one position x (E=6,), hidden_dim=10 (any leading dims)", gen, cls, E=6, hidden=10, shape=()),
        _ff_call("dropout=0.5 in eval mode: dropout must be off", gen, cls, E=8, hidden=16, shape=(2, 3),
                 dropout=0.5),
    ]
    train = lambda: _ff_call(f"dropout={FF_DROPOUT_P} in training mode: the output dropped and rescaled, once",  # noqa: E731
                             gen, cls, E=16, hidden=24, shape=(8, 16), dropout=FF_DROPOUT_P, train=True)
    if quick:
        return cs + [train()]
    return cs + [
        _ff_call("four leading dims (2, 1, 3, 2), E=5, hidden_dim=7", gen, cls, E=5, hidden=7, shape=(2, 1, 3, 2)),
        _ff_call("dropout=0.0 in training mode", gen, cls, E=6, hidden=12, shape=(2, 4), dropout=0.0, train=True),
        _ff_call("hidden_dim < embed_dim (E=12, hidden_dim=4)", gen, cls, E=12, hidden=4, shape=(3, 2)),
        _ff_call("float32, x (2, 6, 16), hidden_dim=64", gen, cls, E=16, hidden=64, shape=(2, 6), dtype="float32"),
        train(),
    ]


# ----------------------------------------------------------------------------- TransformerBlock
def _block_call(name, gen, cls, *, E, H, hidden, B=2, L=5, mask=None, dropout=None, train=False,
                dtype="float64", scale=1.0):
    init = {"embed_dim": E, "num_heads": H, "hidden_dim": hidden}
    if dropout is not None:
        init["dropout"] = dropout
    state = distinct_state(cls(**init), gen)
    kwargs = {"mask": mask} if mask is not None else {}
    g = ["args.0", "params"] + (["kwargs.mask"] if mask is not None and mask.is_floating_point() else [])
    return call(name, randn(gen, B, L, E, scale=scale), init=init, state=state, kwargs=kwargs, train=train,
                grad=g, dtype=dtype)


def _block_cases(gen, ref, quick):
    cls = ref["TransformerBlock"]
    cs = [
        _block_call("B=2, L=5, E=8, 2 heads, hidden_dim=16, causal mask (L, L)", gen, cls, E=8, H=2,
                    hidden=16, mask=causal(5), scale=2.0),
        _block_call("no mask, B=3, L=4, E=12, 3 heads, hidden_dim=24", gen, cls, E=12, H=3, hidden=24, B=3, L=4),
        _block_call("dropout=0.5 in eval mode: dropout must be off; padding mask (B, 1, 1, L)", gen, cls,
                    E=8, H=4, hidden=8, L=6, dropout=0.5, mask=bool_mask(gen, 2, 1, 1, 6, p=0.3, full_rows=0)),
    ]

    def rule_cases():  # (last in both lists, so the cases before keep their inputs)
        return [
            _block_call("bool mask (L, L) with a fully masked row, E=8, 2 heads", gen, cls, E=8, H=2, hidden=16,
                        L=4, mask=bool_mask(gen, 4, 4, full_rows=1)),
            _block_call("additive float mask (B, 1, L, L) with a fully -inf row", gen, cls, E=6, H=3, hidden=12,
                        L=4, mask=float_mask(gen, 2, 1, 4, 4, full_rows=1)),
            # (random values: graded by block_dropout_properties, no gradients)
            dataclasses.replace(_block_call(
                f"dropout={BLOCK_DROPOUT_P} in training mode, 64 sequences of one position, one head: dropout on "
                "the attention weights and on the feed-forward output only", gen, cls, E=8, H=1, hidden=16, B=64,
                L=1, dropout=BLOCK_DROPOUT_P, train=True), grad=[]),
        ]

    if quick:
        return cs + rule_cases()
    return cs + [
        _block_call("bool mask (L, L) with a fully masked row", gen, cls, E=6, H=2, hidden=12, L=5,
                    mask=bool_mask(gen, 5, 5, full_rows=1)),
        _block_call("additive float mask (B, H, L, L)", gen, cls, E=8, H=2, hidden=16, L=4,
                    mask=float_mask(gen, 2, 2, 4, 4)),
        _block_call("dropout=0.0 in training mode", gen, cls, E=8, H=2, hidden=16, L=5, dropout=0.0, train=True,
                    mask=causal(5)),
        _block_call("one head, L=1, E=4, hidden_dim=4", gen, cls, E=4, H=1, hidden=4, L=1),
        _block_call("float32, B=2, L=7, E=16, 4 heads, causal", gen, cls, E=16, H=4, hidden=32, L=7,
                    mask=causal(7), dtype="float32"),
    ] + rule_cases()


# ----------------------------------------------------------------------------- TinyTransformer
def _tiny_call(name, gen, cls, *, vocab, max_len, E, H, layers, hidden, B=2, L=5, mask=None, dropout=None,
               train=False, dtype="float64", expect_error=None):
    init = {"vocab_size": vocab, "max_len": max_len, "embed_dim": E, "num_heads": H, "num_layers": layers,
            "hidden_dim": hidden}
    if dropout is not None:
        init["dropout"] = dropout
    state = distinct_state(cls(**init), gen)
    for k in state:  # embeddings at the scale nn.Embedding starts from, so they matter
        if k.endswith("_emb.weight"):
            state[k] = state[k] * math.sqrt(E)
    kwargs = {"mask": mask} if mask is not None else {}
    return call(name, tokens(gen, B, L, vocab=vocab), init=init, state=state, kwargs=kwargs, train=train,
                grad=[] if expect_error else ["params"], dtype=dtype, expect_error=expect_error)


TINY_DROPOUT_P = 0.5


def _silent_blocks(c):
    """TinyTransformer in training mode, with every block's out_proj and fc2 zero: each block
    then adds nothing to the residual stream whatever its dropout drops (the contract's dropout
    acts on the attention weights and on fc2's output only), so the logits are deterministic and
    equal the eval-mode ones. Dropout anywhere else (on the embeddings, as GPT-2 and nanoGPT
    have it; on the residual stream; after ln_f) changes them. No gradients: those of the zeroed
    layers depend on the random draw."""
    state = {k: (torch.zeros_like(v) if ".attn.out_proj." in k or ".ff.fc2." in k else v)
             for k, v in c.state.items()}
    return dataclasses.replace(c, state=state, grad=[])


def _tiny_cases(gen, ref, quick):
    cls = ref["TinyTransformer"]
    cs = [
        _tiny_call("2 blocks, causal mask, vocab 11, L=6 < max_len=9, E=8, 2 heads", gen, cls, vocab=11,
                   max_len=9, E=8, H=2, layers=2, hidden=16, L=6, mask=causal(6)),
        _tiny_call("1 block, no mask, L = max_len = 4, vocab 7, E=6, 3 heads", gen, cls, vocab=7, max_len=4,
                   E=6, H=3, layers=1, hidden=12, L=4),
        _tiny_call("L=7 > max_len=5: ValueError", gen, cls, vocab=5, max_len=5, E=4, H=2, layers=1, hidden=8,
                   L=7, expect_error="ValueError"),
    ]

    def rule_cases():  # (last in both lists, so the cases before keep their inputs)
        return [_tiny_call("2 blocks, mask (L, L) with a fully masked row: finite logits and gradients", gen, cls,
                           vocab=8, max_len=6, E=8, H=2, layers=2, hidden=16, L=5,
                           mask=bool_mask(gen, 5, 5, full_rows=1)),
                _silent_blocks(_tiny_call(
                    f"dropout={TINY_DROPOUT_P} in training mode, blocks whose out_proj and fc2 are zero: dropout acts "
                    "inside the blocks only, so the logits are the eval-mode ones", gen, cls, vocab=9, max_len=8, E=8,
                    H=2, layers=2, hidden=16, B=3, L=6, dropout=TINY_DROPOUT_P, mask=causal(6), train=True))]

    if quick:
        return cs + rule_cases() + [
            _tiny_call("dropout=0.5 in eval mode, 1 block: dropout must be off", gen, cls, vocab=6, max_len=5, E=4,
                       H=2, layers=1, hidden=8, L=5, dropout=0.5, mask=causal(5))]
    return cs + [
        _tiny_call("3 blocks, padding mask (B, 1, 1, L), every block's weights returned", gen, cls, vocab=9,
                   max_len=8, E=8, H=2, layers=3, hidden=8, B=3, L=5,
                   mask=bool_mask(gen, 3, 1, 1, 5, p=0.3, full_rows=0)),
        _tiny_call("dropout=0.5 in eval mode, 2 blocks, causal", gen, cls, vocab=6, max_len=6, E=8, H=4,
                   layers=2, hidden=16, L=6, dropout=0.5, mask=causal(6)),
        _tiny_call("dropout=0.0 in training mode, 2 blocks", gen, cls, vocab=10, max_len=12, E=8, H=2, layers=2,
                   hidden=16, L=3, dropout=0.0, train=True),
        _tiny_call("float32, 2 blocks, causal, L=8 < max_len=16", gen, cls, vocab=13, max_len=16, E=16, H=4,
                   layers=2, hidden=32, L=8, mask=causal(8), dtype="float32"),
    ] + rule_cases()


# ----------------------------------------------------------------------------- hints
# Plain-torch mistake models (float64): each recomputes a block or a whole model with one named
# mistake. A hint is given only where the mistake-free model reproduces the reference and
# exactly one mistake reproduces the student's output (the engine's rule, cases.model_hint).
def _ln(x, st, name):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], st[f"{name}.weight"], st[f"{name}.bias"], 1e-5)


def _lin(x, st, name):
    y = x @ st[f"{name}.weight"].T
    b = st.get(f"{name}.bias")
    return y if b is None else y + b


def _ff(x, st, prefix="", act="erf"):
    h = _lin(x, st, prefix + "fc1")
    h = {"erf": lambda t: torch.nn.functional.gelu(t),
         "tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
         "relu": torch.relu}[act](h)
    return _lin(h, st, prefix + "fc2")


def _mha(x, st, prefix, H, mask, full_rows="zero"):
    q, k, v = (ch03._split(_lin(x, st, prefix + n), H) for n in ("q_proj", "k_proj", "v_proj"))
    o, w = ch03._attend(q, k, v, mask, full_rows=full_rows)
    return _lin(ch03._merge(o), st, prefix + "out_proj"), w


def _block(x, st, prefix, H, mask, order="pre", res_attn=True, res_ff=True, act="erf", swap_ln=False,
           full_rows="zero"):
    ln1, ln2 = ("ln_2", "ln_1") if swap_ln else ("ln_1", "ln_2")
    if order == "post":
        a, w = _mha(x, st, prefix + "attn.", H, mask)
        h = _ln(x + a, st, prefix + ln1)
        return _ln(h + _ff(h, st, prefix + "ff.", act), st, prefix + ln2), w
    a, w = _mha(_ln(x, st, prefix + ln1), st, prefix + "attn.", H, mask, full_rows)
    h = x + a if res_attn else a
    f = _ff(_ln(h, st, prefix + ln2), st, prefix + "ff.", act)
    return (h + f if res_ff else f), w


def _state(call):
    return {k: v.double() for k, v in call.state.items()}


def _mask(call):
    m = call.kwargs.get("mask")
    return m.double() if m is not None and m.is_floating_point() else m


def _ff_model(call, act="erf"):
    return [_ff(call.args[0].double(), _state(call), "", act)]


def _block_model(call, **kw):
    return list(_block(call.args[0].double(), _state(call), "", call.init["num_heads"], _mask(call), **kw))


def _tiny_model(call, pos_from=0, final_ln=True, mask_every=True, scale_emb=False, **kw):
    st, mask, toks = _state(call), _mask(call), call.args[0]
    L = toks.shape[-1]
    x = st["tok_emb.weight"][toks] * (math.sqrt(st["tok_emb.weight"].shape[1]) if scale_emb else 1.0)
    x = x + st["pos_emb.weight"][torch.arange(pos_from, pos_from + L)]
    ws = []
    for i in range(call.init["num_layers"]):
        x, w = _block(x, st, f"blocks.{i}.", call.init["num_heads"], mask if (mask_every or i == 0) else None, **kw)
        ws.append(w)
    if final_ln:
        x = _ln(x, st, "ln_f")
    return [_lin(x, st, "head")] + ws


_FULLY_MASKED_IN_A_BLOCK = ("a query whose keys are all masked gives NaN in the attention (softmax of all -inf), and "
                            "the residual stream carries it on through the LayerNorms (and the head): give such rows "
                            "zero weights (masked_fill after the softmax), as chapter 3's MultiHeadAttention does")
BLOCK_MISTAKES = [
    ("post-LN order: this block is pre-LayerNorm (GPT-2), a = attn(ln_1(x)), h = x + a, "
     "out = h + ff(ln_2(h)); not ln_1(x + attn(x))", dict(order="post")),
    ("the attention's residual connection is missing: h = x + a, not h = a", dict(res_attn=False)),
    ("the feed-forward's residual connection is missing: out = h + ff(ln_2(h))", dict(res_ff=False)),
    ("ln_1 and ln_2 are swapped: ln_1 goes before the attention, ln_2 before the feed-forward",
     dict(swap_ln=True)),
    ("the feed-forward layer uses the tanh approximation of GELU: use the exact (erf) GELU, "
     "F.gelu(x) or nn.GELU()", dict(act="tanh")),
    ("the feed-forward layer uses ReLU: the contract's activation is the exact GELU, F.gelu(x)",
     dict(act="relu")),
    (_FULLY_MASKED_IN_A_BLOCK, dict(full_rows="nan")),
]
TINY_MISTAKES = BLOCK_MISTAKES + [
    ("the positions start at 1: the first token gets pos_emb(0), so positions are torch.arange(L)",
     dict(pos_from=1)),
    ("the final LayerNorm is missing: logits = head(ln_f(x))", dict(final_ln=False)),
    ("only the first block gets the mask: pass the same mask to every block", dict(mask_every=False)),
    ("the token embeddings are scaled by sqrt(embed_dim): this model adds tok_emb(tokens) and "
     "pos_emb(positions) as they are", dict(scale_emb=True)),
]
FF_MISTAKES = [
    ("tanh GELU: use the exact (erf) GELU, F.gelu(x) (not approximate='tanh')", dict(act="tanh")),
    ("ReLU instead of GELU: use the exact GELU, F.gelu(x)", dict(act="relu")),
]


def _hints(model, mistakes, explain=None, fully_masked=None):
    return Hints(correct=model, explain=explain, fully_masked=fully_masked,
                 mistakes=tuple(Mistake(text, partial(model, **kw)) for text, kw in mistakes))


HINTS = {
    "MultiHeadAttention": ch03.HINTS["MultiHeadAttention"],  # the pasted chapter 3 module, its hints
    "FeedForward": _hints(_ff_model, FF_MISTAKES),
    "TransformerBlock": _hints(_block_model, BLOCK_MISTAKES, fully_masked=_FULLY_MASKED_IN_A_BLOCK),
    "TinyTransformer": _hints(_tiny_model, TINY_MISTAKES, rules.EXPLAIN["TinyTransformer"], fully_masked=_FULLY_MASKED_IN_A_BLOCK),
}

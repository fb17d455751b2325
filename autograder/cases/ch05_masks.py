"""Chapter 5: causal_mask, padding_mask and decoder_mask.

Masks are boolean and compared exactly. causal_mask gets the call's device through the
"$device" placeholder, so the portability test (meta device, or CUDA) checks that the `device`
argument is honoured; padding_mask and decoder_mask must follow their tokens' device.
Tokens are integer tensors (the executor leaves their dtype alone); padding sits at the end, at
the start and in the middle, and a non-default pad_id is used where 0 is an ordinary token.
"""
from __future__ import annotations

import torch

from . import Hints, Mistake, call
from ..selfcheck.rules.ch05_masks import EXPLAIN, _pad_id

DEVICE = "$device"


def cases(exercise, gen, ref, quick):
    if exercise == "causal_mask":
        return _causal_cases(quick)
    if exercise == "padding_mask":
        return _token_cases(gen, quick, name="padding_mask")
    if exercise == "decoder_mask":
        return _token_cases(gen, quick, name="decoder_mask")
    raise KeyError(exercise)


def _causal_cases(quick):
    cs = [
        call("seq_len=5, device given", 5, kwargs={"device": DEVICE}),
        call("seq_len=1", 1, kwargs={"device": DEVICE}),
    ]
    if quick:
        return cs
    return cs + [
        call("seq_len=8, no device argument (the CPU)", 8),
        call("seq_len=13, device given positionally", 13, DEVICE),
        call("seq_len=2", 2, kwargs={"device": DEVICE}),
    ]


def tokens(gen, B: int, L: int, pads: list, pad_id: int = 0, dtype=torch.int64) -> torch.Tensor:
    """Random token ids in [0, 20) other than pad_id, with pad_id written at the positions listed
    per row (`pads[b]`, a list of positions). When pad_id != 0, every row with a real token holds
    a 0 too, so an implementation that ignores pad_id (compares with 0) shows."""
    t = torch.randint(0, 19, (B, L), generator=gen)
    t = t + (t >= pad_id).long()  # skip pad_id itself
    for b, positions in enumerate(pads):
        real = [p for p in range(L) if p not in positions]
        if pad_id != 0 and real:
            t[b, real[int(torch.randint(len(real), (1,), generator=gen))]] = 0
        for p in positions:
            t[b, p] = pad_id
    return t.to(dtype)


def _token_cases(gen, quick, name):
    cs = [
        call("tokens (2, 6), pad_id=0, padding at the end of one row",
             tokens(gen, 2, 6, [[], [4, 5]])),
        call("pad_id=1 (0 is an ordinary token), tokens (3, 5), padding at the end",
             tokens(gen, 3, 5, [[3, 4], [], [2, 3, 4]], pad_id=1), kwargs={"pad_id": 1}),
        call("left padding and padding in the middle, tokens (2, 7)",
             tokens(gen, 2, 7, [[0, 1, 2], [3, 5]])),
    ]
    if quick:
        return cs
    return cs + [
        call("a row without padding and a row of padding only, tokens (3, 4)",
             tokens(gen, 3, 4, [[], [0, 1, 2, 3], [3]])),
        call("pad_id=5 given positionally, tokens (2, 6)",
             tokens(gen, 2, 6, [[5], [1, 4, 5]], pad_id=5), 5),
        call("B = 1, L = 1, one real token", tokens(gen, 1, 1, [[]])),
        call("int32 tokens (4, 3)", tokens(gen, 4, 3, [[2], [], [1, 2], [0, 1, 2]], dtype=torch.int32)),
        call("tokens (3, 9), pad_id=2, ragged right padding",
             tokens(gen, 3, 9, [[6, 7, 8], [8], list(range(1, 9))], pad_id=2), kwargs={"pad_id": 2}),
    ]


# ----------------------------------------------------------------------------- hints


def _tril(L, diagonal=0):
    return torch.tril(torch.ones(L, L, dtype=torch.bool), diagonal)


def _decoder(how):
    """decoder_mask with the parts combined by how(key_pad (B,1,1,L), query_pad (B,1,L,1),
    causal (L, L), tokens), expanded to (B, 1, L, L)."""
    def model(call):
        tok = call.args[0]
        B, L = tok.shape
        keep = tok != _pad_id(call)
        return how(keep[:, None, None, :], keep[:, None, :, None], _tril(L), tok).expand(B, 1, L, L)
    return model


_ON_QUERIES = _decoder(lambda k, q, c, t: q & c)
_ON_BOTH = _decoder(lambda k, q, c, t: q & k & c)


def _left_padding(call) -> bool:
    """Whether masking padded query rows and masking padded queries instead of keys differ here
    (they do not with right padding only)."""
    return not torch.equal(_ON_QUERIES(call), _ON_BOTH(call))


HINTS = {
    "causal_mask": Hints((
        Mistake("the mask is inverted: True means 'may attend', so True on and below the diagonal "
                "(torch.tril), False above it", lambda c: ~_tril(int(c.args[0]))),
        Mistake("the upper triangle is True: a query may attend to itself and to earlier keys, so use "
                "the lower triangle (torch.tril)", lambda c: _tril(int(c.args[0])).T),
        Mistake("the diagonal must be True: each position may attend to itself (torch.tril with diagonal=0)",
                lambda c: _tril(int(c.args[0]), -1)),
    ), correct=lambda c: _tril(int(c.args[0])), explain=EXPLAIN["causal_mask"]),
    "padding_mask": Hints((
        Mistake("the mask is inverted: True where the token is NOT padding (True = may attend)",
                lambda c: (c.args[0] == _pad_id(c))[:, None, None, :]),
        Mistake("the pad_id argument is ignored: compare the tokens with pad_id, not with 0",
                lambda c: (c.args[0] != 0)[:, None, None, :], when=lambda c: _pad_id(c) != 0),
    ), correct=lambda c: (c.args[0] != _pad_id(c))[:, None, None, :],
        explain=EXPLAIN["padding_mask"]),
    # With right padding, masking padded query rows and masking padded queries instead of keys
    # give the same mask: the first message is true of both, the second is looked for only where
    # they differ.
    "decoder_mask": Hints((
        Mistake("the masks are combined with OR: a key must be both real and not in the future, so use AND (&)",
                _decoder(lambda k, q, c, t: k | c)),
        Mistake("the mask is inverted: True means 'may attend'", _decoder(lambda k, q, c, t: ~(k & c))),
        Mistake("the padding is missing: AND the causal mask with padding_mask(tokens, pad_id)",
                _decoder(lambda k, q, c, t: c.expand(k.shape[0], 1, *c.shape))),
        Mistake("the causal part is missing: AND the padding mask with causal_mask(L)",
                _decoder(lambda k, q, c, t: k.expand(-1, -1, c.shape[0], -1))),
        Mistake("padded query rows are masked too: the padding masks the keys (last axis) only, "
                "padding_mask (B, 1, 1, L) & causal_mask (L, L)", _ON_BOTH),
        Mistake("the padding is applied to the query rows instead of the key columns: padding_mask is "
                "(B, 1, 1, L), masking keys (the last axis)", _ON_QUERIES, when=_left_padding),
        Mistake("the causal part is the upper triangle: a query may attend to itself and earlier keys (torch.tril)",
                _decoder(lambda k, q, c, t: k & c.T)),
        Mistake("the diagonal of the causal part must be True: each position may attend to itself",
                _decoder(lambda k, q, c, t: k & torch.tril(c, -1))),
        Mistake("the pad_id argument is ignored: compare the tokens with pad_id, not with 0",
                _decoder(lambda k, q, c, t: (t != 0)[:, None, None, :] & c), when=lambda c: _pad_id(c) != 0),
    ), correct=_decoder(lambda k, q, c, t: k & c),
        explain=EXPLAIN["decoder_mask"]),
}

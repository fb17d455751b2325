"""Chapter 5: causal_mask, padding_mask and decoder_mask.

Masks are boolean and compared exactly. causal_mask gets the call's device through the
"$device" placeholder, so the portability test (meta device, or CUDA) checks that the `device`
argument is honoured; padding_mask and decoder_mask must follow their tokens' device.
Tokens are integer tensors (the executor leaves their dtype alone); padding sits at the end, at
the start and in the middle, and a non-default pad_id is used where 0 is an ordinary token.
"""
from __future__ import annotations

import torch

from . import call

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
    ]
    if quick:
        return cs
    return cs + [
        call("a row without padding and a row of padding only, tokens (3, 4)",
             tokens(gen, 3, 4, [[], [0, 1, 2, 3], [3]])),
        call("left padding and padding in the middle, tokens (2, 7)",
             tokens(gen, 2, 7, [[0, 1, 2], [3, 5]])),
        call("pad_id=5 given positionally, tokens (2, 6)",
             tokens(gen, 2, 6, [[5], [1, 4, 5]], pad_id=5), 5),
        call("B = 1, L = 1, one real token", tokens(gen, 1, 1, [[]])),
        call("int32 tokens (4, 3)", tokens(gen, 4, 3, [[2], [], [1, 2], [0, 1, 2]], dtype=torch.int32)),
        call("tokens (3, 9), pad_id=2, ragged right padding",
             tokens(gen, 3, 9, [[6, 7, 8], [8], list(range(1, 9))], pad_id=2), kwargs={"pad_id": 2}),
    ]


# ----------------------------------------------------------------------------- hints
def _pad_id(call) -> int:
    if "pad_id" in call.kwargs:
        return int(call.kwargs["pad_id"])
    return int(call.args[1]) if len(call.args) > 1 else 0


def _shape(student):
    if student.meta and "shape" in student.meta[0]:
        return tuple(student.meta[0]["shape"])
    return None


def _student_mask(student):
    if not student.outputs or student.outputs[0] is None:
        return None
    return student.outputs[0]


def _same(a, b) -> bool:
    return a is not None and tuple(a.shape) == tuple(b.shape) and bool((a.bool() == b).all())


_DTYPE = ("return a boolean mask (dtype=torch.bool), True where attention is allowed: not 0/1 "
          "integers and not an additive 0/-inf float mask")


def causal_hint(call, student, expected, mismatch):
    if mismatch.aspect == "dtype":
        return _DTYPE
    if mismatch.aspect == "device":
        return "create the mask on the requested device: torch.ones(L, L, dtype=torch.bool, device=device)"
    got = _student_mask(student)
    if mismatch.aspect != "values" or got is None:
        return None
    L = int(call.args[0])
    ones = torch.ones(L, L, dtype=torch.bool)
    lower = torch.tril(ones)
    if _same(got, ~lower):
        return ("the mask is inverted: True means 'may attend', so True on and below the diagonal "
                "(torch.tril), False above it")
    if _same(got, torch.triu(ones)):
        return ("the upper triangle is True: a query may attend to itself and to earlier keys, so use "
                "the lower triangle (torch.tril)")
    if _same(got, torch.tril(ones, diagonal=-1)):
        return "the diagonal must be True: each position may attend to itself (torch.tril with diagonal=0)"
    return None


def _padding(tokens, pad_id):
    return (tokens != pad_id)[:, None, None, :]   # (B, 1, 1, L)


def _form_hint(student, mismatch, want: tuple, how: str) -> str | None:
    """The hint for a token mask of the wrong dtype or shape; None when neither is the problem."""
    if mismatch.aspect == "dtype":
        return _DTYPE
    shape = _shape(student)
    if mismatch.aspect == "shape" and shape is not None and shape != want:
        return f"the mask has shape {shape}; it must be {how}"
    return None


def padding_hint(call, student, expected, mismatch):
    tok = call.args[0]
    B, L = tok.shape
    pad_id = _pad_id(call)
    form = _form_hint(student, mismatch, (B, 1, 1, L), "(B, 1, 1, L) so it broadcasts over heads and "
                      "query positions: (tokens != pad_id)[:, None, None, :]")
    got = _student_mask(student)
    if form or mismatch.aspect != "values" or got is None:
        return form
    right = _padding(tok, pad_id)
    if _same(got, ~right):
        return "the mask is inverted: True where the token is NOT padding (True = may attend)"
    if pad_id != 0 and _same(got, _padding(tok, 0)):
        return "the pad_id argument is ignored: compare the tokens with pad_id, not with 0"
    return None


def decoder_hint(call, student, expected, mismatch):
    tok = call.args[0]
    B, L = tok.shape
    pad_id = _pad_id(call)
    form = _form_hint(student, mismatch, (B, 1, L, L), "(B, 1, L, L): padding_mask (B, 1, 1, L) & "
                      "causal_mask (L, L) broadcast to it")
    got = _student_mask(student)
    if form or mismatch.aspect != "values" or got is None:
        return form
    keep = tok != pad_id                                   # (B, L)
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool))
    key_pad = keep[:, None, None, :]                       # (B, 1, 1, L)
    query_pad = keep[:, None, :, None]                     # (B, 1, L, 1)
    shape = (B, 1, L, L)
    # With right padding, masking padded query rows and masking padded queries instead of keys
    # give the same mask; the first message is true of both.
    mistakes = [
        ((key_pad | causal).expand(shape),
         "the masks are combined with OR: a key must be both real and not in the future, so use AND (&)"),
        (~(key_pad & causal).expand(shape), "the mask is inverted: True means 'may attend'"),
        (causal.expand(shape), "the padding is missing: AND the causal mask with padding_mask(tokens, pad_id)"),
        (key_pad.expand(shape), "the causal part is missing: AND the padding mask with causal_mask(L)"),
        ((query_pad & key_pad & causal).expand(shape),
         "padded query rows are masked too: the padding masks the keys (last axis) only, "
         "padding_mask (B, 1, 1, L) & causal_mask (L, L)"),
        ((query_pad & causal).expand(shape),
         "the padding is applied to the query rows instead of the key columns: padding_mask is "
         "(B, 1, 1, L), masking keys (the last axis)"),
        ((key_pad & torch.triu(torch.ones(L, L, dtype=torch.bool))).expand(shape),
         "the causal part is the upper triangle: a query may attend to itself and earlier keys (torch.tril)"),
        ((key_pad & torch.tril(torch.ones(L, L, dtype=torch.bool), -1)).expand(shape),
         "the diagonal of the causal part must be True: each position may attend to itself"),
    ]
    if pad_id != 0:
        mistakes.append((((tok != 0)[:, None, None, :] & causal).expand(shape),
                         "the pad_id argument is ignored: compare the tokens with pad_id, not with 0"))
    for cand, text in mistakes:
        if _same(got, cand):
            return text
    return None


def hint(call, student, expected, mismatch):
    return {"causal_mask": causal_hint, "padding_mask": padding_hint,
            "decoder_mask": decoder_hint}[call.exercise](call, student, expected, mismatch)

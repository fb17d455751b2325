"""Chapter 5's hints that no mistake model shows (dtype, device, the mask's shape)."""
from __future__ import annotations


def _pad_id(call) -> int:
    if "pad_id" in call.kwargs:
        return int(call.kwargs["pad_id"])
    return int(call.args[1]) if len(call.args) > 1 else 0


def _shape(student):
    if student.meta and "shape" in student.meta[0]:
        return tuple(student.meta[0]["shape"])
    return None


_DTYPE = ("return a boolean mask (dtype=torch.bool), True where attention is allowed: not 0/1 "
          "integers and not an additive 0/-inf float mask")


def _causal_explain(call, student, expected, mismatch):
    if mismatch.aspect == "dtype":
        return _DTYPE
    if mismatch.aspect == "device":
        return "create the mask on the requested device: torch.ones(L, L, dtype=torch.bool, device=device)"
    return None


def _form_explain(want, how: str):
    """The hint for a token mask of the wrong dtype or shape (want(B, L) is the right shape)."""
    def explain(call, student, expected, mismatch):
        if mismatch.aspect == "dtype":
            return _DTYPE
        shape = _shape(student)
        if mismatch.aspect == "shape" and shape is not None and shape != want(*call.args[0].shape):
            return f"the mask has shape {shape}; it must be {how}"
        return None
    return explain


EXPLAIN = {
    "causal_mask": _causal_explain,
    "padding_mask": _form_explain(lambda B, L: (B, 1, 1, L), "(B, 1, 1, L) so it broadcasts over heads and "
                                  "query positions: (tokens != pad_id)[:, None, None, :]"),
    "decoder_mask": _form_explain(lambda B, L: (B, 1, L, L), "(B, 1, L, L): padding_mask (B, 1, 1, L) & "
                                  "causal_mask (L, L) broadcast to it"),
}

"""Hint rules several chapters share: NaN gradients through a fully masked row."""
from __future__ import annotations

import torch


def fully_masked_row(name: str):
    """A Mistake's `when`: keyword mask `name` has a query with no key left (a boolean row of
    False, or a float row of -inf); only there can a hint about such rows be right."""
    def when(call) -> bool:
        m = call.kwargs.get(name)
        if m is None or m.dim() == 0:
            return False
        dead = ~m if m.dtype == torch.bool else torch.isneginf(m)
        return bool(dead.all(-1).any())
    return when


NAN_TO_NUM = ("nan_to_num after the softmax leaves NaN in the backward pass (the gradient of a row of -inf "
              "scores is NaN): replace the scores of fully masked rows before the softmax, "
              "dead = torch.isneginf(scores).all(-1, keepdim=True); "
              "weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)")


def nan_gradients_explain(name: str = "mask"):
    """An `explain`: the outputs are right but a gradient is NaN on a call with a fully masked
    row (nan_to_num, or masked_fill of NaN, after the softmax)."""
    has_dead_row = fully_masked_row(name)

    def explain(call, student, expected, mismatch):
        if mismatch.aspect == "grads" and has_dead_row(call) and any(
                g is not None and bool(torch.isnan(g).any()) for g in student.grads.values()):
            return NAN_TO_NUM
        return None
    return explain

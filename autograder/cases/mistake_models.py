"""Building blocks of the chapters' mistake models (plain torch, float64): the pieces several
chapters' attention models share, so each chapter states only its own mistakes."""
from __future__ import annotations

import torch

from ..selfcheck.rules.common import fully_masked_row  # noqa: F401  (a `when` of the chapters' models)


def linear(x: torch.Tensor, state: dict, name: str) -> torch.Tensor:
    """nn.Linear `name` of a Call's state dict applied to x (with its bias where it has one)."""
    y = x @ state[f"{name}.weight"].double().T
    b = state.get(f"{name}.bias")
    return y if b is None else y + b.double()


def softmax_weights(scores: torch.Tensor, dim: int = -1, fully_masked: str = "zero") -> torch.Tensor:
    """Attention weights from masked scores (-inf = masked). fully_masked "zero": a query whose
    keys are all masked gets zero weights (the course's convention); "softmax": a plain softmax
    (NaN for such a query, or a uniform average where masked scores were a finite -1e9)."""
    if fully_masked == "softmax":
        return torch.softmax(scores, dim=dim)
    dead = torch.isneginf(scores).all(-1, keepdim=True)  # queries with no key left
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=dim).masked_fill(dead, 0.0)


def given(name: str):
    """A Mistake's `when`: the call passes keyword argument `name`."""
    return lambda call: call.kwargs.get(name) is not None


def bool_given(name: str):
    """A Mistake's `when`: the call passes a boolean keyword argument `name`."""
    return lambda call: call.kwargs.get(name) is not None and call.kwargs[name].dtype == torch.bool


def float_given(name: str):
    """A Mistake's `when`: the call passes a floating-point keyword argument `name`."""
    return lambda call: call.kwargs.get(name) is not None and call.kwargs[name].is_floating_point()


# The most common convention clash in ported code (annotated-transformer, the UvA notebooks,
# minGPT): an additive float mask used as a boolean one.
FLOAT_MASK_AS_BOOL = ("the float mask is read as a boolean one (masked_fill(mask == 0, ...)): a float mask is "
                      "additive, its values are added to the scores (scores + mask, 0 keeps a key, -inf masks "
                      "it); only a boolean mask goes through masked_fill, with False meaning masked out")


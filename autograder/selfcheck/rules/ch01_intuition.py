"""Chapter 1's hints that no mistake model shows (shapes, broadcasting, -inf entries)."""
from __future__ import annotations

import torch


def _dim_of(call) -> int:
    if "dim" in call.kwargs:
        return call.kwargs["dim"]
    return call.args[1] if len(call.args) > 1 else -1


def _x(call):
    return call.args[0].double()


def _softmax_explain(call, student, expected, mismatch) -> str | None:
    if mismatch.aspect == "error" and ("size of tensor" in mismatch.message or "expand" in mismatch.message):
        return ("the maximum or the sum along `dim` does not broadcast back against x: reduce with "
                "keepdim=True (x.max(dim, keepdim=True).values, .sum(dim, keepdim=True))")
    x = _x(call)
    neg_inf = torch.isinf(x) & (x < 0)
    y = student.outputs[0] if student.outputs else None
    if (mismatch.aspect == "values" and y is not None and y.shape == x.shape and neg_inf.any()
            and (y.double()[neg_inf] != 0).any()):
        return "-inf entries must get probability exactly 0 (exp(-inf) = 0); do not replace them"
    return None


def _pool_explain(call, student, expected, mismatch) -> str | None:
    query, keys, values = call.args[:3]
    if mismatch.aspect == "shape" and mismatch.output == 0 and student.meta and "shape" in student.meta[0]:
        got = student.meta[0]["shape"]
        if got and got[-1] == keys.shape[-1] != values.shape[-1]:
            return ("the output has the keys' feature size d: it is the weighted sum of the values, "
                    "(..., d_v)")
    if query.dim() > 1 and (mismatch.aspect == "shape" or mismatch.about_shapes):
        return ("this works without batch dimensions but not with them: use keys @ query.unsqueeze(-1) "
                "(or einsum over the last axis) and weights.unsqueeze(-2) @ values, not .T or fixed "
                "dimension numbers")
    return None


EXPLAIN = {"softmax": _softmax_explain, "attention_pool": _pool_explain}

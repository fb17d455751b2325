"""Chapter 2's hints that no mistake model shows (batch axes, NaN gradients)."""
from __future__ import annotations

import re

from .common import nan_gradients_explain


_nan_gradients = nan_gradients_explain("mask")


_ONE_BATCH_AXIS = re.compile(r"3D|3-dimensional|Dimension out of range|must be a 3D")


def _sdpa_explain(call, student, expected, mismatch):
    """torch.bmm / transpose(1, 2) assume exactly one batch axis (d2l's DotProductAttention);
    NaN gradients from nan_to_num after the softmax."""
    nan_gradients = _nan_gradients(call, student, expected, mismatch)
    if nan_gradients:
        return nan_gradients
    if mismatch.aspect == "error" and call.args and call.args[0].dim() != 3 and student.error \
            and _ONE_BATCH_AXIS.search(student.error.get("message", "")):
        return (f"this case has {call.args[0].dim() - 2} batch axes, and the code assumes exactly one "
                "(torch.bmm, transpose(1, 2)): use q @ k.transpose(-2, -1) and weights @ v, which take any "
                "number of leading batch axes")
    return None


EXPLAIN = {"scaled_dot_product_attention": _sdpa_explain}

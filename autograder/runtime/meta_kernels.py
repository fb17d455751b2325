"""Meta kernels that do what CUDA's kernels do, for the device check (`device_check`).

After `device_check.native_meta_kernels` takes torch's Python meta kernels away, an op with
no C++ meta kernel of its own runs one of these where there is one here, else its C++
composite kernel where that is the one CUDA runs (`composite_is_cudas`), else its Python meta
kernel again. Torch's Python kernels for `where` and `layer_norm` cost 270 and 840 us a call
(the solutions' device check: 129 and 35 calls); these cost a tenth of that. Each gives the
shape, dtype and layout CUDA's kernel gives, and raises where it raises on the inputs' shapes
and dtypes (tests/chapters/test_device_check.py compares them with the CPU's, whose kernels
CUDA's share these rules with). A composite kernel on meta checks less than CUDA's kernels do
(masked_fill: not its mask's dtype): that code fails on the CPU first, and its device row earns
nothing then.
"""
from __future__ import annotations

import torch

_META = torch.device("meta")


def where_self(condition, self, other):
    """`torch.where(condition, self, other)` as CUDA's `where` makes its result: `self` and
    `other` cast to their result type, then a TensorIterator over (condition, self, other),
    whose layout is that of any TensorIterator over three tensors of those shapes and strides:
    addcmul's, which has a C++ meta kernel."""
    if condition.dtype == torch.uint8:
        condition = condition.to(torch.bool)  # (CUDA warns, then does the same)
    torch._check(condition.dtype == torch.bool, lambda: (
        f"where expected condition to be a boolean tensor, but got a tensor with dtype "
        f"{_scalar_name(condition.dtype)}"))
    dtype = torch.result_type(self, other)
    operands = [condition, *(t if t.dtype == dtype else t.to(dtype) for t in (self, other))]
    like = [torch.empty_strided(t.shape, t.stride(), dtype=torch.float32, device=_META) for t in operands]
    layout = torch.addcmul(*like)
    return torch.empty_strided(layout.shape, layout.stride(), dtype=dtype, device=_META)


def native_layer_norm(input, normalized_shape, weight, bias, eps):
    """CUDA's `layer_norm_cuda`: (output, mean, rstd), the output contiguous in the input's
    shape and dtype, mean and rstd of the leading dimensions' shape (1 for each normalised one)
    in the accumulation type (float32 for half precision), after `_check_layer_norm_inputs`'s
    checks and the kernel's own on the weights' dtype."""
    shape = list(normalized_shape)
    torch._check(len(shape) >= 1, lambda: (
        "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one "
        f"element, but got normalized_shape = {shape}"))
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and list(t.shape) != shape:
            raise RuntimeError(f"Expected {name} to be of same shape as normalized_shape, but got {name} "
                               f"of shape {list(t.shape)} and normalized_shape = {shape}")
        if t is not None and t.dtype != input.dtype:
            raise RuntimeError(f"expected scalar type {_scalar_name(input.dtype)} but found {_scalar_name(t.dtype)}")
    axis = input.dim() - len(shape)
    torch._check(axis >= 0 and list(input.shape[axis:]) == shape, lambda: (
        f"Given normalized_shape={shape}, expected input with shape [*, {', '.join(map(str, shape))}], "
        f"but got input of size{list(input.shape)}"))
    acc = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    stats = [*input.shape[:axis], *([1] * len(shape))]
    out = torch.empty(input.shape, dtype=input.dtype, device=_META)
    return out, torch.empty(stats, dtype=acc, device=_META), torch.empty(stats, dtype=acc, device=_META)


def _scalar_name(dtype) -> str:
    """A dtype as ATen's messages name it (Float, Double, Long)."""
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte", torch.bool: "Bool"}.get(dtype, str(dtype).removeprefix("torch."))


KERNELS = {"aten::where.self": (torch.ops.aten.where.self, where_self),
           "aten::native_layer_norm": (torch.ops.aten.native_layer_norm.default, native_layer_norm)}

# Ops whose C++ composite kernel is not the one CUDA runs (native_functions.yaml gives them a
# CUDA kernel of their own), in the torch this project pins: they keep their Python meta
# kernel (tests/chapters/test_device_check.py checks the list against the yaml torch ships).
_OWN_CUDA_KERNEL = frozenset({"aten::_chunk_cat", "aten::_chunk_cat.out", "aten::_foreach_norm.Scalar",
                              "aten::_grouped_mm", "aten::split_with_sizes_copy.out"})
# Ops (all overloads) whose composite kernel calls a helper that has no meta kernel at all
# (`_cummax_helper`, `_logcumsumexp`, ...): on meta that would leave the case unchecked.
_HELPER_WITHOUT_META = frozenset({"cummax", "cummin", "logcumsumexp", "cholesky_solve"})


def composite_is_cudas(name: str) -> bool:
    """Whether the op `name` runs on meta tensors as on CUDA through its C++
    CompositeExplicitAutograd kernel: one kernel for every device, with no CPU kernel of its
    own (nor a CUDA one). masked_fill is such an op: there it takes 11 us where its Python
    meta kernel took 290 us (166 calls in the solutions' device check)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return (name not in _OWN_CUDA_KERNEL and name.removeprefix("aten::").split(".")[0] not in _HELPER_WITHOUT_META
            and has(name, "CompositeExplicitAutograd") and not has(name, "CPU")
            and not has(name, "CUDA"))  # (where torch was built with CUDA, it says so itself)

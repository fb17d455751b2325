"""The device check where no GPU is present: the code runs as if on a GPU.

PyTorch's fake tensors (`torch._subclasses.fake_tensor.FakeTensorMode`) have a device, a shape
and a dtype but no values, and they keep CUDA's device rules: a CPU tensor (other than a 0-dim
scalar) meeting a CUDA tensor in an op raises, as it does on a GPU. The meta device, which this
check replaced, lets a CPU tensor meet a meta one in indexing and broadcasting, so code that
fails on a GPU passed there (an ALiBi whose slopes are made on the CPU, positions made with
`torch.arange(L)` to index an embedding).

What fake CUDA lacks in a CPU-only build of torch is handled here:
- a move to CUDA (`x.to("cuda")`, `.cuda()`, `copy_` across devices, `torch.as_tensor(...,
  device=)`, `new_tensor`) and `~mask` pass through CUDA's device guard in torch's C++ Tensor
  methods, which a CPU build does not link: `_DeviceMoves` rewrites them to the ops fake
  tensors implement (`aten._to_copy`, `bitwise_not`);
- an op whose result depends on values (`.item()`, `if mask.any():`, `nonzero`) cannot run
  without values: such a call is run again on the meta device (`needs_meta`), and the report
  says so (Outcome.device_note).
"""
from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode

FAKE_CUDA = "fake-cuda"   # the device name of the check, in Calls, results and reports
DEVICE_CHECKS = ("meta", FAKE_CUDA)  # device rows judged on shapes, dtypes and devices only

# Errors that say "fake tensors cannot do this", not "this code is wrong on a GPU".
_LIMITS = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
           "UnsupportedFakeTensorException", "GuardOnDataDependentSymNode", "UnsupportedOperatorError")
_LIMIT_MESSAGES = ("not linked with support for cuda", "cannot be called on meta tensors", "couldn't swap",
                   "data-dependent", "data dependent")


def is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def torch_device(device: str) -> str:
    """The torch device a Call's device name stands for."""
    return "cuda" if device == FAKE_CUDA else device


def needs_meta(error: dict | None) -> bool:
    """Whether a fake-CUDA run failed for a reason of fake tensors' own (no values), so the call
    is run again on the meta device. A device mismatch is never one: it is what the check is for."""
    if not error or "DeviceMismatch" in error.get("type", ""):
        return False
    message = error.get("message", "").lower()
    return error.get("type") in _LIMITS or any(m in message for m in _LIMIT_MESSAGES)


UNCHECKED_NOTE = ("not checked: the code's control flow depends on tensor values (`if t.any():`, "
                  "`.item()`), which the device check (fake CUDA, then the meta device) does not have")


def unchecked(outcome) -> bool:
    """Whether a device-check run could run neither on fake CUDA nor on the meta device for want
    of values: such a case is credited with UNCHECKED_NOTE (value-dependent code is no mistake,
    and runs on a real GPU)."""
    return bool(outcome.device_note) and needs_meta(outcome.error)


def _cuda(device) -> torch.device:
    device = torch.device(device)
    return torch.device("cuda", 0) if device.type == "cuda" and device.index is None else device


def _move(t: torch.Tensor, device=None, dtype=None, copy: bool = False) -> torch.Tensor:
    device = t.device if device is None else _cuda(device)
    dtype = t.dtype if dtype is None else dtype
    if device == t.device and dtype == t.dtype and not copy:
        return t
    return torch.ops.aten._to_copy.default(t, dtype=dtype, device=device)


def _to(self, *args, **kwargs):
    copy = kwargs.pop("copy", False)
    if len(args) >= 4 and isinstance(args[3], bool):  # to(device, dtype, non_blocking, copy)
        copy, args = args[3], args[:3]
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    return _move(self, device, dtype, copy)


def _copy_(self, src, non_blocking=False):
    if isinstance(src, torch.Tensor) and src.device != self.device:
        src = _move(src, self.device)
    return torch.Tensor.copy_(self, src)


def _as_tensor(data, dtype=None, device=None):
    t = torch.as_tensor(data, dtype=dtype)
    return t if device is None else _move(t, device)


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False, **_):
    t = torch.tensor(data.detach() if isinstance(data, torch.Tensor) else data,
                     dtype=dtype or self.dtype, device=device if device is not None else self.device)
    return t.requires_grad_(requires_grad)


def _on_cpu(x):
    """x with every fake CUDA tensor in it (an index, a value) moved to the CPU."""
    if isinstance(x, torch.Tensor):
        return _move(x, "cpu") if x.device.type == "cuda" else x
    if isinstance(x, (tuple, list)):
        return type(x)(_on_cpu(v) for v in x)
    return x


def _getitem(self, index):
    # Indexing a CUDA tensor with CPU or CUDA indices is allowed on a GPU; its result is on
    # the tensor's device. Done on the CPU here (the C++ method takes a device guard).
    if self.device.type != "cuda":
        return torch.Tensor.__getitem__(self, index)
    return _move(torch.Tensor.__getitem__(_on_cpu(self), _on_cpu(index)), self.device)


def _setitem(self, index, value):
    if self.device.type != "cuda":
        return torch.Tensor.__setitem__(self, index, value)
    # (fake tensors hold no values: only the shapes are checked, on a CPU twin)
    torch.Tensor.__setitem__(_on_cpu(self), _on_cpu(index), _on_cpu(value))


_MOVES = {
    torch.Tensor.__getitem__: _getitem,
    torch.Tensor.__setitem__: _setitem,
    torch.Tensor.to: _to,
    torch.Tensor.cuda: lambda self, device=None, non_blocking=False, **_: _move(self, device or "cuda"),
    torch.Tensor.cpu: lambda self, **_: _move(self, "cpu"),
    torch.Tensor.copy_: _copy_,
    torch.as_tensor: _as_tensor,
    torch.Tensor.new_tensor: _new_tensor,
    torch.Tensor.__invert__: lambda self: torch.bitwise_not(self),  # (`~mask` takes a device guard)
}


def move_module(module: torch.nn.Module, device: str, dtype: torch.dtype) -> None:
    """`module.to(device=device, dtype=dtype)` for fake tensors: Module.to swaps each parameter
    for its moved copy, which a fake tensor of another device cannot take, so each parameter
    and buffer is replaced by its moved copy instead (floating ones cast to `dtype`)."""
    for sub in module.modules():
        for key, p in sub._parameters.items():
            if p is not None:  # (not `p.detach()`: in the fake mode, that copies a real p into a fake one first)
                moved = _moved_twin(p, device, dtype if p.is_floating_point() else None)
                sub._parameters[key] = torch.nn.Parameter(moved, requires_grad=p.requires_grad)
        for key, b in sub._buffers.items():
            if b is not None:
                sub._buffers[key] = _moved_twin(b, device, dtype if b.is_floating_point() else None)


def _moved_twin(t: torch.Tensor, device, dtype=None) -> torch.Tensor:
    """`t` moved to `device` on fake CUDA: a real tensor's twin is made with its shape and
    strides (its values are not needed, and converting them to a fake tensor costs more)."""
    if is_fake(t) or torch.device(device).type != "cuda":
        return _move(t, device, dtype)
    # laid out as `.to("cuda")` lays it out: its own strides where it is dense (a transpose),
    # else contiguous (an expanded tensor)
    stride = t.stride() if _dense(t) else _contiguous_strides(t.shape)
    return torch.empty_strided(t.shape, stride, dtype=t.dtype if dtype is None else dtype, device=_cuda(device))


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill its storage span exactly once (non-overlapping and dense)."""
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return t.numel() > 0


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class _DeviceMoves(TorchFunctionMode):
    """Routes the moves fake CUDA cannot make itself in a CPU build (see the module's doc).
    Inside a handler this mode is off, so the handlers' own torch calls run as they are."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        run = _MOVES.get(func, func)
        kwargs = kwargs or {}
        hook = sys.getprofile()
        if hook is None or not _torch_only(types, args, kwargs):
            return run(*args, **kwargs)
        # The profile hook (execute._CallRecorder: which prerequisites the student's code
        # calls) is off while torch runs the op: fake tensors' dispatch is Python, and the hook
        # on its every call and C call doubled the device check's cost. No student code runs
        # there (no callable argument, no tensor subclass but torch's own: `_torch_only`).
        sys.setprofile(None)
        try:
            return run(*args, **kwargs)
        finally:
            sys.setprofile(hook)


def _plain_arg(x) -> bool:
    return isinstance(x, torch.Tensor) or not callable(x)


def _torch_only(types, args, kwargs) -> bool:
    """Whether an op's arguments can run no code but torch's: every tensor type is one of
    torch's, and no argument (nor an item of a list or tuple argument) is a callable."""
    for t in types:
        if not t.__module__.startswith("torch."):
            return False
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            if not all(_plain_arg(v) for v in x):
                return False
        elif not _plain_arg(x):
            return False
    return True


class FakeCuda:
    """Run the block as if on a GPU: tensors made on "cuda" are fake CUDA tensors; real
    tensors handed in are made fake (on their own device) when an op meets them."""

    def __enter__(self):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.moves = _DeviceMoves()
        # No autograd graph: its nodes take a CUDA device guard, which a CPU build lacks (and
        # gradients have no values to compare here).
        self.no_grad = torch.no_grad()
        self.no_grad.__enter__()
        self.fake.__enter__()
        self.moves.__enter__()
        return self

    def __exit__(self, *exc):
        self.moves.__exit__(*exc)
        self.fake.__exit__(*exc)
        self.no_grad.__exit__(*exc)
        return False


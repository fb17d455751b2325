"""The device check where no GPU is present: the code runs as if on a GPU.

Tensors "on the GPU" are tensors on PyTorch's meta device (a shape, a dtype and strides, no
values), and every op on them is held to CUDA's device rules (`_CudaRules`): a CPU tensor other
than a 0-dim scalar meeting a GPU tensor in an op raises, as it does on a GPU; a 0-dim CPU
scalar passes, as on a GPU; indexing with CPU indices passes, as on a GPU. The meta device
alone lets a CPU tensor meet a meta one in indexing and broadcasting, so code that fails on a
GPU passed there (an ALiBi whose slopes are made on the CPU, positions made with
`torch.arange(L)` to index an embedding). PyTorch's fake tensors keep the same rules on a
simulated CUDA device, at about three times the cost (their dispatch is Python): this check
replaced them.

The code believes it runs on CUDA: a device the code names as "cuda" (`device="cuda"`,
`x.to("cuda")`, `.cuda()`) is the meta device here (`_DeviceMoves`), and a result on the meta
device is reported as on "cuda". A move to the CPU gives a CPU tensor of zeros (no values exist
to move). An op whose result depends on values (`.item()`, `if mask.any():`, `nonzero`) cannot
run without values: the call is then not checked (`unchecked`), and the report says so.
"""
from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

FAKE_CUDA = "fake-cuda"   # the device name of the check, in Calls, results and reports
DEVICE_CHECKS = ("meta", FAKE_CUDA)  # device rows judged on shapes, dtypes and devices only
_META = torch.device("meta")

# Errors that say "there are no values here", not "this code is wrong on a GPU".
_LIMITS = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
           "UnsupportedFakeTensorException", "GuardOnDataDependentSymNode", "UnsupportedOperatorError")
_LIMIT_MESSAGES = ("not linked with support for cuda", "cannot be called on meta tensors", "couldn't swap",
                   "data-dependent", "data dependent", "data-independent implementation",
                   "cannot copy out of meta tensor")


class DeviceMismatchError(RuntimeError):
    """A CPU tensor met a GPU tensor in an op that CUDA refuses."""


def torch_device(device: str) -> str:
    """The torch device a Call's device name stands for."""
    return "meta" if device == FAKE_CUDA else device


def reported_device(t: torch.Tensor, call_device: str) -> str:
    """The device a result is reported on: on the device check, the meta device is "cuda"."""
    kind = t.device.type
    return "cuda" if kind == "meta" and call_device == FAKE_CUDA else kind


def needs_meta(error: dict | None) -> bool:
    """Whether a device-check run failed for want of values (a reason of the check's own),
    not for a mistake. A device mismatch is never one: it is what the check is for."""
    if not error or "DeviceMismatch" in error.get("type", ""):
        return False
    message = error.get("message", "").lower()
    return error.get("type") in _LIMITS or any(m in message for m in _LIMIT_MESSAGES)


UNCHECKED_NOTE = ("not checked: the code's control flow depends on tensor values (`if t.any():`, "
                  "`.item()`), which the device check (shapes, dtypes and devices, no values) does not have")


def unchecked(outcome) -> bool:
    """Whether a device-check run could not run for want of values: such a case is credited
    with UNCHECKED_NOTE (value-dependent code is no mistake, and runs on a real GPU)."""
    return bool(outcome.device_note) and needs_meta(outcome.error)


def _gpu(device):
    """A device as the check places it: CUDA (the code's own name for the GPU) is the meta device."""
    if device is None or isinstance(device, torch.Tensor):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        return _META  # (a bare index names a CUDA device)
    if isinstance(device, (str, torch.device)):
        device = torch.device(device)
        return _META if device.type == "cuda" else device
    return device


def _move(t: torch.Tensor, device=None, dtype=None, copy: bool = False) -> torch.Tensor:
    device = t.device if device is None else _gpu(device)
    dtype = t.dtype if dtype is None else dtype
    if device == t.device and dtype == t.dtype and not copy:
        return t
    if t.device.type == "meta" and device.type != "meta":  # off the GPU: no values to bring
        return torch.zeros(t.shape, dtype=dtype, device=device)
    return torch.ops.aten._to_copy.default(t, dtype=dtype, device=device)


def _to(self, *args, **kwargs):
    copy = kwargs.pop("copy", False)
    if len(args) >= 4 and isinstance(args[3], bool):  # to(device, dtype, non_blocking, copy)
        copy, args = args[3], args[:3]
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    return _move(self, device, dtype, copy)


def _copy_(self, src, non_blocking=False):
    if isinstance(src, torch.Tensor) and src.device.type == "meta" and self.device.type != "meta":
        return self  # (a copy off the GPU: no values to bring)
    return torch.Tensor.copy_(self, src)


_MOVES = {
    torch.Tensor.to: _to,
    torch.Tensor.cuda: lambda self, device=None, non_blocking=False, **_: _move(self, _META),
    torch.Tensor.cpu: lambda self, **_: _move(self, "cpu"),
    torch.Tensor.copy_: _copy_,
}

# Ops that take tensors of several devices on a GPU: copies, and indexing (CPU indices, values).
_MIXED_OK = frozenset(
    getattr(getattr(torch.ops.aten, name), overload)
    for name, overload in (("_to_copy", "default"), ("copy_", "default"), ("_foreach_copy", "default"),
                           ("lift_fresh", "default"), ("lift_fresh_copy", "default"), ("index", "Tensor"),
                           ("index_put", "default"), ("index_put_", "default"), ("_index_put_impl_", "default"),
                           ("_unsafe_index", "Tensor"), ("_unsafe_index_put", "default"))
    if hasattr(getattr(torch.ops.aten, name, None), overload))  # (the ops this torch has)


def _scalar_on_gpu(x):
    """A 0-dim CPU tensor as the GPU sees it in an op with GPU tensors (a scalar, on its device)."""
    if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() == 0:
        return torch.empty((), dtype=x.dtype, device=_META)
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(_scalar_on_gpu(v) for v in x)
    return x


class _CudaRules(TorchDispatchMode):
    """CUDA's device rules on every op (see the module's doc): an op whose tensors are on the
    GPU (meta) and on the CPU (other than 0-dim scalars) raises, as on a GPU; 0-dim CPU
    scalars in an op with GPU tensors are handed to it on the GPU, as CUDA reads them."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # (torch wraps modes in torch._dynamo.disable unless told: an import of 0.7 s)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _MIXED_OK:
            gpu = cpu = scalars = False
            for x in (*args, *kwargs.values()):
                for t in (x if isinstance(x, (list, tuple)) else (x,)):
                    if isinstance(t, torch.Tensor):
                        if t.device.type == "meta":
                            gpu = True
                        elif t.dim():
                            cpu = True
                        else:
                            scalars = True
            if gpu and cpu:
                raise DeviceMismatchError(
                    "Expected all tensors to be on the same device, but found at least two devices, "
                    f"cuda:0 and cpu! (in {func})")
            if gpu and scalars:
                args = tuple(_scalar_on_gpu(x) for x in args)
                kwargs = {k: _scalar_on_gpu(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def move_module(module: torch.nn.Module, device: str, dtype: torch.dtype) -> None:
    """`module.to(device=device, dtype=dtype)` done parameter by parameter (not with the
    student's own `to` or `_apply`): each parameter and buffer is replaced by its moved copy
    (floating ones cast to `dtype`), laid out as `.to("cuda")` lays it out."""
    for sub in module.modules():
        for key, p in sub._parameters.items():
            if p is not None:
                moved = _move(p.detach(), device, dtype if p.is_floating_point() else None)
                sub._parameters[key] = torch.nn.Parameter(moved, requires_grad=p.requires_grad)
        for key, b in sub._buffers.items():
            if b is not None:
                sub._buffers[key] = _move(b, device, dtype if b.is_floating_point() else None)


class _DeviceMoves(TorchFunctionMode):
    """Places what the code puts on CUDA on the meta device (see the module's doc). Inside a
    handler this mode is off, so the handlers' own torch calls run as they are."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        run = _MOVES.get(func, func)
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _gpu(kwargs["device"])}
        hook = sys.getprofile()
        if hook is None or not _torch_only(types, args, kwargs):
            return run(*args, **kwargs)
        # The profile hook (execute._CallRecorder: which prerequisites the student's code
        # calls) is off while torch runs the op: the rules' dispatch is Python, and the hook on
        # its every call would cost more than the op. No student code runs there (no callable
        # argument, no tensor subclass but torch's own: `_torch_only`).
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


_KERNEL_MODULES = ("torch._refs", "torch._prims", "torch._decomp", "torch._meta_registrations")


def skip_dynamo_import() -> int:
    """Spare the process torch._dynamo's import (0.7 s of CPU, in every sandbox and grader).

    The meta device's Python kernels (torch's references, e.g. of `where` and `add`) are wrapped
    by `torch._disable_dynamo`, which imports torch._dynamo on a function's first call only to
    make its "not to be compiled" twin, `fn.__dynamo_disable`. Nothing here compiles, so each
    of those kernels (`_KERNEL_MODULES`) is given itself as that twin in advance (a scan of the
    process's functions: 0.04 s). Where torch's internals differ (another version), nothing is
    marked and the import happens as before: slower, not wrong. Returns how many were marked."""
    import gc
    import types

    try:
        import torch._compile
        import torch.fx.experimental.symbolic_shapes  # noqa: F401 (the meta device imports it, and
        # with it kernels of its own: marked here too)

        inner = torch._compile._disable_dynamo(lambda: None).__code__
        slot = inner.co_freevars.index("fn")  # (the function the wrapper calls, as it reads it)
    except (ImportError, AttributeError, ValueError):
        return 0
    marked = 0
    for wrapper in gc.get_objects():
        if type(wrapper) is types.FunctionType and wrapper.__code__ is inner:
            kernel = wrapper.__closure__[slot].cell_contents
            if getattr(kernel, "__module__", "").startswith(_KERNEL_MODULES) \
                    and "__dynamo_disable" not in getattr(kernel, "__dict__", {"__dynamo_disable": 0}):
                kernel.__dynamo_disable = kernel
                marked += 1
    return marked


class FakeCuda:
    """Run the block as if on a GPU (see the module's doc): tensors the code puts on "cuda"
    are on the meta device, under CUDA's device rules."""

    marked = False  # skip_dynamo_import done in this process

    def __enter__(self):
        if not FakeCuda.marked:
            skip_dynamo_import()
            FakeCuda.marked = True
        self.rules = _CudaRules()
        self.moves = _DeviceMoves()
        # No autograd graph: gradients have no values to compare here.
        self.no_grad = torch.no_grad()
        self.no_grad.__enter__()
        self.rules.__enter__()
        self.moves.__enter__()
        return self

    def __exit__(self, *exc):
        self.moves.__exit__(*exc)
        self.rules.__exit__(*exc)
        self.no_grad.__exit__(*exc)
        return False

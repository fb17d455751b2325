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
`x.to("cuda")`, `.cuda()`) is the meta device here (`_DeviceMoves`), a GPU tensor says
`is_cuda`, a `device` argument the grader passes is "cuda", and a result on the meta device is
reported as on "cuda". What needs values cannot run without them: a move back to the CPU,
`.item()`, `if mask.any():`, `nonzero`, an op with no meta kernel. The call is then not
checked (`unchecked`), and the report says so.
"""
from __future__ import annotations

import threading

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import meta_kernels

FAKE_CUDA = "fake-cuda"   # the device name of the check, in Calls, results and reports
DEVICE_CHECKS = ("meta", FAKE_CUDA)  # device rows judged on shapes, dtypes and devices only
_META = torch.device("meta")

# Errors that say "there are no values here", not "this code is wrong on a GPU".
_LIMITS = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
           "UnsupportedFakeTensorException", "GuardOnDataDependentSymNode", "UnsupportedOperatorError")
_LIMIT_MESSAGES = ("not linked with support for cuda", "cannot be called on meta tensors", "couldn't swap",
                   "data-dependent", "data dependent", "data-independent implementation",
                   "cannot copy out of meta tensor", "meta kernel", "with meta tensors")


class DeviceMismatchError(RuntimeError):
    """A CPU tensor met a GPU tensor in an op that CUDA refuses."""


def torch_device(device: str) -> str:
    """The torch device a Call's device name stands for."""
    return "meta" if device == FAKE_CUDA else device


def reported_device(t: torch.Tensor, call_device: str) -> str:
    """The device a result is reported on: on the device check, the meta device is "cuda"."""
    kind = t.device.type
    return "cuda" if kind == "meta" and call_device == FAKE_CUDA else kind


def needs_values(error: dict | None) -> bool:
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
    return bool(outcome.device_note) and needs_values(outcome.error)


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
    """`t` on `device` (CUDA: the meta device). Off the GPU, aten refuses: no values to bring."""
    device = t.device if device is None else _gpu(device)
    dtype = t.dtype if dtype is None else dtype
    if device == t.device and dtype == t.dtype and not copy:
        return t
    return torch.ops.aten._to_copy.default(t, dtype=dtype, device=device)


def _to(self, *args, **kwargs):
    copy = kwargs.pop("copy", False)
    if len(args) >= 4 and isinstance(args[3], bool):  # to(device, dtype, non_blocking, copy)
        copy, args = args[3], args[:3]
    device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    moved = _move(self, device, dtype, copy)
    if memory_format is not None and memory_format != torch.preserve_format:
        moved = moved.contiguous(memory_format=memory_format)
    return moved


_MOVES = {
    torch.Tensor.to: _to,
    torch.Tensor.cuda: lambda self, device=None, non_blocking=False, **_: _move(self, _META),
    torch.Tensor.is_cuda.__get__: lambda self: self.device.type in ("cuda", "meta"),
}

def _aten_ops(*names: str) -> frozenset:
    """The aten overloads named "op.overload" that this torch has (another version may lack one)."""
    ops = []
    for name in names:
        packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is not None:
            ops.append(op)
    return frozenset(ops)


# Ops that take tensors of several devices on a GPU: copies, and indexing with CPU indices;
# of these, `_PUTS` take values too, which (other than a 0-dim scalar) must be on the GPU.
_PUTS = _aten_ops("index_put.default", "index_put_.default", "_index_put_impl_.default",
                  "_unsafe_index_put.default")
_MIXED_OK = _PUTS | _aten_ops("_to_copy.default", "copy_.default", "_foreach_copy.default", "lift_fresh.default",
                              "lift_fresh_copy.default", "index.Tensor", "_unsafe_index.Tensor")


def _scalar_on_gpu(x):
    """A 0-dim CPU tensor as the GPU sees it in an op with GPU tensors (a scalar, on its device)."""
    if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() == 0:
        return torch.empty((), dtype=x.dtype, device=_META)
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(_scalar_on_gpu(v) for v in x)
    return x


def _cpu_values(func, args) -> bool:
    """Whether an index_put puts CPU values (other than a 0-dim scalar) into a GPU tensor."""
    if func not in _PUTS or len(args) < 3:
        return False
    self, values = args[0], args[2]
    return (isinstance(self, torch.Tensor) and self.device.type == "meta" and isinstance(values, torch.Tensor)
            and values.device.type == "cpu" and values.dim() > 0)


class _CudaRules(TorchDispatchMode):
    """CUDA's device rules on every op (see the module's doc): an op whose tensors are on the
    GPU (meta) and on the CPU (other than 0-dim scalars) raises, as on a GPU; 0-dim CPU
    scalars in an op with GPU tensors are handed to it on the GPU, as CUDA reads them."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # (torch wraps modes in torch._dynamo.disable unless told: an import of 0.7 s)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _cpu_values(func, args):
            raise DeviceMismatchError(f"Expected all tensors to be on the same device: indices or values "
                                      f"on cpu for a tensor on cuda:0 (in {func})")
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
    student's own `to` or `_apply`): each parameter and buffer takes its moved copy's place
    (floating ones cast to `dtype`), laid out as `.to("cuda")` lays it out. As on a GPU, the
    objects stay the same (`torch.utils.swap_tensors`: a list of the module's parameters, tied
    weights), else, where they cannot be swapped, each is replaced by its copy."""
    for sub in module.modules():
        for table, make in ((sub._parameters, _as_parameter), (sub._buffers, lambda t, old: t)):
            for key, t in table.items():
                if t is None:
                    continue
                moved = make(_move(t.detach(), device, dtype if t.is_floating_point() else None), t)
                if moved.device == t.device and moved.dtype == t.dtype:
                    continue  # (moved already: a tied weight met again)
                try:
                    torch.utils.swap_tensors(t, moved)
                except Exception:
                    table[key] = moved


def _as_parameter(t: torch.Tensor, old: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=old.requires_grad)


class _DeviceMoves(TorchFunctionMode):
    """Places what the code puts on CUDA on the meta device (see the module's doc). Inside a
    handler this mode is off, so the handlers' own torch calls run as they are."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        run = _MOVES.get(func, func)
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _gpu(kwargs["device"])}
        return run(*args, **kwargs)


_native_meta: list = []  # the Library of the Python meta kernels kept, once made
_native_lock = threading.Lock()


def native_meta_kernels() -> None:
    """Meta tensors run PyTorch's C++ meta kernels where it has them (once per process).

    `import torch` registers Python meta kernels (`torch._meta_registrations`) over the C++
    ones of about 600 ops (addmm, softmax, layer norm's pieces ...), for compiling with
    symbolic shapes. Outside a compile their Python costs the device check most of its time:
    a LayerNorm, Linear, softmax and matmul on meta took 1.8 ms in Python, 0.45 ms in C++; the
    reference solutions' 172 device-check calls 0.52 s of CPU, 0.30 s. Only the plain dispatch
    changes: each op keeps its Python kernel for the Python dispatcher (`py_impl`), which fake
    tensors and so `torch.compile` use (tests/chapters/test_device_check.py compiles with
    dynamic shapes after it), and an op without a C++ meta kernel gets its Python one back,
    unless `meta_kernels` has CUDA's for it (where, layer_norm) or its C++ composite kernel is
    the one CUDA runs (about 400 ops, masked_fill and views among them).
    The reference's and the student's meta runs both go through here, so they compare alike;
    where torch's internals are not as expected, nothing changes (the check is only slower).
    Thread-safe: another thread entering `FakeCuda` meanwhile waits here (between the removal
    and the re-registration, some ops have no meta kernel at all)."""
    if _native_meta:
        return
    with _native_lock:
        if _native_meta:
            return
        try:
            _native_meta.append(_swap_meta_kernels())
        except Exception:  # (torch's internals not as expected: its Python kernels stay)
            _native_meta.append(None)


def _swap_meta_kernels():
    import torch._meta_registrations as registrations
    from torch._decomp import global_decomposition_table

    python = registrations._meta_lib_dont_use_me_use_register_meta
    kernels: dict = {}
    for kind in ("meta", "post_autograd", "pre_autograd"):  # (torch's own precedence)
        for op, fn in global_decomposition_table[kind].items():
            if isinstance(op, torch._ops.OpOverload):
                kernels.setdefault(op.name(), (op, fn))
    registered = torch._C._dispatch_get_registrations_for_dispatch_key
    before = set(registered("Meta"))
    if not before & kernels.keys():
        return None
    python._destroy()
    kept = torch.library.Library("aten", "IMPL", "Meta")
    for name in before - set(registered("Meta")):  # (the ops left without a meta kernel)
        if meta_kernels.composite_is_cudas(name):
            continue  # (meta tensors now run the C++ kernel a GPU runs)
        for kernel in (meta_kernels.KERNELS.get(name), kernels.get(name)):  # (CUDA's, else torch's)
            if kernel is None:
                continue
            try:
                kept.impl(*kernel)
                break
            except Exception:
                pass
    return kept


class FakeCuda:
    """Run the block as if on a GPU (see the module's doc): tensors the code puts on "cuda"
    are on the meta device, under CUDA's device rules."""

    def __enter__(self):
        native_meta_kernels()
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

"""The runs each case gets: the devices and dtypes (`device_plan`, `variants`) and, for the device
check where no GPU is present, one representative per code path (`code_path`): a device bug
depends on the path the code takes (no mask, a boolean or float mask, fully masked rows,
dropout, ...), not on the values."""
from __future__ import annotations



import torch

from ..shared.calls import Call
from ..runtime.device_check import DEVICE_CHECKS, FAKE_CUDA


HALF_DTYPES = ("float16", "bfloat16")
HALF_CASES = 3  # how many cases also run in half precision on CUDA


def device_plan(requested: str = "auto") -> list[str]:
    """The devices to grade on: always the CPU, then CUDA where present, else the device check
    (as if on a GPU: runtime/device_check)."""
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        raise RuntimeError("--device cuda was requested but torch.cuda.is_available() is False")
    if requested == "cpu":
        return ["cpu", FAKE_CUDA]
    return ["cpu", "cuda" if cuda else FAKE_CUDA]


def _path_of(x):
    """What of an argument can send code down another path: its kind, not its numbers."""
    if isinstance(x, torch.Tensor):
        kind = "bool" if x.dtype == torch.bool else "float" if x.is_floating_point() else "int"
        tags = (kind, x.dim())  # (unbatched and batched inputs often take different branches)
        if x.numel() and x.dim() and x.dtype == torch.bool:
            tags += (bool((~x).all(-1).any()),)  # a fully masked row
        elif x.numel() and x.is_floating_point():
            tags += (bool(torch.isinf(x).any()),)  # an additive -inf mask
        return tags
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, float):
        return ("float", x == 0)  # (dropout=0.0 vs 0.1)
    if isinstance(x, int):
        return "int"
    if isinstance(x, (list, tuple)):
        return tuple(_path_of(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _path_of(v)) for k, v in x.items()))
    return type(x).__name__


def code_path(call: Call) -> tuple:
    """The code path a case takes, as far as its inputs decide it: which arguments are given,
    of which kind (no mask, a boolean or a float mask, fully masked rows, a KV cache), the
    module's options, train mode, an expected error. A device mistake depends on the path, not
    on the values, so the device check runs one case of each path (`variants`)."""
    return (call.method, _path_of(call.init), call.train, call.as_default, call.expect_error,
            bool(call.grad), _path_of(call.args), _path_of(call.kwargs))


def device_check_groups(cases: list[Call]) -> dict[int, int]:
    """index of each case the device check covers -> index of the case run for its code path
    (the first case of that path). A memory case checks memory, which meta tensors
    have none of; a train-mode case draws dropout, which they cannot compare."""
    first: dict = {}
    groups = {}
    for i, c in enumerate(cases):
        if c.answer or c.train or c.capped_memory:
            continue
        groups[i] = first.setdefault(code_path(c), i)
    return groups


def variants(cases: list[Call], device: str) -> list[tuple[int, Call]]:
    """The calls of one device test, each with the index of the case it comes from. A written
    answer (`Call.answer`) is a value, not code: it has no device variant. The device check
    runs one case per code path (`device_check_groups`); the other cases of a path take its
    verdict (`grade_exercise`)."""
    if device == "cpu":
        return list(enumerate(cases))
    code = [(i, c) for i, c in enumerate(cases) if not c.answer]
    if device in DEVICE_CHECKS:
        groups = device_check_groups(cases)
        return [(i, cases[i].on(device, "float32")) for i, rep in groups.items() if i == rep]
    # A memory case is measured on the CPU alone, in a capped child with no GPU visible (CUDA
    # cannot start under that cap: its driver maps host memory as it goes).
    out = [(i, c.on("cuda", "float32")) for i, c in code if not c.capped_memory]
    for dt in HALF_DTYPES:
        halves = [(i, c) for i, c in code
                  if not (c.expect_error or c.as_default or c.train or c.capped_memory)]
        out += [(i, c.on("cuda", dt)) for i, c in halves[:HALF_CASES]]
    return out

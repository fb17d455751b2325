"""What one test case asks of an implementation (Call) and what came back (Outcome).

Both are plain data: numbers, strings, lists, dicts and plain CPU tensors, so they cross the
process boundary through `autograder.shared.wire` (no pickle) and can be stored as self-check fixtures.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum


class ErrorKind(str, Enum):
    """Error types that are not the student's own exception (Outcome.error["type"]). A `str`
    Enum, so `ErrorKind.TIMEOUT == "Timeout"` and plain strings sent by the child compare equal."""

    MISSING = "Missing"    # the target name is not defined
    TIMEOUT = "Timeout"    # the call (or the child) ran past its time limit
    CRASH = "Crash"        # the child process died or sent malformed data

    def __str__(self) -> str:
        return self.value

    @property
    def aspect(self) -> str:
        """The Mismatch aspect it is reported under ("missing", "timeout", "crash")."""
        return self.value.lower()

    @classmethod
    def of(cls, error: dict | None) -> "ErrorKind | None":
        """The kind of an Outcome.error, or None for an exception the code itself raised."""
        try:
            return cls(error["type"]) if error else None
        except ValueError:
            return None


def _fields_of(obj) -> dict:
    """A dataclass's fields as they are (no copy), for `wire.encode`, which copies what it sends."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass
class Call:
    """One invocation of a student's (or the reference's) code.

    Tensors in `args`, `kwargs` and `state` are stored on the CPU; the executor moves floating
    tensors to `device` and casts them to `dtype` (integer and boolean tensors keep their dtype).

    Attributes:
        chapter, exercise: the contract names being graded.
        case: a short human name ("batched, L_q != L_k, bool mask").
        target: the notebook-level name to look up (function or class).
        method: None to call the function, or the module itself (forward); else a method name
            of the constructed module ("prepare_qkv").
        init: keyword arguments to construct the module (None for a function).
        state: weights loaded into the module after its parameter names and shapes are checked.
        args, kwargs: the call's arguments.
        train: module mode for the call (dropout).
        grad: inputs whose gradients are compared ("args.0", "kwargs.bias"), plus "params"
            for every parameter of the module.
        seed: torch.manual_seed before construction and before the call (dropout, init).
        expect_error: an exception type name that the call must raise (e.g. "ValueError").
        device, dtype: where and in which floating dtype the call runs.
        as_default: run with `device` and `dtype` as torch's defaults (for functions such as
            sinusoidal_positional_encoding that create tensors from no input tensor).
        measure_memory: record the largest tensor the call creates (Outcome.largest_tensor), in
            the caller's process (the self-check's diagnosis: the student's own process can
            disable it, so the grader scores memory by `capped_memory` instead).
        capped_memory: a memory case: the grader runs it, on the CPU, in a child of its own whose
            memory the kernel caps before any student code runs (`memory_case`: RLIMIT_DATA and
            RLIMIT_AS at `Limits.memory_case` above what the child holds at its start, and a
            seccomp filter against memory that escapes both); no other case is capped.
        answer: the target is a plain value (a "predict" exercise's answer: a number or a nested
            list of numbers), not called but read, as a float64 CPU tensor (execute.py).
        watch: the exercises it builds on whose use the child records (`Outcome.called`):
            None for all of them (the self-check); the grader names those that failed their
            own tests, the only ones a diagnosis blames (`grading/diagnose.py`), since the
            recording hook slows every Python call (it took about a sixth of the CPU of a
            solution's graded calls).
    """

    chapter: str
    exercise: str
    case: str
    target: str
    method: str | None = None
    init: dict | None = None
    state: dict | None = None
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    train: bool = False
    grad: list = field(default_factory=list)
    seed: int = 0
    expect_error: str | None = None
    device: str = "cpu"
    dtype: str = "float64"
    as_default: bool = False
    measure_memory: bool = False
    capped_memory: bool = False
    answer: bool = False
    watch: list | None = None

    def to_plain(self) -> dict:
        return asdict(self)

    def to_wire(self) -> dict:
        """The fields as they are, for `wire.encode` to send (it copies what it sends, so the
        deep copy of `to_plain` is not needed: a quarter of a millisecond per graded call)."""
        return _fields_of(self)

    @classmethod
    def from_plain(cls, d: dict) -> "Call":
        return cls(**d)

    def on(self, device: str, dtype: str) -> "Call":
        """The same call on another device / dtype. Its inputs are the same objects, read only
        (the grader sends a copy of them to the child, and the reference runs on its own copy:
        `_inputs` in `runtime/execute.py`); a deep copy per variant cost a student 0.07 s."""
        return replace(self, device=device, dtype=dtype)


@dataclass
class Outcome:
    """What running a Call produced, as plain data.

    Attributes:
        error: None, or {"type", "message", "where"} for an exception (student frames only),
            "type" being an `ErrorKind` value ("Missing", "Timeout", "Crash") where the code
            itself raised nothing (see ErrorKind).
        returned: a description of the returned structure ("tuple(Tensor, Tensor)", "Tensor",
            "NoneType"), so a wrong return type is reported in words.
        outputs: the returned tensors, flattened in order, detached on the CPU (None where a
            value could not be brought back, e.g. on the meta device).
        meta: for each output: {"shape", "dtype", "device"} as it was returned.
        grads: gradient name -> tensor (or None when no gradient reached it).
        params: the module's parameters and buffers, names -> shapes, before loading (None for
            functions).
        transient: which of those are non-persistent buffers (not in state_dict(): no weights
            to load, so an extra one is no part of the module's contract and costs nothing).
        load_error: why the reference weights could not be loaded (missing/unexpected names).
        inputs_modified: names of arguments changed in place.
        forbidden: forbidden ops or functions seen while the call ran.
        seconds: wall time of the call.
        called: the exercises this one builds on (contract `builds_on`; those in `Call.watch`
            where it names some) that the call ran, so a failure is blamed on a prerequisite
            only where the student's code used it.
        largest_tensor: with Call.measure_memory, the most elements held by any tensor an op
            created while the call ran (views excluded), and that op's name: [numel, "aten.mm"].
        at_float32: on a reference outcome of a float64 case only (never read from a child):
            {"outputs", "grads"} of the same call run in float32 on the same inputs, so that a
            result rounded at float32 level is judged against what float32 itself gives
            (compare.py's float32 policy).
    """

    error: dict | None = None
    returned: str = ""
    outputs: list = field(default_factory=list)
    meta: list = field(default_factory=list)
    grads: dict = field(default_factory=dict)
    params: dict | None = None
    transient: list = field(default_factory=list)
    load_error: str | None = None
    inputs_modified: list = field(default_factory=list)
    forbidden: list = field(default_factory=list)
    seconds: float = 0.0
    called: list = field(default_factory=list)
    largest_tensor: list | None = None
    at_float32: dict | None = None
    device_note: str = ""

    def to_plain(self) -> dict:
        return asdict(self)

    def to_wire(self) -> dict:
        """As `Call.to_wire` (the deep copy of `to_plain`, tensors included, cost a chapter's
        child about 0.02 s)."""
        return _fields_of(self)

    @classmethod
    def from_plain(cls, d: dict) -> "Outcome":
        return cls(**d)

    @classmethod
    def failure(cls, type_: str, message: str, where: str = "") -> "Outcome":
        return cls(error={"type": str(type_), "message": message, "where": where})

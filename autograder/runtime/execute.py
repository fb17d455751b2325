"""Run one Call against a namespace and describe what happened as an Outcome.

The same function runs the reference (in the grader) and the student's code (in the sandboxed
child, or in the student's own kernel for the self-check), so both sides are measured the
same way. Nothing here compares or scores: that happens in the trusted grader process.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import types
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..shared.calls import Call, ErrorKind, Outcome
from ..shared.contract import ATTENTION_FUNCTIONS, ATTENTION_OPS, CHAPTERS, SOFTMAX_FUNCTIONS, SOFTMAX_OPS
from .device_check import FAKE_CUDA, FakeCuda, move_module, needs_values, reported_device, torch_device

WATCHED_OPS = ATTENTION_OPS | SOFTMAX_OPS
WATCHED_FUNCTIONS = ATTENTION_FUNCTIONS | SOFTMAX_FUNCTIONS
# Watched Python functions that need not run a watched op (nn.MultiheadAttention's slow path).
PYTHON_WATCHED = ("multi_head_attention_forward",)
_HIDDEN_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)), os.path.dirname(os.__file__))


class _Recorder:
    """Records the watched aten ops (`WATCHED_OPS`) that run while the block runs, however they
    are reached: torch.*, Tensor methods, aliases and wrappers (`F.softmin` runs `aten._softmax`),
    torch.ops.aten, torch._C bindings, decompositions and custom ops whose code calls them. It
    works at the dispatcher: each watched op has a kernel at the `PreDispatch` key (which nothing
    else of torch registers kernels at, and whose fallback is a fall-through), and the block
    includes that key in the thread's dispatch set, so the watched ops pass through a recording
    kernel and every other op costs no Python at all. `multi_head_attention_forward`, Python code
    whose slow path is ordinary ops, is recorded by name (`_record_function`)."""

    seen: set | None = None  # the set of the call running now (calls run one at a time: TorchState)

    def __init__(self, seen: set):
        self.mine = seen

    def __enter__(self):
        install_recorder()
        self.outer, _Recorder.seen = _Recorder.seen, self.mine
        self.guard = _INCLUDE_KEY(_WATCH_KEY)
        self.guard.__enter__()
        return self

    def __exit__(self, *exc):
        self.guard.__exit__(*exc)
        _Recorder.seen = self.outer
        return False


_WATCH_KEY = torch._C.DispatchKey.PreDispatch
# Taken when this module is imported (`child.import_runtime`, before any student cell): a cell
# that replaces torch._C's guard with a no-op leaves the recorder as it is.
_INCLUDE_KEY = torch._C._IncludeDispatchKeyGuard
_LIBRARY: list = []  # the torch.library.Library holding the recording kernels, once installed


def _recording_kernel(op, name: str):
    after = torch._C._dispatch_keyset_full_after(_WATCH_KEY)

    def kernel(keyset, *args, **kwargs):
        if _Recorder.seen is not None:
            _Recorder.seen.add(f"aten.{name}")
        return op.redispatch(keyset & after, *args, **kwargs)
    return kernel


def _record_function(fn, name: str):
    def recorded(*args, **kwargs):
        if _Recorder.seen is not None:
            _Recorder.seen.add(name)
        return fn(*args, **kwargs)
    recorded._autograder_recorded = name  # (not `__wrapped__`, which hands torch's own to a cell)
    return recorded


def install_recorder() -> None:
    """Register the recording kernels (once per process, before any student code runs:
    `child.import_runtime`)."""
    if _LIBRARY:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name in sorted(WATCHED_OPS):
        packet = getattr(torch.ops.aten, name, None)
        for overload in (packet.overloads() if packet is not None else ()):
            qualified = name if overload == "default" else f"{name}.{overload}"
            try:
                lib.impl(qualified, _recording_kernel(getattr(packet, overload), name), _WATCH_KEY.name,
                         with_keyset=True)
            except RuntimeError:  # an op this build does not have
                pass
    import torch.nn.functional as F

    for name in PYTHON_WATCHED:
        fn = getattr(F, name, None)
        if fn is not None and not hasattr(fn, "_autograder_recorded"):
            setattr(F, name, _record_function(fn, name))
    _LIBRARY.append(lib)


class _Largest(TorchDispatchMode):
    """Records the largest tensor created while a call runs (Call.measure_memory): the most
    elements held by any output of an aten op that is not a view (an `expand` allocates
    nothing). At the dispatch level every op is seen, however it was reached."""

    def __init__(self):
        super().__init__()
        self.numel, self.op = 0, ""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # else the first op imports torch._dynamo (seconds)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                    self.numel, self.op = t.numel(), str(func.overloadpacket.__name__)
        return out


def _avoid_dynamo_import() -> None:
    """While a TorchFunctionMode is active, and on the meta device (the device check), some ops
    (torch.isfinite, `x * 2`, ...) run through Python references wrapped in
    torch._compile._disable_dynamo, whose first call imports torch._dynamo: 0.7-3 s, which would
    make the first self-check of a kernel (and every grading child) slow. Nothing here is being
    compiled, so mark those wrapped functions as already "disabled" (their own function), as
    the wrapper itself would cache it after the import. (A scan of the garbage collector's
    objects: it runs where execute is imported, before the warm worker's first fork freezes
    them out of the collector's view.)"""
    import gc
    import sys

    if "torch._dynamo" in sys.modules:
        return
    code = torch._compile._disable_dynamo(lambda: None).__code__
    for obj in gc.get_objects():
        if type(obj) is _FUNCTION and obj.__code__ is code:
            fn = obj.__closure__[code.co_freevars.index("fn")].cell_contents
            if getattr(fn, "__dynamo_disable", None) is None:
                try:
                    fn.__dynamo_disable = fn
                except (AttributeError, TypeError):
                    pass


_FUNCTION = type(_avoid_dynamo_import)
_avoid_dynamo_import()


def student_frames(tb) -> str:
    """The traceback lines that belong to the submission, not to torch, Python or the grader."""
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(_HIDDEN_DIRS)]
    lines = []
    for f in frames[-4:]:
        where = f.filename if f.filename.startswith("<") else os.path.basename(f.filename)
        lines.append(f"{where}, line {f.lineno}, in {f.name}: {(f.line or '').strip()}")
    return "\n".join(lines)


def describe_error(exc: BaseException) -> dict:
    message = str(exc)
    if len(message) > 2000:
        message = message[:2000] + " …"
    return {
        "type": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "message": message,
        "where": student_frames(exc.__traceback__),
    }


# The template's stub, compiled (`raise NotImplementedError(...)`, after `super().__init__()` in
# a module's __init__): straight-line code, no jump or handler, no name but these.
_STUB_OPS = frozenset({"RESUME", "NOP", "CACHE", "COPY_FREE_VARS", "MAKE_CELL", "LOAD_GLOBAL", "LOAD_CONST",
                       "LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "PUSH_NULL", "PRECALL", "CALL", "KW_NAMES",
                       "LOAD_METHOD", "LOAD_ATTR", "LOAD_SUPER_ATTR", "POP_TOP", "RAISE_VARARGS"})
_STUB_NAMES = frozenset({"NotImplementedError", "super", "__init__"})


def _stub_code(code) -> bool:
    import dis

    if code.co_exceptiontable or not set(code.co_names) <= _STUB_NAMES:
        return False
    ops = [i.opname for i in dis.get_instructions(code)]
    return bool(ops) and ops[-1] == "RAISE_VARARGS" and ops.count("RAISE_VARARGS") == 1 and set(ops) <= _STUB_OPS


def stub_raise(exc: BaseException, target, call: Call) -> bool:
    """Whether `exc` is the exercise's stub raising, as the template has it: NotImplementedError
    raised by the code a call of this kind enters first (the function; a module's __init__)
    where that code is straight-line code naming nothing but NotImplementedError (and
    `super().__init__`). Every call of the exercise that enters it then raises the same error
    whatever its inputs, so the grader judges the exercise's other cases of that kind on this
    outcome instead of running them (`judge.grade_exercise`). A child that claims it falsely
    only fails its own cases."""
    if type(exc) is not NotImplementedError or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    if call.init is None:
        entry = target if type(target) is types.FunctionType else None
    else:  # (type(target) is type: no metaclass, and no __new__ of its own, can change what is built;
        # the __init__ that `super().__init__(...)` reaches is torch's or object's, not the
        # student's, which could raise the ValueError a case asks for: a review, stop 50)
        ok = type(target) is type and target.__new__ is object.__new__ and _parent_init(target) in (
            torch.nn.Module.__init__, object.__init__)
        entry = getattr(target, "__init__", None) if ok else None
    code = getattr(entry, "__code__", None)
    return (code is not None and tb.tb_frame.f_code is code and _stub_code(code)
            and all(type(a) is str and a in code.co_consts for a in exc.args))  # (the same message)


def _parent_init(cls: type):
    """The __init__ that `super().__init__` in `cls.__init__` reaches (the next one in the MRO
    after the class that defines `cls.__init__`)."""
    owners = [base for base in cls.__mro__ if "__init__" in vars(base)]
    return vars(owners[1])["__init__"] if len(owners) > 1 else None


def _describe(value: Any) -> str:
    """"Tensor", "tuple(Tensor, Tensor)", nested ones included: "tuple(Tensor, list(Tensor, Tensor))"
    (chapter 8's TinyTransformer returns the list of every block's weights)."""
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_describe(v) if isinstance(v, (tuple, list, torch.Tensor)) else type(v).__name__
                          for v in value)
        return f"{type(value).__name__}({inner})"
    return "Tensor" if isinstance(value, torch.Tensor) else type(value).__name__


def _flatten(value: Any) -> list:
    """The returned values in order, nested tuples/lists included ((out, w, (k, v)) -> 4)."""
    if not isinstance(value, (tuple, list)):
        return [value]
    return [leaf for v in value for leaf in (_flatten(v) if isinstance(v, (tuple, list)) else [v])]


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A detached, plain (no subclass) tensor."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.as_subclass(t.detach(), torch.Tensor)


DEVICE_PLACEHOLDER = "$device"  # a Call argument replaced by the call's device (causal_mask(L, device=...))


def _place(x: Any, device: str, dtype: torch.dtype, fake: bool = False) -> Any:
    if isinstance(x, str) and x == DEVICE_PLACEHOLDER:
        return "cuda" if fake else device  # (the device check: the code is told it runs on CUDA)
    if isinstance(x, torch.Tensor) and fake:  # (no values on the device check: an empty tensor is as good
        # as a copy, and costs no conversion of the real one)
        return torch.empty(x.shape, device=device, dtype=dtype if x.is_floating_point() else x.dtype)
    if isinstance(x, torch.Tensor):
        x = x.to(device, copy=True)  # never the Call's own tensor: an in-place edit must not leak
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, dict):
        return {k: _place(v, device, dtype, fake) for k, v in x.items()}
    if isinstance(x, list):
        return [_place(v, device, dtype, fake) for v in x]
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device.type == "meta":  # (no values to compare)
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    eq = a == b
    if a.is_floating_point():
        eq = eq | (torch.isnan(a) & torch.isnan(b))
    return bool(eq.all())


class TorchState:
    """Torch's global settings as a fresh process has them, for the duration of one call, and
    the caller's own restored afterwards: grad mode on (and inference mode off), default dtype
    float32, no default device, anomaly detection off, deterministic algorithms off, float32
    matmul precision "highest". So a notebook's global state (a last cell
    `torch.set_grad_enabled(False)`, `torch.set_default_dtype(torch.float64)`, ...) changes no
    score, and the self-check leaves the student's kernel as it found it.

    These settings are process-wide (grad mode aside), and the grader runs reference calls from
    several threads (one per chapter), so calls that hold a TorchState run one at a time: a call
    never sees another's temporary defaults (`as_default`), nor restores them."""

    _lock = threading.RLock()

    def __enter__(self):
        self._lock.acquire()
        self.saved = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_default_device(),
                      torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled(),
                      torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled(),
                      torch.get_float32_matmul_precision())
        self.inference = torch.inference_mode(False)
        self.inference.__enter__()
        torch.set_grad_enabled(True)
        torch.set_default_dtype(torch.float32)
        torch.set_default_device(None)
        torch.set_anomaly_enabled(False)
        if self.saved[5]:  # (setting it costs about a millisecond: only when it is on)
            torch.use_deterministic_algorithms(False)
        torch.set_float32_matmul_precision("highest")
        return self

    def __exit__(self, *exc):
        grad, dtype, device, anomaly, anomaly_nan, deterministic, warn_only, precision = self.saved
        torch.set_float32_matmul_precision(precision)
        if deterministic or torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_anomaly_enabled(anomaly, anomaly_nan)
        torch.set_default_device(None if device == torch.device("cpu") else device)
        torch.set_default_dtype(dtype)
        self.inference.__exit__(*exc)
        torch.set_grad_enabled(grad)
        self._lock.release()
        return False


def execute(namespace: dict, call: Call, reraise: tuple = (), trusted: bool = False,
            record: bool = True) -> Outcome:
    """Run `call` against the objects in `namespace` with torch's global state reset
    (`TorchState`); never raises (except `reraise` types and KeyboardInterrupt).

    `trusted`: the code is the grader's own (a reference, objects a test defines), which raises
    `Exception`s only: anything else (pytest-timeout's `Failed`, SystemExit) comes from a signal
    handler of this process and is raised on, never recorded as the call's outcome (a test's
    timeout firing inside a call on a loaded machine cost the solutions a case).

    `record`: note which of the exercises this one builds on the code calls (`Outcome.called`,
    for `grading/diagnose.py`), on a CPU case only: a device row takes its CPU twin's
    (`judge.grade_exercise`), and of those in `call.watch` where it names them (the grader's:
    the ones that failed). The hook slows every Python call while it is on. Off for the
    reference's runs, whose calls nobody reads."""
    target = namespace.get(call.target)
    if target is None:
        return Outcome.failure(ErrorKind.MISSING, f"`{call.target}` is not defined in the notebook.")
    record = record and call.device == "cpu"
    with TorchState(), _CallRecorder(_prerequisites(namespace, call) if record else {}) as calls:
        out = _execute(target, call, reraise, trusted)
        if call.device == FAKE_CUDA and needs_values(out.error):  # (the device check has no values)
            out.device_note = f"{out.error['type']}: {out.error['message'][:160]}"
    out.called = sorted(calls.called)
    return out


def at_float32(namespace: dict, call: Call) -> dict | None:
    """For a float64 case on the CPU: the outputs and gradients the same call gives in float32
    on the same inputs (Outcome.at_float32), against which compare.py's float32 policy judges
    a result rounded at float32 level; None for other cases (and for the memory cases, which
    are about memory, and large)."""
    if call.dtype != "float64" or call.device != "cpu" or call.answer or call.capped_memory:
        return None
    low = execute(namespace, call.on("cpu", "float32"), trusted=True, record=False)  # (the reference's run)
    return None if low.error else {"outputs": low.outputs, "grads": low.grads}


def _prerequisites(namespace: dict, call: Call) -> dict:
    """code object -> exercise name, for the exercises `call`'s exercise builds on (those in
    `call.watch` where it names them), as the namespace defines them (a function, a method of
    its owner, or a module's forward)."""
    chapter = CHAPTERS.get(call.chapter)
    try:
        builds_on = chapter.exercise(call.exercise).builds_on if chapter else ()
    except KeyError:
        return {}
    if call.watch is not None:
        builds_on = [name for name in builds_on if name in call.watch]
    codes = {}
    for name in builds_on:
        pre = chapter.exercise(name)
        obj = namespace.get(pre.target)
        obj = getattr(obj, pre.name if pre.kind == "method" else "forward", None) \
            if isinstance(obj, type) else obj
        code = getattr(obj, "__code__", None)
        if code is not None:
            codes[code] = name
    return codes


class _CallRecorder:
    """Records which of the given functions run while the context is active (sys.setprofile:
    one cheap check per Python call, in this thread only)."""

    def __init__(self, codes: dict):
        self.codes, self.called = codes, set()

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code in self.codes:
            self.called.add(self.codes[frame.f_code])

    def __enter__(self):
        self.previous = sys.getprofile()
        if self.codes:
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        if self.codes:
            sys.setprofile(self.previous)
        return False


ANSWER_STUB = "still `...` (replace it with your answer)"


def _answer(value, call: Call) -> Outcome:
    """A "predict" exercise's answer as an Outcome: one float64 CPU tensor (True/False count as
    1/0). The stub `...` is "not implemented"; a value that is not numbers is a TypeError."""
    if value is Ellipsis:
        return Outcome.failure("NotImplementedError", f"`{call.target}` is {ANSWER_STUB}.")
    try:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to("cpu", torch.float64)
        else:
            tensor = torch.as_tensor(value, dtype=torch.float64)
    except Exception:
        return Outcome.failure("TypeError", f"`{call.target}` should be a number or a list (of lists) of "
                               f"numbers, got {type(value).__name__}: {str(value)[:80]!r}.")
    out = Outcome(returned="answer", outputs=[tensor.clone()],
                  meta=[{"shape": list(tensor.shape), "dtype": "float64", "device": "cpu"}])
    return out


def _seed(seed: int, device: str) -> None:
    """torch.manual_seed(seed) for every generator a call can use: the CPU's, and CUDA's where
    the call runs on CUDA or CUDA is in use. (torch.manual_seed also seeds CUDA, MPS, XPU and
    MTIA lazily, recording a stack trace for each device not yet initialised: half a
    millisecond, most of what a graded call costs beyond the student's code on a CPU.)"""
    torch.default_generator.manual_seed(seed)
    if device.startswith("cuda") or torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


def _execute(target, call: Call, reraise: tuple, trusted: bool = False) -> Outcome:
    if call.answer:
        return _answer(target, call)
    dtype = getattr(torch, call.dtype)
    device = torch_device(call.device)
    start = time.perf_counter()
    seen: set = set()
    out = Outcome()
    try:
        _run(target, call, reraise, device, dtype, seen, out)
    except reraise:
        raise
    except BaseException as e:  # student code may raise anything, SystemExit included
        if isinstance(e, KeyboardInterrupt) or (trusted and not isinstance(e, Exception)):
            raise  # (an interrupt, or from the host's signal handler: see `execute`)
        out.error = describe_error(e)
        if call.device == "cpu" and stub_raise(e, target, call):
            out.error["stub"] = True
    out.forbidden = sorted(seen)
    out.seconds = time.perf_counter() - start
    return out


def _run(target, call: Call, reraise: tuple, device: str, dtype, seen: set, out: Outcome) -> Outcome:
    """The body of `_execute`: fills `out` (returns early with it on a module that cannot be used)."""
    _seed(call.seed, call.device)
    fake = call.device == FAKE_CUDA
    module = None
    if call.init is not None and fake and not call.as_default:
        # On the device check the module is built and loaded on the CPU, then moved, as a run on
        # a GPU does (an __init__ that makes tensors on a fixed device is no mistake there).
        module = _build_module(target, call, "cpu", dtype, seen, out)
        if module is None:
            return out
    with FakeCuda() if fake else _Nothing():
        if module is not None:
            move_module(module, device, dtype)
        return _call(target, module, call, device, dtype, seen, out)


def _call(target, module, call: Call, device: str, dtype, seen: set, out: Outcome) -> Outcome:
    """The second half of `_run`, on the call's device: the inputs, the module (unless built
    already), the call itself, what it returned and what it changed."""
    fake = call.device == FAKE_CUDA
    args, kwargs, named_inputs, grad_inputs, pristine = _inputs(call, device, dtype, fake)
    fn = target
    if call.init is not None:
        if module is None:
            module = _build_module(target, call, device, dtype, seen, out)
        if module is None:
            return out
        fn = getattr(module, call.method) if call.method else module
        if "params" in call.grad:
            for pname, p in module.named_parameters():
                grad_inputs[f"param.{pname}"] = p

    _seed(call.seed, call.device)
    defaults = _Defaults(device, dtype) if call.as_default else _Nothing()
    largest = _Largest() if call.measure_memory else _Nothing()
    with defaults, _Recorder(seen), largest:
        value = fn(*args, **kwargs)
    if call.measure_memory:
        out.largest_tensor = [largest.numel, f"aten.{largest.op}"]
    flat = _record_outputs(value, out, call.device)

    if grad_inputs and device != "meta" and call.device != FAKE_CUDA:
        out.grads = _gradients(flat, grad_inputs, call.seed)
    for name, before in pristine.items():
        if not _same(named_inputs[name].detach(), before):
            out.inputs_modified.append(name)
    return out


def _inputs(call: Call, device: str, dtype, fake: bool) -> tuple:
    """The call's arguments placed on `device`: (args, kwargs, every input by name, those that
    require a gradient by name, clones of the tensor inputs to detect in-place changes)."""
    args = _place(call.args, device, dtype, fake)
    kwargs = _place(call.kwargs, device, dtype, fake)
    named_inputs = {f"args.{i}": a for i, a in enumerate(args)}
    named_inputs.update({f"kwargs.{k}": v for k, v in kwargs.items()})
    grad_inputs = {}
    for name in call.grad:
        t = named_inputs.get(name)
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            t.requires_grad_(True)
            grad_inputs[name] = t
    pristine = {} if fake else {  # (the device check has no values to compare)
        k: v.detach().clone() for k, v in named_inputs.items() if isinstance(v, torch.Tensor)}
    return args, kwargs, named_inputs, grad_inputs, pristine


def _build_module(target, call: Call, device: str, dtype, seen: set, out: Outcome):
    """The student's nn.Module built with `call.init`, its parameters recorded in `out`, the
    reference weights loaded, and moved to `device`; None where it cannot be used (`out.error`
    says why). On fake CUDA only modules built with CUDA as torch's default device
    (`Call.as_default`) are built here; the others are built on the CPU (`_run`)."""
    fake = call.device == FAKE_CUDA and device != "cpu"
    with (_Defaults(device, dtype) if call.as_default else _Nothing()), _Recorder(seen):
        module = target(**call.init)
    if not isinstance(module, torch.nn.Module):
        out.error = Outcome.failure("TypeError", f"`{call.target}(...)` did not build an nn.Module "
                                    f"(got {type(module).__name__}).").error
        return None
    lazy = [n for n, p in [*module.named_parameters(), *module.named_buffers()]
            if torch.nn.parameter.is_lazy(p)]
    if lazy:
        out.error = Outcome.failure("TypeError", (
            f"`{call.target}(...)` has parameters that do not exist yet after __init__ "
            f"({', '.join(lazy[:4])}{', ...' if len(lazy) > 4 else ''}: nn.LazyLinear or another lazy "
            "layer). The grader loads the reference weights right after __init__, so every parameter "
            "must exist with its shape by then: use nn.Linear(in_features, out_features).")).error
        return None
    # Parameters and buffers (non-persistent ones too), by name, with their shapes.
    out.params = {k: list(v.shape) for k, v in module.named_parameters()}
    out.params.update({k: list(v.shape) for k, v in module.named_buffers()})
    persistent = module.state_dict(keep_vars=True)
    out.transient = sorted(k for k, _ in module.named_buffers() if k not in persistent)
    if not fake:  # (on fake CUDA, move_module below sets the dtype: no values to round)
        module.to(dtype=dtype)  # before loading, so float64 weights are not rounded to float32
    if call.state is not None:
        _load_state(module, call.state, dtype, fake, out)
    if fake:
        move_module(module, device, dtype)
    else:
        module.to(device=device, dtype=dtype)
    module.train(call.train)
    return module


def _load_state(module, state: dict, dtype, fake: bool, out: Outcome) -> None:
    """The reference weights loaded into `module`; what does not fit goes to `out.load_error`."""
    state = {k: _place(v, "meta", dtype, fake) if fake else v.to(dtype) if v.is_floating_point() else v
             for k, v in state.items()}
    own = module.state_dict()
    missing = [k for k in state if k not in own]
    if missing:
        out.load_error = "missing " + ", ".join(missing)
    else:
        try:
            module.load_state_dict(state, strict=False)
        except Exception as e:  # shape mismatch
            out.load_error = str(e).strip().splitlines()[-1][:500]


def _record_outputs(value, out: Outcome, call_device: str) -> list:
    """What the call returned, described in `out` (structure, per-output meta, CPU copies of the
    values); returns the flattened outputs."""
    out.returned = _describe(value)
    flat = _flatten(value)
    for v in flat:
        if isinstance(v, torch.Tensor):
            out.meta.append({"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."),
                             "device": reported_device(v, call_device)})
            out.outputs.append(None if v.device.type == "meta" else _plain(v).to("cpu"))
        else:
            out.meta.append({"type": type(v).__name__})
            out.outputs.append(None)
    return flat


def _gradients(flat: list, grad_inputs: dict, seed: int) -> dict:
    """Gradients of sum(output_i * r_i) for fixed random r_i, with respect to each input."""
    gen = torch.Generator().manual_seed(seed + 7919)
    loss = None
    for v in flat:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad:
            r = torch.randn(v.shape, generator=gen, dtype=torch.float64).to(v.device, v.dtype)
            term = (v * r).sum()
            loss = term if loss is None else loss + term
    if loss is None:
        return {k: None for k in grad_inputs}
    names = list(grad_inputs)
    grads = torch.autograd.grad(loss, [grad_inputs[n] for n in names], allow_unused=True)
    return {n: None if g is None else _plain(g).to("cpu") for n, g in zip(names, grads)}


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Defaults:
    """Temporarily make `device` and `dtype` torch's defaults."""

    def __init__(self, device: str, dtype: torch.dtype):
        self.device, self.dtype = torch.device(device), dtype

    def __enter__(self):
        self.old_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        self.device.__enter__()
        return self

    def __exit__(self, *exc):
        self.device.__exit__(*exc)
        torch.set_default_dtype(self.old_dtype)
        return False

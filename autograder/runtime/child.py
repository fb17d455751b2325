"""The child process: runs a student's notebook cells, then answers graded calls.

Started by `autograder.sandbox.processes.Child` as
    python -B -u -s -P -c "...; from autograder.runtime.child import main; main(sys.argv[1:])" REQ RES CONFIG
with REQ a pipe to read requests from, RES a pipe to write results to (never stdout: student
code prints), CONFIG a JSON object (sys.path, limits, the output separator token). stdout and
stderr go to a third pipe that the parent reads with a size cap.

Messages: the chapter channel of `autograder.shared.protocol` (RunCells, RunCall in; ChildReady,
CellDone, CellsDone, CallDone out), each an `autograder.shared.wire` frame, never pickle. After every
cell and every call the child writes "\\0<token>\\0" to stdout, so the parent can tell which
output belongs to which cell. The child ends when the request pipe closes.

Timeouts: SIGALRM raises `Interrupted` (a BaseException, so `except Exception` in student code
does not swallow it) when a cell or call overruns, and again every 0.2 s until it unwinds. Code
that catches BaseException, ignores SIGALRM or blocks in C is stopped by the parent, which kills
the child `grace` seconds later.
"""
from __future__ import annotations


import builtins
import json
import linecache
import os
import signal
import sys
import time
import types

from . import procs
from .prepare import cuda_fraction, preimport, prepare, set_limits


class Interrupted(BaseException):
    """Raised by SIGALRM in the cell or call that overran its time."""


_deadline: float | None = None
_MAIN_PID = os.getpid()


def _on_alarm(signum, frame):
    if _deadline is not None and time.monotonic() >= _deadline - 0.005:
        raise Interrupted()


def guarded(fn, timeout: float):
    """Run fn() with a timeout: (status, value, exception); status "ok", "error" or "timeout"."""
    global _deadline
    try:
        try:
            signal.signal(signal.SIGALRM, _on_alarm)  # re-installed: student code may change it
            _deadline = time.monotonic() + timeout
            signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001), 0.2)
            value = fn()
            return "ok", value, None
        finally:
            _deadline = None
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
    except Interrupted:
        return "timeout", None, None
    except BaseException as e:  # SystemExit, KeyboardInterrupt and everything else
        return "error", None, e


def _not_main():
    """A process the student forked has come back into the worker: it must not answer."""
    if os.getpid() != _MAIN_PID:
        os._exit(0)


class _Nothing:
    """Any attribute of the grader's shell, as a notebook reads it: calling it does nothing and
    returns None (`run_line_magic`, `system`); its own attributes are more of the same
    (`kernel.comm_manager`); it is empty and false (`"IPKernelApp" in get_ipython().config`,
    the usual "am I in a notebook?" test, says no, as it does outside a kernel)."""

    def __call__(self, *args, **kwargs):
        return None

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __bool__(self):
        return False

    def __len__(self):
        return 0

    def __iter__(self):
        return iter(())

    def __contains__(self, item):
        return False

    def __repr__(self):
        return "<nothing: the grader has no IPython kernel>"


_NOTHING = _Nothing()


class _IPythonStub:
    """What `get_ipython()` returns in the grader: every method does nothing and returns None,
    every other attribute is `_Nothing`."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _NOTHING

    def __repr__(self):
        return "<grader stub for get_ipython(): magics and shell commands do nothing>"


_IPYTHON = _IPythonStub()


def _get_ipython():
    return _IPYTHON


class _IPythonModule(types.ModuleType):
    """IPython, or IPython.core.getipython, as the notebook's own imports get it: its get_ipython
    is the grader's (`_get_ipython`), as the kernel's is in a notebook; anything else is
    IPython's. Outside a kernel IPython's own returns None, and `from IPython import
    get_ipython` then `get_ipython().run_line_magic(...)` failed the cell (stop 49)."""

    def __init__(self, real):
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update({k: v for k, v in vars(real).items()
                              if k in ("__spec__", "__package__", "__loader__", "__file__", "__path__")})
        self.__dict__["_real"] = real
        self.__dict__["get_ipython"] = _get_ipython

    def __getattr__(self, name):
        real = self.__dict__.get("_real")  # (absent in a copy made without __init__)
        if real is None:
            raise AttributeError(name)
        return getattr(real, name)

    def __repr__(self):
        return repr(self.__dict__.get("_real"))


_IPYTHON_MODULES = ("IPython", "IPython.core.getipython")


def _notebook_imports(namespace: dict) -> None:
    """Imports made by the notebook's code (its cells and the functions they define, whose
    globals are `namespace`) get IPython as `_IPythonModule`; a library's imports, and the
    grader's, get it as it is (matplotlib and tqdm ask IPython's get_ipython whether they run in
    a kernel, and must hear that they do not)."""
    real_import = builtins.__import__
    if getattr(real_import, "namespace", None) is namespace:
        return

    def notebook_import(name, globals=None, locals=None, fromlist=(), level=0):
        module = real_import(name, globals, locals, fromlist, level)
        if globals is namespace and getattr(module, "__name__", None) in _IPYTHON_MODULES \
                and "*" not in (fromlist or ()):
            return _IPythonModule(module)
        return module
    notebook_import.namespace = namespace
    builtins.__import__ = notebook_import


def _display(*objs, **kwargs):
    for obj in objs:
        print(repr(obj))


def _reap() -> None:
    """Collect exited children of the student's code, so zombies do not use up the process limit."""
    for _ in procs.ended_children():
        pass


def import_runtime() -> None:
    """What every chapter needs, imported once (by the warm worker, before any fork)."""
    import torch  # noqa: F401

    from ..shared import wire  # noqa: F401
    from . import execute  # (importing it marks torch's references, so that no chapter imports
    # torch._dynamo: `execute._avoid_dynamo_import`, before a fork freezes the heap)
    from .device_check import native_meta_kernels

    native_meta_kernels()  # (once here, not in every chapter's child)
    # Before any student cell: a cell that takes a watched function (`F.multi_head_attention_
    # forward`) into a name of its own gets the recording one, not torch's.
    execute.install_recorder()


def main(argv: list[str]) -> None:
    """One chapter in one freshly started process (the fallback mode)."""
    start = time.perf_counter()
    req_fd, res_fd, config = int(argv[0]), int(argv[1]), json.loads(argv[2])
    prepare(config)
    import_runtime()
    serve(req_fd, res_fd, config, start)


def serve(req_fd: int, res_fd: int, config: dict, start: float) -> None:
    """Run one chapter: answer `RunCells` and `RunCall` requests until the request pipe closes
    (or brings something else), then end the process."""
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    import torch

    # The memory case's child has one thread, whatever Limits.threads says: a second would start
    # here, before its seccomp filter (`prepare.every_thread_filtered` would then stop it), and
    # under load two threads made the case slower than its timeout (stop 40).
    torch.set_num_threads(1 if config.get("data_headroom") else max(1, int(config.get("threads", 1))))
    if config.get("data_headroom"):
        _one_thread(torch)
    _stub_selfcheck()
    from ..shared import protocol as p
    from ..shared.wire import FrameReader, WireError

    chapter = _Chapter(res_fd, config["token"])
    import random

    random.seed(0)  # determinism for notebooks that draw random numbers without a seed
    torch.manual_seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)
    if config.get("data_headroom"):
        preimport(config.get("preimport"))  # (before the cap is measured: `prepare.preimport`)
    set_limits(config)
    cuda_fraction(config.get("cuda_fraction"))
    chapter.send(p.ChildReady(os.getpid(), os.getuid(), time.perf_counter() - start))
    chapter.end_of_output()
    handlers = {p.RunCells: chapter.run_cells, p.RunCall: chapter.run_call}
    requests = FrameReader()
    while True:
        try:
            message = p.from_plain(requests.read(req_fd))
        except (EOFError, OSError, WireError, p.ProtocolError):
            break
        handler = handlers.get(type(message))
        if handler is None:  # a kind the child sends, not a request
            break
        handler(message)
    os._exit(0)  # no atexit handlers, no waiting for the student's threads


class _Chapter:
    """The notebook's namespace and the two requests on it (see `autograder.shared.protocol`)."""

    def __init__(self, res_fd: int, token: str):
        # Bound now, before any student code runs (it could replace module attributes later).
        from ..shared import protocol
        from ..shared.calls import Call, Outcome
        from .execute import execute
        from ..shared.wire import WireError, encode

        self.p, self.Call, self.Outcome, self.execute = protocol, Call, Outcome, execute
        self.WireError, self.encode = WireError, encode
        self.res_fd = res_fd
        self.separator = b"\0" + token.encode() + b"\0"
        module = types.ModuleType("__main__")
        self.namespace = module.__dict__
        self.namespace.update(__builtins__=builtins, get_ipython=_get_ipython, display=_display)
        sys.modules["__main__"] = module

    def send(self, message) -> None:
        """One frame to the grader. An outcome that cannot be encoded becomes a TypeError."""
        p, encode = self.p, self.encode
        _not_main()
        try:
            frame = encode(p.plain(message))
        except Exception as e:  # (an outcome can hold the student's objects, whose methods
            # encoding may call: an int subclass's __abs__, a type's __name__, and raise anything)
            if not isinstance(message, p.CallDone):
                raise
            frame = encode(p.plain(p.CallDone(message.id, self.Outcome.failure(
                "TypeError", f"the result cannot be sent to the grader: {_why_unsendable(e, self.WireError)}"
            ).to_plain())))
        view = memoryview(frame)
        while view:
            n = os.write(self.res_fd, view)
            view = view[n:]

    def end_of_output(self) -> None:
        """The separator that tells the grader where this cell's or call's output ends."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        try:
            os.write(1, self.separator)
        except OSError:
            pass

    def run_cells(self, message) -> None:
        p = self.p
        skip = set(message.skip)
        budget_end = time.monotonic() + float(message.budget)
        if any(isinstance(c, str) and "IPython" in c for c in message.cells):
            _notebook_imports(self.namespace)  # (only then: it puts Python into every import)
        for number, source in enumerate(message.cells, 1):
            left = budget_end - time.monotonic()
            if number in skip or left <= 0 or not isinstance(source, str):
                self.end_of_output()
                self.send(p.CellDone(number, "skipped" if number in skip else "not run", None, 0.0))
                continue
            t0 = time.perf_counter()
            timeout = min(float(message.timeout), left)
            status, error = self._run_cell(number, source, timeout, float(message.timeout))
            self.end_of_output()
            self.send(p.CellDone(number, status, error, time.perf_counter() - t0))
        defined = [k for k in self.namespace if isinstance(k, str) and not k.startswith("_")
                   and k not in ("get_ipython", "display")]
        self.send(p.CellsDone([k[:200] for k in defined[:5000]]))

    def _run_cell(self, number: int, source: str, timeout: float, cell_timeout: float):
        name = f"<cell {number}>"
        # so tracebacks (in cells and later in calls) show the student's lines
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)

        def run_cell():
            exec(compile(source, name, "exec", dont_inherit=True), self.namespace)

        status, _, exc = guarded(run_cell, timeout)
        _not_main()
        _reap()
        if status == "error":
            return status, _error_of(exc)
        if status == "timeout":
            return status, {"type": "Timeout", "where": name, "message": (
                f"the cell ran longer than {timeout:.3g} s and was interrupted"
                if timeout >= cell_timeout else "the notebook's time budget ran out "
                "during this cell, which was interrupted")}
        return status, None

    def run_call(self, message) -> None:
        p, Call, Outcome, execute = self.p, self.Call, self.Outcome, self.execute
        timeout = float(message.timeout)
        status = "error"
        try:
            call = Call.from_plain(message.call)
        except Exception as e:
            outcome = Outcome.failure("GraderError", f"malformed call: {e}")
        else:
            status, outcome, exc = guarded(
                lambda: execute(self.namespace, call, reraise=(Interrupted,)), timeout)
            _not_main()
            _reap()
            if status == "timeout":
                outcome = Outcome.failure(
                    "Timeout", f"`{call.target}` took longer than {timeout:g} s and was "
                    "interrupted (an infinite loop, or far too much work?)")
            elif status == "error":  # KeyboardInterrupt, which execute lets through
                outcome = Outcome(error=_error_of(exc))
        try:
            plain = outcome.to_wire()
        except BaseException as e:
            plain = Outcome.failure("GraderError", f"the result could not be read: "
                                    f"{_safe_name(e)}").to_plain()
        self.end_of_output()
        self.send(p.CallDone(message.id, plain))
        if status == "timeout" and _modes_left():
            os._exit(0)  # interrupted inside the op recorders: start afresh next time


def _error_of(exc: BaseException) -> dict:
    from .execute import describe_error

    try:
        return describe_error(exc)
    except BaseException:
        return {"type": _safe_name(exc), "message": "(the exception could not be printed)",
                "where": ""}


def _one_thread(torch) -> None:
    """The memory case's child keeps one torch thread whatever a cell asks
    (`torch.set_num_threads(32)`: each thread's stack, 8 MiB of address space, counts against
    the case's cap, and 32 of them ended the child, stop 49). Threads change the speed only."""
    real = torch.set_num_threads

    def set_num_threads(n: int) -> None:
        real(1)
    torch.set_num_threads = set_num_threads


def _stub_selfcheck() -> None:
    """The notebook's self-check cells import autograder.selfcheck, which is not in the sandbox
    (the grader grades by itself): give them a check() that does nothing, so they cost no time
    and leave no misleading errors in the report."""
    import types

    stub = types.ModuleType("autograder.selfcheck")
    stub.SelfCheckFailed = type("SelfCheckFailed", (AssertionError,), {})
    stub.check = lambda *args, **kwargs: True
    sys.modules[stub.__name__] = stub


def _modes_left() -> bool:
    """Whether an interrupted call left a torch function/dispatch mode pushed."""
    try:
        import torch
        from torch.utils._python_dispatch import _len_torch_dispatch_stack

        return bool(torch._C._len_torch_function_stack() or _len_torch_dispatch_stack())
    except Exception:
        return False


def _why_unsendable(e: BaseException, wire_error) -> str:
    """The encoder's own message (`unsupported tensor dtype ...`), else the exception's type
    name: another exception came from the student's objects, whose __str__ is theirs too."""
    if type(e) in (wire_error, TypeError, ValueError):
        try:
            return str(e)[:300]
        except BaseException:
            pass
    return _safe_name(e)


def _safe_name(obj) -> str:
    try:
        return str(type(obj).__name__)[:100]
    except BaseException:
        return "Exception"

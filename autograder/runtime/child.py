"""The child process: runs a student's notebook cells, then answers graded calls.

Started by `autograder.sandbox.processes.Child` as
    python -B -u -P -c "...; from autograder.runtime.child import main; main(sys.argv[1:])" REQ RES CONFIG
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


class _IPythonStub:
    """What `get_ipython()` returns in the grader: every method does nothing and returns None."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _nothing

    def __repr__(self):
        return "<grader stub for get_ipython(): magics and shell commands do nothing>"


def _nothing(*args, **kwargs):
    return None


_IPYTHON = _IPythonStub()


def _get_ipython():
    return _IPYTHON


def _display(*objs, **kwargs):
    for obj in objs:
        print(repr(obj))


# Imported before a late privilege drop (fallback as root), for a Python installation that the
# unprivileged user cannot read (pyenv under /root): what notebooks and their graded code import.
PREIMPORT = ("resource", "ctypes", "torch", "torch.nn", "torch.nn.functional", "torch.utils._device",
             "torch.fx.experimental.symbolic_shapes",  # the device checks need it (sympy)
             "torch._subclasses.fake_tensor",  # the device check on fake CUDA (device_check),
             "torch._dynamo",  # whose FakeTensorMode() imports torch._dynamo.config (0.75 s: once, here)
             "torch.utils._device",  # `with torch.device(...)` imports it lazily (execute._Defaults)
             "numpy", "numpy.random", "math", "cmath", "random", "itertools", "functools",
             "collections", "typing", "dataclasses", "copy", "json", "time", "socket",
             "subprocess", "threading", "signal", "uuid", "inspect", "traceback", "linecache",
             "warnings", "operator", "string", "textwrap", "io", "contextlib", "weakref", "re",
             "enum", "abc", "struct", "heapq", "bisect", "statistics", "fractions", "decimal",
             "numbers", "pprint", "types", "pickle", "tempfile", "pathlib", "shutil")


def _drop(config: dict) -> None:
    """Become the unprivileged user named in the config (no groups, no_new_privs)."""
    drop = config.get("drop")
    if drop:
        os.setgroups([])
        os.setgid(drop[1])
        os.setuid(drop[0])
        if os.getuid() != drop[0] or os.geteuid() != drop[0]:
            os._exit(70)
        _prctl(38, 1)  # PR_SET_NO_NEW_PRIVS


def _prepare(config: dict) -> None:
    """Before anything else: drop privileges (if asked and not late), set sys.path and the hard
    limits. A late drop imports PREIMPORT first, then drops."""
    sys.path[:] = config["sys_path"]
    if config.get("drop") and config.get("drop_late"):
        import importlib

        for name in PREIMPORT:
            try:
                importlib.import_module(name)
            except Exception:
                pass
    _drop(config)
    if config.get("no_userns") and os.getuid() != 0:
        from .confine import no_user_namespaces

        if not no_user_namespaces() and config.get("no_userns") == "required":
            os._exit(72)
    if config.get("subreaper"):  # after the drop: changing credentials clears PDEATHSIG  # the fallback: no PID namespace to do these for us
        _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the student's code stay ours
        _prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: die with the grader
    os.makedirs(os.environ.get("MPLCONFIGDIR", "/tmp/.matplotlib"), exist_ok=True)


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:
        pass


def _set_limits(config: dict) -> None:
    try:
        import resource
    except ImportError:  # not on Linux/macOS
        return
    rlimits = dict(config["rlimits"])
    headroom = config.get("data_headroom")
    if headroom:  # the memory case's child (autograder.session.memory_case): this much beyond what it
        # holds now (torch included), counted over every mapping (RLIMIT_AS sees shared and
        # file-backed ones, which RLIMIT_DATA does not), with no GPU (its cases run on the CPU)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        for name, key in (("DATA", "VmData:"), ("AS", "VmSize:")):
            cap = headroom + _status_bytes(key)
            rlimits[name] = min(rlimits.get(name) or cap, cap)
    for name, value in rlimits.items():
        res = getattr(resource, f"RLIMIT_{name}", None)
        if res is None or value is None:
            continue
        try:
            soft, hard = resource.getrlimit(res)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass
    if headroom:
        _confine_memory_case(resource, rlimits["AS"])
    nproc = config.get("nproc")
    res = getattr(resource, "RLIMIT_NPROC", None)
    if nproc and res is not None and os.getuid() != 0:
        if config.get("nproc_relative"):
            nproc += _tasks_of(os.getuid())
        try:
            resource.setrlimit(res, (nproc, nproc))
        except (ValueError, OSError):
            pass


def _cuda_fraction(fraction) -> None:
    """This child's share of the GPU's memory (`Limits.gpu_share`), applied when CUDA first
    starts (torch's queued lazy calls), so a chapter that never uses CUDA does not start it.
    It bounds torch's caching allocator; `autograder.sandbox.gpu_share` does the rest."""
    if not fraction or fraction >= 1 or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return
    try:
        import torch

        def apply():
            torch.cuda.set_per_process_memory_fraction(float(fraction))

        if torch.cuda.is_initialized():
            apply()
        else:
            torch.cuda._lazy_call(apply)
    except Exception:  # no CUDA build, or a torch without these: nothing to bound
        pass


MEMORY_CASE_UNCONFINED = 73  # the exit status of a memory case's child that could not be confined


def _confine_memory_case(resource, address_space: int) -> None:
    """The memory case's child refuses shared anonymous memory, memfd_create, shmget and
    sockets (`confine.no_hidden_memory`), then checks that its address-space cap and that
    filter are in place; where either is not, it exits before any student code runs, so a
    memory case is never credited where memory went unmeasured."""
    from .confine import no_hidden_memory

    filtered = no_hidden_memory()
    try:
        capped = resource.getrlimit(resource.RLIMIT_AS)[1] <= address_space
    except (ValueError, OSError):
        capped = False
    if not (filtered and capped):
        os.write(2, b"the memory case cannot be measured here: "
                    + (b"no seccomp filter" if not filtered else b"no address-space limit") + b"\n")
        os._exit(MEMORY_CASE_UNCONFINED)


def _status_bytes(key: str) -> int:
    """A size from /proc/self/status in bytes (VmData: what RLIMIT_DATA counts, heap and
    private writable mappings; VmSize: what RLIMIT_AS counts, every mapping)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tasks_of(uid: int) -> int:
    """Tasks (threads included) this user already runs; RLIMIT_NPROC counts them all."""
    count = 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _reap() -> None:
    """Collect exited children of the student's code, so zombies do not use up the process limit."""
    for _ in procs.ended_children():
        pass


def _import_runtime() -> None:
    """What every chapter needs, imported once (by the warm worker, before any fork)."""
    import torch  # noqa: F401

    from ..shared import calls
    from . import execute
    from ..shared import wire  # noqa: F401


def main(argv: list[str]) -> None:
    """One chapter in one freshly started process (the fallback mode)."""
    start = time.perf_counter()
    req_fd, res_fd, config = int(argv[0]), int(argv[1]), json.loads(argv[2])
    _prepare(config)
    _import_runtime()
    serve(req_fd, res_fd, config, start)


def serve(req_fd: int, res_fd: int, config: dict, start: float) -> None:
    """Run one chapter: answer `RunCells` and `RunCall` requests until the request pipe closes
    (or brings something else), then end the process."""
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    import torch

    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    _stub_selfcheck()
    from ..shared import protocol as p
    from ..shared.wire import FrameReader, WireError

    chapter = _Chapter(res_fd, config["token"])
    import random

    random.seed(0)  # determinism for notebooks that draw random numbers without a seed
    torch.manual_seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)
    _set_limits(config)
    _cuda_fraction(config.get("cuda_fraction"))
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
        except (self.WireError, TypeError, ValueError) as e:
            if not isinstance(message, p.CallDone):
                raise
            frame = encode(p.plain(p.CallDone(message.id, self.Outcome.failure(
                "TypeError", f"the result cannot be sent to the grader: {e}").to_plain())))
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
            plain = outcome.to_plain()
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


def _safe_name(obj) -> str:
    try:
        return str(type(obj).__name__)[:100]
    except BaseException:
        return "Exception"


# ------------------------------------------------------------------------- the warm worker

def warm(argv: list[str]) -> None:
    """One student's warm worker: import once, then fork a fresh child per chapter.

    Started inside the student's sandbox as ... -c "...; warm(sys.argv[1:])" CONTROL CONFIG, with
    CONTROL the control socket (`autograder.shared.protocol`). It never runs student code: every
    chapter's child is forked from this state (torch imported, nothing run), so what one
    chapter does to its interpreter (a monkeypatched torch, say) never reaches another.
    """
    start = time.perf_counter()
    ctl_fd, config = int(argv[0]), json.loads(argv[1])
    _prepare(config)
    _prctl(4, 0)   # PR_SET_DUMPABLE 0: the chapters (same uid) cannot ptrace or read this one
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of a chapter come back here and are killed
    _import_all()
    _serve_box(ctl_fd, config, start)


def _import_all() -> None:
    import importlib

    for name in PREIMPORT:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    _import_runtime()


class ControlLoop:
    """The loop of a process the grader drives over a control socket: the warm worker, and the
    zygote that starts warm workers (`autograder.runtime.zygote`). It waits for a request or a child's
    end, calls `reap`, and hands each request to its handler; it ends when the socket closes
    or brings a message that has no handler or that the handler refuses (returns False)."""

    def __init__(self, ctl_fd: int):
        import socket

        from ..shared import protocol

        self.p = protocol
        self.ctl_fd, self.ctl = ctl_fd, socket.socket(fileno=ctl_fd)
        self.wake_r, self.wake_w = os.pipe()  # SIGCHLD wakes select through this pipe
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        signal.set_wakeup_fd(self.wake_w)

    def send(self, message) -> None:
        self.p.send(self.ctl, message)

    def fork(self) -> int:
        """os.fork; the child keeps none of the loop (its signal handling, its descriptors)."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.ctl_fd, self.wake_r, self.wake_w):
                os.close(fd)
        return pid

    def run(self, handlers: dict, reap) -> None:
        """handlers: message class -> handler(message, fds) -> whether it took the message
        (and so the fds that came with it)."""
        import select

        p = self.p
        while True:
            try:
                ready, _, _ = select.select([self.ctl, self.wake_r], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 4096)
                except OSError:
                    pass
            reap()
            if self.ctl not in ready:
                continue
            try:
                message, fds = p.receive(self.ctl)
            except (p.ProtocolError, OSError):
                return
            if message is None:
                return
            handler = handlers.get(type(message))
            if handler is None or not handler(message, fds):
                p._close(fds)
                return


def _serve_box(ctl_fd: int, config: dict, start: float) -> None:
    """The warm worker's loop: answer Fork, Kill and Reset until the control socket closes."""
    from ..shared import protocol as p

    loop = ControlLoop(ctl_fd)
    chapters: dict[int, str] = {}  # live chapter children: pid -> token

    def reap() -> None:
        ended = []
        for pid, returncode in procs.ended_children():
            if chapters.pop(pid, None) is not None:
                ended.append(pid)
                loop.send(p.Exited(pid, returncode))
        for pid in procs.children_of(os.getpid()):  # an orphan of a chapter that ended
            if pid not in chapters:
                procs.kill_tree(pid)
        for pid in ended:  # its files must not reach a chapter that runs later
            _empty(_chapter_folder(pid), remove=True)

    def fork(message: p.Fork, fds: list) -> bool:
        if len(fds) != 3:
            return False
        pid = loop.fork()
        if pid == 0:
            try:
                os.setsid()
                req, res, out = fds
                os.dup2(out, 1)
                os.dup2(out, 2)
                os.close(out)
                _prctl(36, 1)  # its own orphans stay below it, so killing it finds them
                _own_folder(_chapter_folder(os.getpid()))
                sys.argv[:] = ["-c", str(req), str(res)]  # as a started chapter's would be
                serve(req, res, {**config, **message.config, "token": message.token}, start)
            finally:
                os._exit(0)
        p._close(fds)
        chapters[pid] = message.token
        loop.send(p.Forked(pid))
        return True

    def kill(message: p.Kill, fds: list) -> bool:
        p._close(fds)
        if message.pid in chapters:
            procs.kill_tree(message.pid)
        return True

    def reset(message: p.Reset, fds: list) -> bool:
        p._close(fds)
        for pid in list(chapters):
            procs.kill_tree(pid)
        _kill_all_but_me()
        reap()
        _empty(os.environ.get("TMPDIR", "/tmp"))
        _empty("/dev/shm")  # writable where the zygote made it the student's own
        loop.send(p.ResetDone())
        return True

    loop.send(p.Ready(os.getpid(), os.getuid(), time.perf_counter() - start))
    loop.run({p.Fork: fork, p.Kill: kill, p.Reset: reset}, reap)
    _kill_all_but_me()
    os._exit(0)


def _kill_all_but_me() -> None:
    """Every process of the sandbox but this one and its init (PID 1). Only in a PID namespace
    of its own (the warm worker is PID 2 there under bubblewrap's init, or PID 1 itself when
    the zygote started it), never outside one."""
    me = os.getpid()
    if me not in (1, 2):
        return
    for _ in range(3):
        others = [pid for pid in procs.proc_table() if pid not in (1, me)]
        if not others:
            return
        for pid in others:
            procs.send(pid, signal.SIGSTOP)
        for pid in others:
            procs.send(pid, signal.SIGKILL)


def _chapter_folder(pid: int) -> str:
    """The working folder of the chapter child `pid`: its HOME, TMPDIR and current folder."""
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chapter-{pid}")


def _own_folder(folder: str) -> None:
    """Make `folder` this chapter's HOME, TMPDIR and current folder (several chapters of one
    student can run at once in one sandbox; each writes its files in a folder of its own)."""
    import tempfile

    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chdir(folder)
    os.environ.update(HOME=folder, TMPDIR=folder, MPLCONFIGDIR=os.path.join(folder, ".matplotlib"))
    tempfile.tempdir = None  # gettempdir() may have cached the worker's /tmp
    os.makedirs(os.environ["MPLCONFIGDIR"], exist_ok=True)


def _empty(folder: str, remove: bool = False) -> None:
    """Remove everything in `folder` (a chapter's files must not reach the next chapter), and
    with `remove` the folder itself."""
    import shutil

    def fix(func, path, _exc):
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            func(path)
        except OSError:
            pass

    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for name in entries:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, onerror=fix)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    if remove:
        try:
            os.rmdir(folder)
        except OSError:
            pass

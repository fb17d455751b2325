"""The warm worker: one per student sandbox, torch imported once; it never runs student code
itself, but forks a chapter child (`child.serve`) for each chapter the grader asks for, in a
folder of its own, on its control socket (`shared/protocol.py`)."""
from __future__ import annotations


import json
import os
import signal
import sys
import time

from . import procs
from .child import import_runtime, serve
from .prepare import PREIMPORT, prctl, prepare


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
    prepare(config)
    prctl(4, 0)   # PR_SET_DUMPABLE 0: the chapters (same uid) cannot ptrace or read this one
    prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of a chapter come back here and are killed
    import_all()
    serve_box(ctl_fd, config, start)


def import_all() -> None:
    import importlib

    for name in PREIMPORT:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    import_runtime()


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
        """os.fork; the child keeps none of the loop (its signal handling, its descriptors).
        What this process holds is frozen out of the garbage collector first (`gc.freeze`): a
        child's collections then never walk the inherited heap (torch's objects), which would
        write to, and so copy, most of its pages."""
        import gc

        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.ctl_fd, self.wake_r, self.wake_w):
                os.close(fd)
        return pid

    def run(self, handlers: dict, reap, others: dict | None = None) -> None:
        """handlers: message class -> handler(message, fds) -> whether it took the message
        (and so the fds that came with it). others: more sockets to wait on -> what to call
        when one is readable (the batch's first zygote's listening socket)."""
        import select

        p = self.p
        others = others or {}
        while True:
            try:
                ready, _, _ = select.select([self.ctl, self.wake_r, *others], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 4096)
                except OSError:
                    pass
            reap()
            for sock, call in others.items():
                if sock in ready:
                    call()
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


def serve_box(ctl_fd: int, config: dict, start: float) -> None:
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
            _chapter_child(fds, config, message, start)
        p._close(fds)
        chapters[pid] = message.token
        loop.send(p.Forked(pid))
        return True

    def kill(message: p.Kill, fds: list) -> bool:
        p._close(fds)
        if message.pid in chapters:
            procs.kill_tree(message.pid)
        return True

    own_namespace = config.get("own_pid_namespace", True)

    def reset(message: p.Reset, fds: list) -> bool:
        p._close(fds)
        for pid in list(chapters):
            procs.kill_tree(pid)
        _kill_all_but_me(own_namespace)
        reap()
        _empty(os.environ.get("TMPDIR", "/tmp"))
        if own_namespace:  # (the sandbox's own /dev/shm; the container mode's is the machine's)
            _empty("/dev/shm")
        loop.send(p.ResetDone())
        return True

    loop.send(p.Ready(os.getpid(), os.getuid(), time.perf_counter() - start))
    loop.run({p.Fork: fork, p.Kill: kill, p.Reset: reset}, reap)
    _kill_all_but_me(own_namespace)
    os._exit(0)


def _chapter_child(fds: list, config: dict, message, start: float) -> None:
    """In the process just forked for a chapter: its own session, output and folder, then the
    chapter child's loop (`child.serve`) on the request and response sockets, with the warm
    worker's config and the Fork `message`'s. Never returns: whatever happens, it exits here."""
    try:
        os.setsid()
        req, res, out = fds
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        prctl(36, 1)  # its own orphans stay below it, so killing it finds them
        _own_folder(_chapter_folder(os.getpid()))
        sys.argv[:] = ["-c", str(req), str(res)]  # as a started chapter's would be
        serve(req, res, {**config, **message.config, "token": message.token}, start)
    finally:
        os._exit(0)


def _kill_all_but_me(own_namespace: bool) -> None:
    """Every process of the sandbox but this one and its init (PID 1), in a PID namespace of its
    own (the warm worker is PID 2 there under bubblewrap's init, or PID 1 itself when the
    zygote started it). Outside one (the container mode), everything below this process: it
    and each chapter are child subreapers, so whatever a chapter started stays below them
    (what escaped, the pool kills: `SandboxPool._sweep`)."""
    me = os.getpid()
    if not own_namespace or me not in (1, 2):
        for pid in procs.children_of(me):
            procs.kill_tree(pid)
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

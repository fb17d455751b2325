"""The session's child process, one at a time: started, waited for until ready, killed.

`ChildSlot` forks it from the student's warm sandbox (bubblewrap, and the container mode as
root), or starts a new process (the fallback), and kills it with everything it started."""
from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
import weakref

from ..shared import protocol
from ..sandbox.limits import Limits
from ..sandbox import scratch
from ..sandbox.pool import SandboxPool
from ..sandbox.processes import Child
from ..sandbox.warm import SandboxDied
from .channel import Budget, Capture, Channel, Lost, LostKind


_LAUNCHING = threading.Lock()
_STOPPED = threading.Event()    # (set once, by `stop_children`)
_LAUNCHED = weakref.WeakSet()   # this process's new-process children (no sandbox pool)
STOPPED_WHY = "the grading process was not started: the grading was stopped"


def stop_children() -> None:
    """The command is stopping (Ctrl-C, SIGTERM: `cli`): kill every child this process started
    without a sandbox pool (the fallback, the container mode without root), and start no more,
    so the chapters' threads end at once instead of grading on until the student's budget is
    spent; the process then ends, writing nothing. (Children forked from a sandbox die with it:
    `SandboxPool.close`.) For the process's end only: a library caller's later grading would
    find no child started."""
    with _LAUNCHING:
        _STOPPED.set()
        children = list(_LAUNCHED)
    for child in children:
        child.stop()


class ChildSlot:
    """Where the session's current child lives (`child`, and `channel`, its pipes).

    Args:
        mode: the session's `SandboxMode`.
        sandboxes: the student's `SandboxPool` (bubblewrap, container as root; else None).
        hidden: what the child must not see (`policy.hidden_paths`), for a new process.
        headroom: RLIMIT_DATA above the child's start (memory cases), or 0.
        mapped_heap: with headroom, each large block mapped of its own (`runtime.prepare`).
        preimport: with headroom, libraries imported before the cap (`runtime.prepare.preimport`).
    """

    def __init__(self, mode, limits: Limits, sandboxes: SandboxPool | None, hidden, headroom: int,
                 mapped_heap: bool = False, preimport: tuple = ()):
        self.mode, self.limits, self.pool = mode, limits, sandboxes
        self.hidden = hidden
        # The memory case's child's settings (`runtime.prepare.set_limits`, `child.serve`), as the
        # child reads them, whether it is forked from a warm sandbox or started on its own.
        self.memory_case = {"data_headroom": int(headroom), "mapped_heap": bool(mapped_heap),
                            "preimport": list(preimport)} if headroom else {}
        self.box = None  # the warm sandbox the children are forked from (with a pool)
        self.child: Child | None = None
        self.channel: Channel | None = None
        self.workdir = scratch.mkdtemp("autograder-session-")
        os.chmod(self.workdir, 0o700)
        self.children = 0       # how many child processes were started
        self.startup_seconds: list[float] = []  # each child's start-up (Python + torch import)

    def alive(self) -> bool:
        """Whether the current child can still take a call."""
        return self.child is not None and self.child.alive() and not self.channel.results_eof

    def spawn(self) -> str | None:
        """Start a child and wait until it is ready; None on success, else why not."""
        self.kill()
        last = ""
        for _ in range(2):  # one retry: a start-up failure is not the student's doing
            t0 = time.monotonic()
            try:
                child = self._launch(t0 + self.limits.startup_timeout)
            except OSError as e:
                last = f"the grading process could not be started ({e})"
                continue
            if isinstance(child, str):
                last = child
                continue
            channel = Channel(child, self.limits)
            startup = channel.captures[0] = Capture(Budget(4096))
            self.child, self.channel = child, channel
            self.children += 1
            event = channel.receive(t0 + self.limits.startup_timeout)
            if isinstance(event, protocol.ChildReady):
                self.startup_seconds.append(time.monotonic() - t0)
                return None
            self.kill()
            channel.flush_output()
            detail = startup.text().strip().splitlines()[-3:]
            timed_out = isinstance(event, Lost) and event.kind == LostKind.TIMEOUT
            why = ("did not start within %g s" % self.limits.startup_timeout
                   if timed_out else child.exit_description())
            last = f"the grading process {why}" + (": " + " | ".join(detail) if detail else "")
        return last

    def _launch(self, deadline: float):
        """A new child (with a pool: forked from the student's warm sandbox; else a new
        process), or why the sandbox could not start."""
        token = secrets.token_hex(16)
        if self.pool is None:
            if self.workdir:  # (the container mode removes a killed child's files: its folder too)
                os.makedirs(self.workdir, mode=0o700, exist_ok=True)
            with _LAUNCHING:  # (one started while `stop_children` runs is killed by it or not started)
                if _STOPPED.is_set():
                    return STOPPED_WHY
                child = Child(self.mode, self.limits, self.hidden, self.workdir or "/", token,
                              self.memory_case)
                _LAUNCHED.add(child)
                return child
        if self.box is not None and not self.box.alive():
            self._give_back()  # killed by what the student did: start a new one
        if self.box is None:
            self.box = self.pool.acquire()
        why = self.box.wait_ready(deadline)
        if why:
            self._give_back()
            return why
        try:
            return self.box.fork(token, self.memory_case)
        except SandboxDied as e:
            self._give_back()
            return f"the grading process could not be started ({e})"

    def _give_back(self) -> None:
        self.pool.release(self.box)
        self.box = None

    def kill(self) -> None:
        """Kill the current child (and what it started), keeping what it printed."""
        if self.child is not None:
            self.child.kill()
            if self.channel is not None:
                self.channel.drain_output(self.limits.drain_cap)
                self.channel.flush_output()
        self.child = None

    def died_shared(self) -> bool:
        """Whether the child died with its sandbox while another chapter was in it too: either
        may have killed it, so what was running is run again, once (see `SandboxPool`)."""
        return self.box is not None and self.box.died_shared and self.box.dead

    def close(self) -> None:
        """Kill the child, give the sandbox back, remove the session's files."""
        self.kill()
        if self.box is not None:
            self._give_back()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

"""Sandboxes held open on a control socket: a student's warm worker (torch imported once per
student), the batch worker's zygote (torch imported once per worker, each student forked from
it), and the chapter children forked from either."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

from ..runtime import procs
from .bwrap import bwrap_command, popen_bwrap
from .limits import Limits, NOBODY, describe_exit, time_now
from .policy import SandboxPolicy, python_argv, sandbox_policy
from .modes import SandboxMode, probe_bubblewrap
from .processes import close_pipes, killpg


class SandboxDied(OSError):
    """The student's warm worker (and so the sandbox) is gone or stopped answering."""


class _Bwrap:
    """A sandbox's bubblewrap process (`poll`, `stop`)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen, self.pid = popen, popen.pid

    @classmethod
    def start(cls, policy: SandboxPolicy, entry: str, config: dict, sock_fd: int, out_fd: int,
              workdir: str, more_fds: tuple = ()) -> "_Bwrap":
        """Run `autograder.runtime.<entry>.<entry>` in the sandbox `policy` describes, with the
        control socket, its `config` and the output pipe (and `more_fds` the config names)."""
        argv = python_argv(policy.runtime, entry, [str(sock_fd), json.dumps(config)],
                           module=f"runtime.{entry}")
        return cls(popen_bwrap(
            bwrap_command(policy, argv, probe_bubblewrap()[2]), stdin=subprocess.DEVNULL,
            stdout=out_fd, stderr=out_fd, pass_fds=(sock_fd, *more_fds), env=policy.environment(config["token"]),
            cwd=workdir, start_new_session=True, close_fds=True))

    def poll(self) -> int | None:
        return self.popen.poll()

    def stop(self, wait: float) -> None:
        """Kill bwrap: the PID namespace, and every process in it, goes with it."""
        procs.send(self.pid, signal.SIGKILL)
        killpg(self.pid)
        try:
            self.popen.wait(wait)
        except subprocess.TimeoutExpired:
            pass


class _Direct:
    """A container-mode sandbox's warm worker (`poll`, `stop`): a process of its own, as the
    student's uid (it drops to it itself, `runtime.prepare`), with no namespaces around it."""

    def __init__(self, popen: subprocess.Popen, token: str, rounds: int):
        self.popen, self.pid, self.token, self.rounds = popen, popen.pid, token, rounds

    @classmethod
    def start(cls, policy: SandboxPolicy, config: dict, sock_fd: int, out_fd: int,
              rounds: int) -> "_Direct":
        # (it starts as root: in "/", not in `workdir`, which is the student's; each chapter
        # works in a folder of its own there, and HOME and TMPDIR name it)
        argv = python_argv(policy.runtime, "warm", [str(sock_fd), json.dumps(config)], module="runtime.warm")
        return cls(subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=out_fd, pass_fds=(sock_fd,),
            env=policy.environment(config["token"]), cwd="/", start_new_session=True,
            close_fds=True), config["token"], rounds)

    def poll(self) -> int | None:
        return self.popen.poll()

    def stop(self, wait: float) -> None:
        """Kill the worker, everything below it (it and each chapter are child subreapers) and
        anything carrying its token; the pool kills whatever else of the uid is left. Once the
        worker is reaped, nothing is signalled by its pid: the pool's sweep of the uid remains."""
        from .processes import kill_fallback_tree

        if self.popen.poll() is not None:  # reaped: its pid may be another process's by now
            return
        kill_fallback_tree(self.pid, self.token, self.rounds)
        try:
            self.popen.wait(wait)
        except subprocess.TimeoutExpired:
            pass


class _Controlled:
    """A process in a sandbox that the grader drives over a control socket (`protocol`): a
    student's warm worker, or a batch worker's zygote.

    `launch(sock_fd, out_fd)` starts it and returns its process (`poll`, `stop`). It is called
    from the listener thread, which lives exactly as long as the sandbox: bubblewrap's
    --die-with-parent ties bwrap's life to the *thread* that started it, and the thread that
    asked for a sandbox may end before the sandbox does."""

    what = "the grading process"

    def __init__(self, limits: Limits, launch):
        from ..shared import protocol

        self._p = protocol
        self.limits = limits
        self.started = time_now()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = os.pipe()
        self.output = bytearray()  # the process's own output (start-up errors), last 4 KiB
        self._cond = threading.Condition()
        self._replies: list = []
        self.ready = None          # the Ready message
        self.dead = False
        self.proc = None
        self._request_lock = threading.Lock()
        self.sock, self._out_fd = mine, out_r
        started: list = []
        spawned = threading.Event()

        def spawn() -> bool:
            try:
                self.proc = launch(theirs.fileno(), out_w)
                started.append(None)
            except OSError as e:
                started.append(e)
            finally:
                theirs.close()
                os.close(out_w)
                spawned.set()
            return started[0] is None

        threading.Thread(target=self._listen, args=(spawn,), daemon=True).start()
        spawned.wait()
        if started[0] is not None:
            mine.close()
            os.close(out_r)
            raise started[0]

    def _on_message(self, message) -> None:
        """A message from the process (called with the condition held)."""
        if isinstance(message, self._p.Ready):
            self.ready = message
        else:
            self._replies.append(message)

    # -- the listener thread --------------------------------------------------------------
    def _listen(self, spawn) -> None:
        import select

        if not spawn():
            return
        p = self._p
        fds = [self.sock.fileno(), self._out_fd]
        try:
            while True:
                ready, _, _ = select.select(fds, [], [])
                if self._out_fd in ready:
                    data = os.read(self._out_fd, 1 << 16)
                    if not data:
                        fds.remove(self._out_fd)
                    self.output = (self.output + data)[-4096:]
                if self.sock.fileno() in ready:
                    message, extra = p.receive(self.sock)
                    p._close(extra)
                    if message is None:
                        break
                    with self._cond:
                        self._on_message(message)
                        self._cond.notify_all()
        except (OSError, ValueError):  # ProtocolError is a ValueError: garbage ends the sandbox
            pass
        self.kill()
        try:
            os.close(self._out_fd)
        except OSError:
            pass

    def _wait(self, predicate, timeout: float):
        with self._cond:
            return self._cond.wait_for(lambda: predicate() or self.dead, timeout)

    # -- requests -------------------------------------------------------------------------
    def wait_ready(self, deadline: float) -> str | None:
        """None once the process has imported everything, else why it did not start."""
        self._wait(lambda: self.ready is not None, max(0.0, deadline - time_now()))
        if self.ready is not None and not self.dead:
            return None
        timed_out = not self.dead
        self.kill()
        if isinstance(self.proc, _SpawnedBox):  # its setup failed: later students do without
            self.proc.zygote.broken = True
        detail = self.output.decode("utf-8", "replace").strip().splitlines()[-3:]
        why = (f"did not start within {self.limits.startup_timeout:g} s" if timed_out
               else describe_exit(self.proc.poll(), self.limits, True))
        return f"{self.what} {why}" + (": " + " | ".join(detail) if detail else "")

    def _request(self, message, fds=(), reply=None, timeout: float | None = None):
        """Send a request; with `reply` (a message class) wait for it. SandboxDied if the
        process is gone or does not answer within `timeout` (default `control_timeout`; it is
        killed then)."""
        p = self._p
        with self._request_lock:
            if self.dead:
                raise SandboxDied("the sandbox is gone")
            try:
                p.send(self.sock, message, fds)
            except OSError as e:
                self.kill()
                raise SandboxDied(f"the sandbox is gone ({e})") from None
            if reply is None:
                return None
            found = []

            def got():
                for i, m in enumerate(self._replies):
                    if isinstance(m, reply):
                        found.append(self._replies.pop(i))
                        return True
                return False

            self._wait(got, self.limits.control_timeout if timeout is None else timeout)
            if not found:
                self.kill()
                raise SandboxDied(f"{self.what} stopped answering")
            return found[0]

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the process and its sandbox. Idempotent."""
        if self.proc is not None:
            self.proc.stop(self.limits.kill_wait)
        with self._cond:
            self.dead = True
            self._cond.notify_all()
        try:  # (shut down first: a close alone leaves the socket open while the listener
            # thread's select holds it, and a zygote's clone ends only on its end of stream)
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


class WarmSandbox(_Controlled):
    """One student's sandbox holding a warm worker (`autograder.runtime.warm`) that has imported
    torch once and forks a fresh child per chapter (`fork`), each working in a folder of its own
    under /tmp that the worker removes when that child ends. Several chapters of the student may
    run in it at once (see `SandboxPool`); once none is left, `reset` kills whatever they left
    and empties /tmp before the next.

    The sandbox is a bubblewrap sandbox of its own, or, given a `Zygote` (batch grading as
    root), namespaces of its own forked from the zygote, whose torch is already imported. In the
    container mode (as root, no namespaces) it is the worker process alone, as the student's
    uid, with `workdir` (the student's own) as its HOME and TMPDIR."""

    def __init__(self, limits: Limits, hidden: list[str], workdir: str, zygote: "Zygote | None" = None,
                 uid: int = NOBODY, mode: SandboxMode = SandboxMode.BUBBLEWRAP):
        import secrets

        self.mode = SandboxMode(mode)
        self.uid = uid  # (as root: the student's own, see `autograder.sandbox.uids`)
        policy = sandbox_policy(self.mode, limits, hidden, uid=uid, home=workdir)
        config = policy.child_config(secrets.token_hex(16))
        self.exits: dict[int, int] = {}
        # kept by the SandboxPool: chapters in it now, whether it is being reset
        self.users, self.resetting = 0, False
        self.died_shared = False   # it died while more than one chapter was in it
        if self.mode == SandboxMode.CONTAINER:
            def launch(sock_fd, out_fd):
                return _Direct.start(policy, config, sock_fd, out_fd, limits.kill_rounds)
        elif zygote is not None:
            def launch(sock_fd, out_fd):
                return zygote.spawn(config["token"], policy.box_config(config["token"]), sock_fd, out_fd)
        else:
            def launch(sock_fd, out_fd):
                return _Bwrap.start(policy, "warm", config, sock_fd, out_fd, workdir)
        super().__init__(limits, launch)

    def _on_message(self, message) -> None:
        if isinstance(message, self._p.Exited):
            self.exits[message.pid] = message.returncode
        else:
            super()._on_message(message)

    def fork(self, token: str, memory_case: dict | None = None) -> "ForkedChild":
        """A fresh child for one chapter, forked from the warm worker (with `memory_case`, the
        memory case's child: its settings, `session.child_slot.ChildSlot.memory_case`)."""
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            config = {"threads": self.limits.threads, "cuda_fraction": self.limits.gpu_share}
            config.update(memory_case or {})
            # (the first chapter's Fork also waits for the imports the warm worker leaves until
            # then, `runtime/warm.py`: a start-up's timeout, not a control message's)
            forked = self._request(self._p.Fork(token, config),
                                   (req_r, res_w, out_w), self._p.Forked, self.limits.startup_timeout)
        except BaseException:
            for fd in (req_w, res_r, out_r):
                os.close(fd)
            raise
        finally:
            for fd in (req_r, res_w, out_w):
                os.close(fd)
        return ForkedChild(self, forked.pid, token, req_w, res_r, out_r)

    def kill_child(self, pid: int) -> None:
        """Kill a chapter's child and its processes; the whole sandbox if the worker fails."""
        if self.dead:
            self.kill()
            return
        if pid in self.exits:
            return
        try:
            self._request(self._p.Kill(pid))
        except SandboxDied:
            return
        if not self._wait(lambda: pid in self.exits, self.limits.control_timeout):
            self.kill()

    def reset(self) -> bool:
        """Kill every process but the warm worker and empty /tmp; False if that failed (the
        sandbox is then killed)."""
        try:
            self._request(self._p.Reset(), reply=self._p.ResetDone)
            return True
        except SandboxDied:
            return False

    def kill(self) -> None:
        if not self.dead and self.users > 1:
            self.died_shared = True
        super().kill()


class Zygote(_Controlled):
    """A batch worker's zygote (`autograder.runtime.zygote`): one sandbox that imports torch once and
    starts every student's warm worker by forking it into namespaces of its own, instead of a
    bubblewrap sandbox and a torch import per student. Only where the grader runs as root
    (`usable`); a student's sandbox that it cannot start is started the usual way."""

    what = "the zygote"

    def __init__(self, limits: Limits, hidden: list[str], workdir: str, listener=None):
        """With `listener` (a listening SOCK_SEQPACKET socket, in a folder only root reaches):
        the batch's first zygote, which forks a zygote for each worker that connects there
        (`cloned`). The caller closes its own copy once this returns."""
        import secrets

        policy = sandbox_policy(SandboxMode.BUBBLEWRAP, limits, hidden, keep_root=True)
        config = policy.child_config(secrets.token_hex(16))
        more = (listener.fileno(),) if listener is not None else ()
        if more:
            config["listen_fd"] = more[0]

        def launch(sock_fd, out_fd):
            return _Bwrap.start(policy, "zygote", config, sock_fd, out_fd, workdir, more)
        self._start(limits, launch)

    def _start(self, limits: Limits, launch) -> None:
        self.ended: dict[str, int] = {}  # a student's sandbox (its token) -> how it ended
        self.broken = False  # a sandbox it started failed before answering: start no more
        super().__init__(limits, launch)

    @classmethod
    def cloned(cls, limits: Limits, address: str) -> "Zygote":
        """A zygote of this worker's own, forked by the batch's first zygote (listening at
        `address`): no sandbox or torch import of its own. OSError if it cannot connect."""
        import secrets

        from ..shared import protocol

        def launch(sock_fd, out_fd):
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.settimeout(limits.control_timeout)
                conn.connect(address)
                protocol.send(conn, protocol.Clone(secrets.token_hex(16)), (sock_fd, out_fd))
            return _Clone()
        zygote = cls.__new__(cls)
        zygote._start(limits, launch)
        return zygote

    @staticmethod
    def usable(mode: "SandboxMode") -> bool:
        return mode == SandboxMode.BUBBLEWRAP and sys.platform == "linux" and os.geteuid() == 0

    def _on_message(self, message) -> None:
        if isinstance(message, self._p.BoxEnded):
            self.ended[message.token] = message.returncode
        else:
            super()._on_message(message)

    def spawn(self, token: str, config: dict, sock_fd: int, out_fd: int) -> "_SpawnedBox":
        """A student's warm worker in fresh namespaces, serving `sock_fd`. SandboxDied if the
        zygote did not start or does not answer."""
        why = self.wait_ready(time_now() + self.limits.startup_timeout)
        if why:
            raise SandboxDied(why)
        self._request(self._p.Spawn(token, config), (sock_fd, out_fd), self._p.Spawned)
        return _SpawnedBox(self, token)

    def usable_now(self) -> bool:
        return not self.dead and not self.broken

    def kill_box(self, token: str) -> None:
        if token in self.ended:
            return
        try:
            self._request(self._p.KillBox(token))
        except SandboxDied:  # the zygote is gone, and every student's sandbox with it
            pass


class _Clone:
    """A zygote forked by the batch's first zygote (`Zygote.cloned`; `poll`, `stop`): it ends,
    killing every student's sandbox it started, when its control socket closes, which `kill`
    does right after `stop`; the first zygote's sandbox ends with the batch."""

    pid = None

    def __init__(self):
        self.stopped = False

    def poll(self) -> int | None:
        return -signal.SIGKILL if self.stopped else None

    def stop(self, wait: float) -> None:
        self.stopped = True


class _SpawnedBox:
    """A student's sandbox started by a `Zygote` (`poll`, `stop`): the zygote's forked
    process that waits for the student's warm worker (PID 1 of the student's namespaces),
    named by its token."""

    def __init__(self, zygote: Zygote, token: str):
        self.zygote, self.token = zygote, token

    def poll(self) -> int | None:
        rc = self.zygote.ended.get(self.token)
        if rc is None and self.zygote.dead:
            return 128 + signal.SIGKILL
        return rc

    def stop(self, wait: float) -> None:
        """The student's warm worker dies with the process the zygote kills, and every process
        of the student's PID namespace with it."""
        self.zygote.kill_box(self.token)
        self.zygote._wait(lambda: self.token in self.zygote.ended, wait)


class ForkedChild:
    """A chapter's child forked by a `WarmSandbox`: the interface of `Child`."""

    def __init__(self, box: WarmSandbox, pid: int, token: str, req_fd: int, res_fd: int,
                 out_fd: int):
        self.box, self.pid, self.token = box, pid, token
        self.mode, self.limits = box.mode, box.limits
        self.req_fd, self.res_fd, self.out_fd = req_fd, res_fd, out_fd
        for fd in (req_fd, res_fd, out_fd):
            os.set_blocking(fd, False)
        self.closed = False

    def returncode(self) -> int | None:
        rc = self.box.exits.get(self.pid)
        if rc is None and self.box.dead:
            rc = self.box.proc.poll()
            return -signal.SIGKILL if rc is None else rc
        return rc

    def alive(self) -> bool:
        return self.returncode() is None

    def wait(self, timeout: float) -> int | None:
        self.box._wait(lambda: self.pid in self.box.exits, timeout)
        return self.returncode()

    def kill(self) -> None:
        self.box.kill_child(self.pid)
        close_pipes(self)

    def exit_description(self) -> str:
        return describe_exit(self.returncode(), self.limits, self.box.dead)

"""One chapter's child process in the fallback mode (and the container mode's, where a session
is given no pool), launched with its three pipes, and killed with everything it started.
(bubblewrap's and the container mode's children are forked from a warm sandbox: `warm.py`.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess

from ..runtime import procs
from .limits import Limits, describe_exit
from .policy import python_argv, sandbox_policy, student_uid


class Child:
    """One launched worker process and its three pipes (requests in, results out, output out),
    in the "container" or the "fallback" mode.

    The parent's ends are non-blocking: `req_fd` (write), `res_fd` and `out_fd` (read).
    """

    def __init__(self, mode: str, limits: Limits, hidden: list[str], workdir: str, token: str,
                 memory_case: dict | None = None):
        if str(mode) not in ("container", "fallback"):
            raise ValueError(f"a {mode} child is forked from a warm sandbox (sandbox.warm)")
        self.mode, self.limits, self.token = mode, limits, token
        req_r, self.req_fd = os.pipe()
        self.res_fd, res_w = os.pipe()
        self.out_fd, out_w = os.pipe()
        policy = sandbox_policy(mode, limits, hidden, home=workdir)
        self.lease = None
        if policy.as_root and mode == "container":  # a uid of its own: every process of it is this child's
            self.lease = student_uid()
            policy = policy.with_uid(self.lease.uid) if self.lease else policy
        if policy.drops_itself:  # the workdir is the student's own
            os.chown(workdir, policy.uid, policy.uid)
        config = policy.child_config(token)
        config.update(memory_case or {})  # (a memory case's child: `session.child_slot`)
        argv = python_argv(policy.runtime, "main", [str(req_r), str(res_w), json.dumps(config)])
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                pass_fds=(req_r, res_w), env=policy.environment(token), cwd=workdir,
                start_new_session=True, close_fds=True)
        finally:
            for fd in (req_r, res_w, out_w):
                os.close(fd)
        for fd in (self.req_fd, self.res_fd, self.out_fd):
            os.set_blocking(fd, False)
        self.pid = self.proc.pid
        self.closed = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Kill the child and everything it started, from another thread than the one that
        reads its pipes: they stay open until that thread sees the end and calls `kill`. A
        child that has ended (reaped: its pid may be another process's now) may have left
        processes holding its pipes: those carrying its token are killed."""
        lease = self.lease  # (read once: the reading thread's `kill` may release it meanwhile)
        kill_fallback_tree(self.proc.pid if self.alive() else None, self.token, self.limits.kill_rounds)
        if lease is not None:
            procs.kill_uid(lease.uid, self.limits.kill_rounds)

    def kill(self) -> None:
        """Kill the child and everything it started; close the pipes. Idempotent."""
        kill_fallback_tree(self.proc.pid, self.token, self.limits.kill_rounds)
        if self.lease is not None:  # whatever escaped the tree (a double fork, a new session)
            procs.kill_uid(self.lease.uid, self.limits.kill_rounds)
        self.wait(self.limits.kill_wait)
        close_pipes(self)
        if self.lease is not None:
            from .uid_cleanup import release_clean

            lease, self.lease = self.lease, None
            release_clean(lease)  # its files in /tmp, /var/tmp, /dev/shm, its keyrings

    def exit_description(self) -> str:
        """Why the child ended, in words."""
        return describe_exit(self.proc.poll(), self.limits)


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _marked(token: str, pids) -> set[int]:
    """Processes whose environment carries this child's AUTOGRADER_CHILD token."""
    needle = f"AUTOGRADER_CHILD={token}".encode()
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    out.add(pid)
        except OSError:
            pass
    return out


def kill_fallback_tree(root_pid: int | None, token: str, rounds: int = Limits.kill_rounds) -> None:
    """Stop, then kill, the child, its descendants (orphans included: the worker is a child
    subreaper), its process group, and any process carrying its environment token (a daemon
    that escaped both); with no `root_pid` (a child that has ended), only those carrying the
    token. Without /proc only the process group is killed."""
    procs.kill_tree(root_pid, rounds, also=lambda table: _marked(token, table))


# --------------------------------------------------------------------------- the warm worker

def close_pipes(child) -> None:
    """Close a child's three pipe ends, once (a child may be killed more than once)."""
    if not child.closed:
        child.closed = True
        for fd in (child.req_fd, child.res_fd, child.out_fd):
            try:
                os.close(fd)
            except OSError:
                pass

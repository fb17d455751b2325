"""Processes as /proc shows them, and killing a process with everything it started.

Shared by the grader (the fallback mode's children, `autograder.sandbox.processes`) and the warm worker
inside the sandbox (its chapters, `autograder.runtime.child`): standard library only, since it is
staged into the sandbox with the worker.
"""
from __future__ import annotations

import os
import signal


def proc_table() -> dict[int, int]:
    """pid -> parent pid, from /proc (empty where there is no /proc)."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read()
            table[int(e)] = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return table


def children_of(pid: int) -> list[int]:
    return [c for c, parent in proc_table().items() if parent == pid]


def send(pid: int, sig: int) -> None:
    """os.kill, where a process that is gone (or not ours) is no error."""
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    end = stat.rindex(b")")  # (the name before it is the process's to choose)
    return stat[end + 2:end + 3] != b"Z"


def kill_tree(root: int | None, rounds: int = 20, also=None) -> None:
    """Stop, then kill, the process `root`, its descendants, its process group, and with
    `also` (table -> pids) the processes it names. Stopped first, round after round until no
    new one appears (at most `rounds`), so none can fork away while the tree is walked. Never
    this process itself. Without /proc only the process group and `root` are killed. With
    root None (a root already reaped, whose pid may be another process's now), only those
    `also` names."""
    if root is not None and root <= 0:
        raise ValueError(f"no process tree has the root {root}")  # (kill(-1) is every process)
    me = os.getpid()
    found: set[int] = set()
    for _ in range(rounds):
        table = proc_table()
        new = {root} if root is not None and (root in table or not table) else set()
        frontier = [root] if root is not None else []
        while frontier:
            q = frontier.pop()
            for pid, ppid in table.items():
                if ppid == q and pid not in new:
                    new.add(pid)
                    frontier.append(pid)
        if also is not None:
            new |= also(table)
        new.discard(me)
        new -= found
        if not new:
            break
        for pid in new:
            send(pid, signal.SIGSTOP)
        found |= new
    if root is not None:
        try:
            os.killpg(root, signal.SIGKILL)
        except OSError:
            pass
        found.add(root)
    for pid in found:
        if pid != me:
            send(pid, signal.SIGKILL)


def ended_children():
    """(pid, returncode) for each child of this process that has ended, without waiting
    (Popen's convention: -N for signal N). Reaping them keeps zombies from using up the
    process limit."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except OSError:  # (ChildProcessError: no children left)
            return
        if pid == 0:
            return
        yield pid, (-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def status_field(data: bytes, name: bytes) -> str | None:
    """A field of a /proc/PID/status read as bytes ("Uid" -> "0\t0\t0\t0"), from the line that
    begins with it. Not from a text reading: the student names their process, the name's line
    comes first, and a carriage return or bytes that are not UTF-8 there fooled one."""
    at = data.find(b"\n" + name + b":")  # (a newline in the name is shown as the two bytes \n)
    if at < 0:
        return None
    at += len(name) + 2
    end = data.find(b"\n", at)
    return data[at:end if end >= 0 else len(data)].decode("ascii", "replace").strip()


def _live_of_uid(uid: int):
    """(pid, its status fields) of every live process whose real or effective uid is `uid`,
    from one reading of each status. A zombie runs nothing, and where PID 1 does not reap,
    zombies would make every `kill_uid` and sweep run all their rounds; but a "zombie" whose
    other threads still run (its main thread ended with the raw exit syscall) is live: killing
    it kills them. The status is read as bytes (`status_field`: a carriage return, or bytes
    that are not UTF-8, in the name the student gave their process hid it from a reading as
    text: reviewer, stop 41); only the uid's processes have more than their Uid looked at.
    Fields: State, Threads, PPid."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    wanted = str(uid)
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/status", "rb") as f:
                data = f.read()
            if wanted not in (status_field(data, b"Uid") or "").split()[:2]:
                continue
            fields = {k: status_field(data, k.encode()) or "" for k in ("State", "Threads", "PPid")}
            if fields["State"].split()[0] == "Z" and int(fields["Threads"] or 1) <= 1:
                continue
        except (OSError, ValueError, IndexError):
            continue
        yield int(e), fields


def parents_of_uid(uid: int) -> dict[int, int]:
    """pid -> parent pid of every live process (`_live_of_uid`) of `uid`, from one reading of
    each process's status (so a pid and its parent agree)."""
    out = {}
    for pid, fields in _live_of_uid(uid):
        try:
            out[pid] = int(fields["PPid"])
        except (KeyError, ValueError):
            pass
    return out


def pids_of_uid(uid: int) -> set[int]:
    """Every live process (`_live_of_uid`) whose real or effective uid is `uid`."""
    return {pid for pid, _ in _live_of_uid(uid)}


def kill_uid(uid: int, rounds: int = 20, backstop: bool = True) -> None:
    """Stop, then kill, every process of `uid` (a student's own uid: everything they started,
    wherever it went), round after round until a round finds none it has not killed already
    (at most `rounds`). A killed process runs no more code, so it cannot start another; one
    started before the kill reached its parent is new in the next round. (Waiting for the
    killed ones to be gone as well made each student's end spin through all 20 rounds while
    their namespaces were torn down: 0.13 s of a batch worker's CPU a student.) Then, with
    `backstop`, `_kill_all_as` (a fork of this process, about 17 ms): for a uid whose processes
    share this PID namespace; in a student's own namespace, its end killed them all already."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = pids_of_uid(uid) - {os.getpid()} - killed
        if not pids:
            break
        for pid in pids:
            send(pid, signal.SIGSTOP)
        for pid in pids:
            send(pid, signal.SIGKILL)
        killed |= pids
    if backstop:
        _kill_all_as(uid)


def as_uid(uid: int, action) -> int:
    """Run `action()` (plain system calls only) in a forked process that is `uid`, and wait
    for it: a keyring belongs to its uid, whose processes alone reach it. Its exit status."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            status = int(action() or 0)
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _kill_all_as(uid: int) -> None:
    """kill(-1, SIGKILL) from a process of `uid`: the kernel signals every process of the uid
    at once, which a scan of /proc cannot do for one that forks and exits over and over (its pid
    changes between the listing and the reading: reviewer, stop 41). As root only, for a uid
    that is neither root's nor this process's (kill(-1) spares the caller, nothing else)."""
    if not hasattr(os, "fork") or os.geteuid() != 0 or uid in (0, os.getuid()):
        return
    try:
        as_uid(uid, lambda: os.kill(-1, signal.SIGKILL))
    except ChildProcessError:
        pass

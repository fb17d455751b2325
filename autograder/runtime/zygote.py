"""The zygote: a batch worker's sandbox that imports torch once and starts every student's
warm worker by forking it into namespaces of its own.

Without it, each student's sandbox starts a fresh Python that imports torch (about 2 s of CPU),
and in a batch that is most of what a student costs. The zygote is started by
`autograder.sandbox.warm.Zygote` in a bubblewrap sandbox built exactly like a student's (the same
read-only view of the system, no repository, solutions or results, no network), except that it
keeps root's capabilities there: it needs them to make namespaces and mounts. It never runs
student code. For each `Spawn` it forks a process that

  1. leaves the zygote's mount, PID, network, IPC and UTS namespaces for new ones (`unshare`);
  2. forks the student's warm worker, PID 1 of the new PID namespace (when it ends, the kernel
     kills every process of the student's), and waits for it, reporting its end;
  3. in the warm worker: mounts a fresh /tmp, /dev/shm, /dev/pts and /proc (which shows this
     student's processes only; /proc/sys read-only, as bubblewrap does) and brings up its own
     loopback (the mounts as the grader's policy lists them), then becomes the student's uid
     with no capabilities at all (bounding set, ambient and inheritable cleared, no_new_privs, checked
     in /proc/self/status before anything else happens), and only then serves its control
     socket (`autograder.runtime.child.warm.serve_box`).

So two students never share a /tmp, a process table, a loopback interface or IPC objects, and
neither can see, signal or trace the zygote. Standard library only (staged into the sandbox).
This needs the zygote to be real root inside its sandbox, so it is used only when the grader
runs as root (Gradescope, CI, containers); elsewhere every student gets a bubblewrap sandbox
of their own started from scratch, as with `grade`.

`batch` starts the first zygote itself, with a listening socket only root can reach; each
batch worker gets a zygote of its own from there (`Clone`), a fork of the first: one sandbox
and one torch import for the whole batch, begun while the command imports torch.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time

from . import procs
from ..shared.mounts import Mount

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RDONLY = 2, 4, 8, 1
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")  # read-only, as bubblewrap leaves them

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(OSError):
    """A step of making a student's namespaces failed (the box exits; the grader says why)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _prctl(option: int, arg: int, what: str) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), what)


def zygote(argv: list[str]) -> None:
    """Started in the zygote's sandbox as ... -c "...; zygote(sys.argv[1:])" CONTROL CONFIG."""
    from . import warm as worker

    start = time.perf_counter()
    ctl_fd, config = int(argv[0]), json.loads(argv[1])
    sys.path[:] = config["sys_path"]
    _prctl(PR_SET_DUMPABLE, 0, "not dumpable")
    worker.import_all()
    _serve(ctl_fd, start, config.get("listen_fd"))


def _serve(ctl_fd: int, start: float, listen_fd: int | None = None) -> None:
    """The zygote's loop on its control socket: Spawn and KillBox until the socket closes, then
    every student's sandbox it started is killed. With `listen_fd` (the batch's first zygote):
    each connection there brings a Clone, answered with a zygote of the worker's own (`_clone`)."""
    import socket

    from . import warm as worker
    from ..shared import protocol as p

    loop = worker.ControlLoop(ctl_fd)
    boxes: dict[int, str] = {}  # pid -> the box's token (the grader names boxes by token)
    clones: list[int] = []
    others = {}
    if listen_fd is not None:
        listener = socket.socket(fileno=listen_fd)
        others[listener] = lambda: _clone(loop, listener, clones)

    def reap() -> None:
        for pid, returncode in procs.ended_children():
            token = boxes.pop(pid, None)
            if token is not None:
                loop.send(p.BoxEnded(token, returncode))
            elif pid in clones:
                clones.remove(pid)

    def spawn(message: p.Spawn, fds: list) -> bool:
        if len(fds) != 2:
            return False
        try:
            pid = loop.fork()
        except OSError:  # (no process to be had now: that sandbox ended before it began)
            p._close(fds)
            loop.send(p.BoxEnded(message.token, 71))
            loop.send(p.Spawned(message.token, 0))
            return True
        if pid == 0:
            try:
                _start_box(fds[0], fds[1], message.config, message.token, time.perf_counter())
            except BaseException as e:  # noqa: BLE001 - said on the box's output, then gone
                try:
                    os.write(2, f"the sandbox could not be set up: {e}\n".encode())
                finally:
                    os._exit(71)
            os._exit(0)
        p._close(fds)
        boxes[pid] = message.token
        loop.send(p.Spawned(message.token, pid))
        return True

    def kill_box(message: p.KillBox, fds: list) -> bool:
        p._close(fds)
        for pid, token in boxes.items():
            if token == message.token:
                procs.send(pid, signal.SIGKILL)
        return True

    loop.send(p.Ready(os.getpid(), os.getuid(), time.perf_counter() - start))
    loop.run({p.Spawn: spawn, p.KillBox: kill_box}, reap, others)
    for pid in [*boxes, *clones]:
        procs.send(pid, signal.SIGKILL)
    os._exit(0)


def _clone(loop, listener, clones: list[int]) -> None:
    """A batch worker's connection: its Clone brings the worker's control socket and output
    pipe; a fork of this zygote serves them (`_serve`, with nothing of this one's: its control
    socket, its listener). What is not a Clone with its two fds is dropped."""
    from ..shared import protocol as p

    try:
        conn, _ = listener.accept()
    except OSError:
        return
    with conn:
        conn.settimeout(5.0)  # (a worker of the grader's own: it sends at once)
        try:
            message, fds = p.receive(conn)
        except (p.ProtocolError, OSError):
            return
        if not isinstance(message, p.Clone) or len(fds) != 2:
            p._close(fds)
            return
        try:
            pid = loop.fork()
        except OSError:  # (the worker sees its socket's end and starts a zygote of its own)
            p._close(fds)
            return
        if pid == 0:
            try:
                listener.close()
                conn.close()
                ctl_fd, out_fd = fds
                os.dup2(out_fd, 1)
                os.dup2(out_fd, 2)
                os.close(out_fd)
                _serve(ctl_fd, time.perf_counter())
            finally:
                os._exit(0)
        p._close(fds)
        clones.append(pid)


def _start_box(ctl_fd: int, out_fd: int, config: dict, token: str, start: float) -> None:
    """In the forked process (still root): new namespaces, then the student's warm worker as
    PID 1 of the new PID namespace; wait for it and exit as it did (128+N for signal N, the
    convention bubblewrap uses)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    alive_r, alive_w = os.pipe()  # the box sees EOF here once this process is gone
    keep = {0, 1, 2, ctl_fd, alive_r, alive_w}
    for fd in _open_fds():
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
           "unshare")
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        _box(ctl_fd, alive_r, config, token, start)
        os._exit(0)
    os.close(ctl_fd)
    os.close(alive_r)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _open_fds() -> list[int]:
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


def _box(ctl_fd: int, alive_r: int, config: dict, token: str, start: float) -> None:
    """PID 1 of the student's namespaces: mounts, the drop to the student's uid, then the warm
    worker."""
    import select

    from . import warm as worker

    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below reaches the zygote's mounts
    for plain in config["mounts"]:  # the grader's policy: a fresh /tmp, /dev/shm, /dev/pts, /proc
        apply_mount(Mount.from_plain(plain))
    _loopback_up()
    os.chdir("/tmp")  # the fresh one (the inherited working folder is the zygote's /tmp)
    drop_privileges(int(config["uid"]))
    from .confine import no_user_namespaces

    no_user_namespaces()  # (needs no_new_privs, which the drop set)
    # After the drop (changing credentials clears it): die with the process that waits for us;
    # if that one is already gone, the signal never comes, so look before going on.
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), "parent-death signal")
    if select.select([alive_r], [], [], 0)[0]:
        os._exit(0)
    os.close(alive_r)
    _prctl(PR_SET_DUMPABLE, 0, "not dumpable")  # its chapters (same uid) cannot trace it
    os.environ["AUTOGRADER_CHILD"] = token
    os.makedirs(os.environ.get("MPLCONFIGDIR", "/tmp/.matplotlib"), exist_ok=True)
    worker.serve_box(ctl_fd, config, start)


def apply_mount(mount: Mount) -> None:
    """Make one of the grader's mounts (`autograder.sandbox.policy.SandboxPolicy.box_mounts`)
    in this box's own mount namespace; an optional one only where its folder exists."""
    if mount.optional and not os.path.isdir(mount.dest):
        return
    if mount.kind == "tmpfs":
        options = ",".join(([f"mode={mount.perms}"] if mount.perms else [])
                           + ([f"size={mount.size}"] if mount.size else []))
        _mount("tmpfs", mount.dest, "tmpfs", MS_NOSUID | MS_NODEV, options or None)
    elif mount.kind == "devpts":  # a pseudo-terminal of one student's must not open for another
        _mount("devpts", mount.dest, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    elif mount.kind == "proc":
        _mount("proc", mount.dest, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for name in PROC_COVERED:
            path = f"{mount.dest}/{name}"
            if os.path.exists(path):
                _mount(path, path, None, MS_BIND | MS_REC)
                _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    else:  # (binds and links are the zygote's own sandbox's, made by bubblewrap)
        raise SetupError(0, f"a student's sandbox does not make {mount.kind} mounts ({mount.dest})")


def _loopback_up() -> None:
    """A new network namespace's loopback starts down; bubblewrap brings it up, so do we."""
    import fcntl
    import socket
    import struct

    IFF_UP, IFF_LOOPBACK, IFF_RUNNING, SIOCSIFFLAGS = 0x1, 0x8, 0x40, 0x8914
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


def _clear_capabilities() -> None:
    """capset(2) with every set empty (version 3: two 32-bit words per set)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # {effective, permitted, inheritable} x 2, all zero
    _check(_libc.capset(header, data), "clear capabilities")


def drop_privileges(uid: int) -> None:
    """Become `uid` (and its group) for good, as setpriv does for a student's own sandbox: no
    groups, no capabilities in any set, no_new_privs. Checked afterwards; SetupError if not."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last_cap = int(f.read())
    except (OSError, ValueError):
        last_cap = 63
    for cap in range(last_cap + 1):
        _prctl(PR_CAPBSET_DROP, cap, f"drop capability {cap} from the bounding set")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # (no ambient set: older kernels)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to another uid: permitted and effective caps cleared
    _clear_capabilities()  # ... but not the inheritable set (bwrap --cap-add fills it)
    _prctl(PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    caps = [int(status[k].strip(), 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd")
            if k in status] + [int(status.get("CapAmb", "0").strip(), 16)]
    ids = status["Uid"].split() + status["Gid"].split()
    if any(caps) or set(ids) != {str(uid)} or status.get("NoNewPrivs", "1").strip() != "1":
        raise SetupError(0, f"the drop to uid {uid} did not take: {status.get('Uid')} "
                            f"capabilities {caps}")

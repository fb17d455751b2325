"""The sandbox policy as data: `SandboxPolicy` is everything a student's sandbox is (its file
system, the paths hidden from it, its environment, resource limits, uid and /tmp size), built
once by `sandbox_policy` from the `Limits`, the hidden paths and the mode. Everything applied
comes from it: `bwrap.bwrap_command` renders it to bubblewrap's argv; `child_config` and
`box_config` hand what the child and the zygote apply themselves to the runtime as plain data
(the runtime imports nothing of the grader's)."""
from __future__ import annotations

import glob
import os
import shutil
import sys
from dataclasses import dataclass, replace

from ..shared.mounts import Mount
from .limits import Limits, NOBODY
from .visibility import RUNTIME_DEST, child_sys_path, python_dirs, stage_runtime, under
# (imported from here by the session, the batch workers, the pool and the end-to-end tests)
from .visibility import REPO_DIR, hidden_paths, student_uid  # noqa: F401

SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")  # passed through
BOUND = ("ro-bind", "dev-bind")


def own_pid_namespace(mode) -> bool:
    """Whether a student's processes have a PID namespace of their own (bubblewrap's, or the
    zygote's for a student it starts): its end kills them all. The container and fallback
    modes share the grader's."""
    return str(mode) == "bubblewrap"


@dataclass(frozen=True)
class SandboxPolicy:
    """One sandbox, decided: read by the renderers, never changed (`with_uid` makes a copy)."""

    mode: str                       # "bubblewrap", "container" or "fallback"
    as_root: bool                   # the grader runs as root: the student's code runs as `uid`
    uid: int                        # (as root) the student's uid
    keep_root: bool                 # the zygote: keeps root's capabilities, never runs student code
    setpriv: str                    # bubblewrap as root: the setpriv that drops to `uid`, else ""
    hidden: tuple[str, ...]         # host paths the student must not see
    runtime: str                    # the staged runtime, as the child sees it
    sys_path: tuple[str, ...]       # what the child imports from, after the runtime
    mounts: tuple[Mount, ...]       # bubblewrap: the whole file system, in order; else ()
    devices: tuple[str, ...]        # the GPU's device nodes, shared with the sandbox
    env: tuple[tuple[str, str], ...]  # the child's environment, its token aside
    rlimits: tuple[tuple[str, int | None], ...]  # hard = soft, set by the child on itself
    nproc: int                      # tasks of the student's uid
    tmp_size: int
    threads: int
    cuda_fraction: float

    @property
    def drops_itself(self) -> bool:
        """Whether the child becomes `uid` itself (no setpriv, the container and fallback modes)."""
        return self.as_root and not self.keep_root and not self.setpriv

    def with_uid(self, uid: int) -> "SandboxPolicy":
        return replace(self, uid=uid)

    def environment(self, token: str) -> dict:
        """The child's whole environment: nothing of the grader's (its secrets, its HOME)."""
        return {**dict(self.env), "AUTOGRADER_CHILD": token}

    def child_config(self, token: str) -> dict:
        """What the child applies to itself (`autograder.runtime.prepare`), as plain data."""
        contained = self.mode in ("fallback", "container")  # no namespaces around it
        return {
            "sys_path": [self.runtime, *self.sys_path],
            "drop": [self.uid, self.uid] if self.drops_itself else None,
            # as root without namespaces, torch and the usual modules are imported before the
            # drop: the student's uid may not be able to read a Python under /root (pyenv)
            "drop_late": contained,
            "token": token,
            "threads": self.threads,
            "cuda_fraction": self.cuda_fraction,
            "rlimits": dict(self.rlimits),
            "nproc": self.nproc,
            "nproc_relative": self.mode == "fallback",  # the grader's own uid: count from now
            "no_userns": True,  # confine.no_user_namespaces once the child is unprivileged
            "subreaper": contained,
            # (a warm worker's Reset kills all but itself where its PID namespace is its own;
            # in the container mode, what is below it, and the pool kills the uid's strays)
            "own_pid_namespace": own_pid_namespace(self.mode),
        }

    def box_mounts(self) -> tuple[Mount, ...]:
        """What a student's sandbox forked by the zygote mounts itself, inside the zygote's
        (whose file system is this policy's): its own /tmp and /dev/shm of the same size,
        pseudo-terminals and /proc (what bubblewrap's /tmp, --dev and --proc give)."""
        tmp = next(m for m in self.mounts if m.kind == "tmpfs" and m.dest == "/tmp")
        proc = next(m for m in self.mounts if m.kind == "proc")
        return (tmp, replace(tmp, dest="/dev/shm", optional=True),
                Mount("devpts", "/dev/pts", optional=True), proc)

    def box_config(self, token: str) -> dict:
        """The config of a student's warm worker forked by the zygote, as plain data: the
        child's, with the mounts the zygote makes and the uid it drops to (so the worker,
        already that uid, does not drop again: it could not, without setpriv's root)."""
        return {**self.child_config(token), "drop": None,
                "mounts": [m.to_plain() for m in self.box_mounts()], "uid": self.uid}

    def host_path(self, inside: str, _hops: int = 8) -> str | None:
        """The host path that `inside` (a path in the bubblewrap sandbox) shows, or None where
        it shows something made fresh (a tmpfs, /proc, an empty folder) or nothing."""
        for mount in reversed(self.mounts):
            if mount.kind == "dir" or not under(inside, mount.dest):
                continue  # (a folder made on the way covers nothing)
            rest = inside[len(mount.dest):] if mount.dest != "/" else inside
            if mount.kind in BOUND:
                return mount.source + rest
            if mount.kind == "symlink" and _hops:
                target = os.path.join(os.path.dirname(mount.dest), mount.source)
                return self.host_path(os.path.normpath(target) + rest, _hops - 1)
            return None
        return None

    def exposes(self, host: str) -> bool:
        """Whether the bubblewrap sandbox shows `host` (a host path), or anything inside it."""
        for mount in self.mounts:
            if mount.kind not in BOUND or mount.source == "/dev/null":
                continue
            if under(mount.source, host) and self.host_path(mount.dest) == mount.source:
                return True  # `host` itself, or a folder inside it, is bound
            inside = mount.dest + host[len(mount.source):]
            if under(host, mount.source) and self.host_path(inside) == host:
                return True  # `host` lies in a bound folder, not covered since
        return False


def sandbox_policy(mode: str, limits: Limits, hidden: list[str], uid: int = NOBODY,
                   home: str = "/tmp", keep_root: bool = False) -> SandboxPolicy:
    """The policy of a sandbox of this `mode` ("bubblewrap", "container", "fallback").

    home: the child's HOME and TMPDIR outside bubblewrap (its working folder); keep_root: the
    zygote's sandbox (bubblewrap, as root)."""
    mode = str(mode)
    boxed = mode == "bubblewrap"
    as_root = os.geteuid() == 0
    stage = str(stage_runtime())
    sys_path = child_sys_path(hidden)
    devices = tuple(sorted(glob.glob("/dev/nvidia*")))
    setpriv = (shutil.which("setpriv") or "") if boxed and as_root and not keep_root else ""
    return SandboxPolicy(
        mode=mode, as_root=as_root, uid=uid, keep_root=keep_root, setpriv=setpriv,
        hidden=tuple(hidden), runtime=RUNTIME_DEST if boxed else stage, sys_path=tuple(sys_path),
        mounts=_mounts(hidden, sys_path, limits.tmp_size, devices, stage) if boxed else (),
        devices=devices, env=_environment("/tmp" if boxed else home),
        rlimits=(("DATA", limits.memory), ("AS", None if devices else 2 * limits.memory),
                 ("CPU", limits.cpu_seconds), ("FSIZE", limits.file_size), ("CORE", 0),
                 ("NOFILE", limits.nofile)),
        nproc=limits.nproc, tmp_size=limits.tmp_size, threads=limits.threads,
        cuda_fraction=limits.gpu_share)


def _environment(home: str) -> tuple[tuple[str, str], ...]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "MPLBACKEND": "Agg", "MPLCONFIGDIR": os.path.join(home, ".matplotlib"),
        "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",  # (as -s: no user site-packages, see python_argv)
        "PYTHONIOENCODING": "utf-8:backslashreplace",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        # No thread pool started by an import (numpy's OpenBLAS starts one as it loads): the
        # child's seccomp filters bind the threads started after them, not those already there
        # (`runtime.prepare.every_thread_filtered`). torch's threads: `Limits.threads`.
        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    }
    env.update((key, os.environ[key]) for key in GPU_ENV if key in os.environ)
    return tuple(env.items())


# --------------------------------------------------------------------------- the file system

def _depth(path: str) -> int:
    return 0 if path == "/" else path.rstrip("/").count("/")


def _mounts(hidden: list[str], sys_path: list[str], tmp_size: int, devices: tuple[str, ...],
            stage: str) -> tuple[Mount, ...]:
    """The bubblewrap sandbox's file system in the order it is made: the system and the Python
    installation read-only, hidden paths covered, shallowest first; then /proc, /dev, the
    GPU's devices and the staged runtime."""
    # (order at equal depth, mount). The fresh /tmp comes first, so a Python installed under
    # /tmp (a venv in CI or a container) is bound on top of it instead of being covered by it.
    ops: list[tuple[int, Mount]] = [(-2, Mount("tmpfs", "/tmp", perms="1777", size=tmp_size))]
    bound: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            ops.append((0, Mount("symlink", d, source=os.readlink(d))))
        elif os.path.isdir(d):
            ops.append((0, Mount("ro-bind", d, source=d)))
            bound.append(d)
    for d in ["/sys"] if devices else ["/sys/devices/system/cpu"]:
        if os.path.isdir(d):
            ops.append((0, Mount("ro-bind", d, source=d)))
    for d in python_dirs(sys_path):
        if any(under(d, b) for b in bound) or under("/tmp", d):
            continue  # already visible (e.g. /usr/lib/python3), or /tmp itself (a script's folder)
        ops.append((0, Mount("ro-bind", d, source=d)))
    ops += _hiding(hidden, [m for _, m in ops])
    ops += _parent_dirs([m for _, m in ops], bound)
    ops.sort(key=lambda op: (_depth(op[1].dest), op[0], op[1].dest))
    tail = [Mount("proc", "/proc"), Mount("dev", "/dev")]
    tail += [Mount("dev-bind", d, source=d) for d in devices]
    tail += [Mount("dir", "/run", perms="0755"), Mount("ro-bind", RUNTIME_DEST, source=stage)]
    return tuple(m for _, m in ops) + tuple(tail)


def _hiding(hidden: list[str], mounts: list[Mount]) -> list[tuple[int, Mount]]:
    """Hidden paths that lie inside something bound get an empty tmpfs (or /dev/null) on top."""
    visible = [m.dest for m in mounts if m.kind == "ro-bind"]
    out = []
    for h in hidden:
        if any(under(h, v) for v in visible) and os.path.exists(h):
            out.append((1, Mount("tmpfs", h) if os.path.isdir(h) else Mount("ro-bind", h, source="/dev/null")))
    return out


def _parent_dirs(mounts: list[Mount], bound: list[str]) -> list[tuple[int, Mount]]:
    """Folders on the way to a bound path are made 0755 (bwrap would make them 0700)."""
    made, dirs = set(), []
    for mount in mounts:
        if mount.kind != "ro-bind":
            continue
        parent = os.path.dirname(mount.dest)
        chain = []
        while parent not in ("/", "") and parent not in made:
            if any(under(parent, b) for b in bound) or parent in SYSTEM_DIRS or parent == "/tmp":
                break
            chain.append(parent)
            parent = os.path.dirname(parent)
        for p in chain:
            made.add(p)
            dirs.append((-1, Mount("dir", p, perms="0755")))
    return dirs


def python_argv(runtime: str, entry: str, args: list[str], module: str = "runtime.child") -> list[str]:
    """The interpreter's command line that runs `autograder.<module>.<entry>(args)`, importing
    the package from `runtime` only (-P: not from the working folder)."""
    code = ("import sys; sys.path[:0] = [%r]; from autograder.%s import %s; "
            "%s(sys.argv[1:])" % (runtime, module, entry, entry))
    # -s: no user site-packages. In the container mode the child starts as root with HOME in a
    # folder of the student's (a restarted child's, or a warm worker's after a chapter killed
    # it): a .pth file planted in HOME/.local/lib/pythonX.Y/site-packages ran as root.
    argv = [sys.executable, "-B", "-u", "-s"]
    if sys.version_info >= (3, 11):
        argv.append("-P")
    return argv + ["-c", code] + args

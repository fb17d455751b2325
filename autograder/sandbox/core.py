"""How the child process that runs a student's notebook is launched, limited and killed.

Two modes (AUTOGRADER_SANDBOX=auto|bubblewrap|none). auto uses bubblewrap when it is installed;
installed but unable to start raises SandboxUnavailable (exit status 3 on the command line),
never a silent fallback. The fallback runs only where bwrap is absent or "none" is explicit.

- "bubblewrap": the child runs under bwrap with its own PID, mount, network, IPC and UTS
  namespaces (no network but its own loopback; when the session ends, killing bwrap kills
  the PID namespace and every process the student started in it). The filesystem is an
  allow-list: /usr, /etc and the /bin-/lib links read-only, the Python installation read-only
  (at its own path, so a Python under /root works although /root itself stays hidden), the
  child's runtime modules read-only at /run/autograder-runtime, a fresh size-capped tmpfs at
  /tmp (the working directory and $HOME; mounted before the Python installation, so a venv
  under /tmp stays visible), a fresh /proc and a minimal /dev. Nothing else
  exists: not the grader's repository, the solutions, the results path, /work or /root. If one
  of the hidden paths lies inside a directory that is bound (a solutions folder inside the
  Python prefix, say), an empty tmpfs is mounted over it. When the grader runs as root, bwrap
  runs without a user namespace and the child drops to `nobody` (65534) through setpriv with
  no_new_privs before Python starts; otherwise bwrap uses an unprivileged user namespace and
  the child keeps the grader's uid (which is then all it can be). Batch grading as root starts
  students' sandboxes from a `Zygote` instead (`autograder.runtime.zygote`): the same isolation, made
  by forking a process that has imported torch already into namespaces of its own.
- "fallback": a plain child process, for machines without bubblewrap or namespaces (a
  student's laptop, macOS). Same resource limits and timeouts, its own session and process
  group, and a working directory of its own; but the student's code can read and write whatever
  the grader's user can, including the solutions, and can reach the network. The session's
  report says so. As root, the child imports torch and the usual modules, then drops to
  `nobody` (no groups, no_new_privs), so it cannot signal the grader or read root's files.

Limits applied in both modes by the child itself, before any student code runs (hard limits,
so the student cannot raise them): RLIMIT_DATA = memory (4 GiB by default; counts heap and
private anonymous mappings, so torch's allocations, but not the CUDA driver's reserved address
space), RLIMIT_AS = 2 x memory on machines without an NVIDIA device, RLIMIT_CPU, RLIMIT_FSIZE,
RLIMIT_CORE = 0, RLIMIT_NOFILE, and RLIMIT_NPROC (tasks, threads included, counted per user:
in bubblewrap mode as root it is the `nobody` user's count, shared by every session running at
the same time; in fallback mode as a normal user it is set to the user's current count plus
`nproc`).
"""
from __future__ import annotations

import atexit
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path

from ..runtime import procs

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = PACKAGE_DIR.parent
# What the child imports, staged whole: nothing secret (no references, no cases, no solutions).
# tests/test_runtime_boundary.py fails if anything there imports from outside these folders.
RUNTIME_PACKAGES = ("shared", "runtime")
RUNTIME_DEST = "/run/autograder-runtime"  # where the staged modules appear inside bubblewrap
NOBODY = 65534


class SandboxMode(str, Enum):
    """How a student's code was isolated; carried from the session to the reports. A str, so
    it compares equal to (and prints as) its value."""

    BUBBLEWRAP = "bubblewrap"
    CONTAINER = "container"
    FALLBACK = "fallback"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


MODES = tuple(SandboxMode)

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


@dataclass
class Limits:
    """What one student's child process may use. Defaults are documented here and in the README.

    Every field can be set from the environment as AUTOGRADER_<FIELD NAME IN CAPITALS>
    (sizes accept K/M/G suffixes: AUTOGRADER_MEMORY=8G); see `Limits.from_env`.
    """

    cell_timeout: float = 10.0          # seconds for one top-level cell
    call_timeout: float = 10.0          # seconds for one graded call
    notebook_timeout: float = 120.0     # seconds for all cells together (start-up of a session)
    student_budget: float = 300.0       # seconds of grading for one student's whole submission:
                                        # what is left when it runs out scores zero, said so
    watchdog_margin: float = 300.0      # batch: a worker still at one student this long after
                                        # their budget ran out is killed (`error`); it covers what
                                        # the budget does not count (start-up, comparisons, reports)
    startup_timeout: float = 60.0       # seconds for the child to start (Python + torch import)
    grace: float = 2.0                  # after a timeout the child interrupts itself; this long
                                        # later the parent kills it (student code that swallows
                                        # the interrupt or blocks in C)
    memory: int = 4 * GiB               # RLIMIT_DATA (and RLIMIT_AS = 2x where no GPU)
    cpu_seconds: int = 600              # RLIMIT_CPU, per process (a backstop; timeouts are wall)
    nproc: int = 256                    # tasks (processes + threads), see the module docstring
    file_size: int = 64 * MiB           # RLIMIT_FSIZE, largest file the child may write
    tmp_size: int = 256 * MiB           # size of the sandbox's /tmp (bubblewrap mode)
    nofile: int = 256                   # open file descriptors
    output_cap: int = 64 * KiB          # captured stdout+stderr kept per session start / per call
    result_cap: int = 256 * MiB         # largest result frame accepted from the child
    memory_case: int = 192 * MiB        # a memory case (Call.capped_memory) runs in a child of
                                        # its own that may allocate this much beyond what it holds
                                        # at its start, the notebook's cells included (hard
                                        # RLIMIT_DATA and RLIMIT_AS, set before any student code
                                        # runs: the kernel, not the student, enforces it; see
                                        # autograder.session.memory_case)
    threads: int = 1                    # torch intra-op threads (determinism, parallel grading)
    gpu_share: float = 0.9              # torch's per-process CUDA memory fraction in a student's
                                        # children, set before any student code runs (`batch`
                                        # gives each of its --jobs workers 0.9 / jobs; see
                                        # autograder.sandbox.gpu_share)
    # The grader's own deadlines and bounds (not the student's):
    send_timeout: float = 30.0          # to hand the notebook's cells to a child
    control_timeout: float = 10.0       # for the warm worker to fork, kill or reset
    exit_wait: float = 2.0              # for a child that closed its pipes to report its exit
    kill_wait: float = 10.0             # for a killed process to be reaped
    kill_rounds: int = 20               # passes over /proc to stop a fallback child's processes
    drain_cap: int = 8 * MiB            # output read from a killed child before giving up on it

    @classmethod
    def from_env(cls, **overrides) -> "Limits":
        """Defaults, then AUTOGRADER_<FIELD> environment variables, then `overrides`."""
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f"AUTOGRADER_{f.name.upper()}")
            if raw:
                try:
                    values[f.name] = _parse(raw, f.type)
                except ValueError:
                    raise ValueError(f"AUTOGRADER_{f.name.upper()}={raw!r} is not a valid "
                                     f"{f.type}") from None
        values.update(overrides)
        return cls(**values)


def _parse(raw: str, type_) -> float | int:
    raw = raw.strip()
    if type_ in (float, "float"):
        return float(raw)
    scale = {"K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}.get(raw[-1:].upper(), 1)
    number = raw[:-1] if scale != 1 else raw
    return int(float(number) * scale)


# --------------------------------------------------------------------------- staging

_STAGE_LOCK = threading.Lock()
_STAGE: Path | None = None


def stage_runtime() -> Path:
    """A world-readable directory holding a copy of the child's modules as package `autograder`.

    Created once per grader process, removed at exit. Returns the directory to put on sys.path.
    """
    global _STAGE
    with _STAGE_LOCK:
        if _STAGE is not None and (_STAGE / "autograder" / "runtime" / "child.py").exists():
            return _STAGE
        root = Path(tempfile.mkdtemp(prefix="autograder-runtime-"))
        pkg = root / "autograder"
        pkg.mkdir()
        shutil.copyfile(PACKAGE_DIR / "__init__.py", pkg / "__init__.py")
        for folder in RUNTIME_PACKAGES:
            (pkg / folder).mkdir()
            for src in (PACKAGE_DIR / folder).glob("*.py"):
                shutil.copyfile(src, pkg / folder / src.name)
            (pkg / folder).chmod(0o755)
        for f in pkg.rglob("*.py"):
            f.chmod(0o644)
        pkg.chmod(0o755)
        root.chmod(0o755)
        atexit.register(shutil.rmtree, root, True)
        _STAGE = root
        return root


# --------------------------------------------------------------------------- paths

def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def hidden_paths(extra=()) -> list[str]:
    """Paths the student's code must not see: the grader's repository and package, the
    solutions ($AUTOGRADER_SOLUTIONS or <repo>/solutions), $AUTOGRADER_HIDE (os.pathsep
    separated; results and hidden test data belong here), /work, the reference
    outcomes' cache folder and `extra`."""
    library = interpreter_dirs()
    # An installed grader's "repository" is site-packages itself: its package is hidden (below),
    # the rest of site-packages (torch) must stay visible.
    repo = [] if any(os.path.realpath(REPO_DIR) == os.path.realpath(d) for d in library) else [str(REPO_DIR)]
    paths = repo + [str(PACKAGE_DIR),
                    os.environ.get("AUTOGRADER_SOLUTIONS") or str(REPO_DIR / "solutions"), "/work"]
    paths += [p for p in os.environ.get("AUTOGRADER_HIDE", "").split(os.pathsep) if p]
    paths += [os.fspath(p) for p in extra]
    paths += grader_copies(library)
    from ..references.store import cache_dir
    if cache_dir() is not None:  # the stored reference outcomes hold the hidden inputs
        paths.append(str(cache_dir()))
    out = []
    for p in paths:
        for q in {os.path.abspath(p), os.path.realpath(p)}:
            if q != "/" and q not in out:
                out.append(q)
    return out


def _prefixes() -> set[str]:
    """The Python installation's own folders (a venv's and its base's), as given and resolved."""
    out = set()
    for d in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        if d:
            out.add(os.path.abspath(d))
            out.add(os.path.realpath(d))
    return out


def is_hidden(path: str, hidden: list[str]) -> bool:
    """Whether `path` lies in a hidden folder. A hidden folder that holds the Python installation
    (a venv inside the repository) hides everything in it except that installation; paths hidden
    inside the installation itself stay hidden."""
    prefixes = _prefixes()
    for q in {os.path.abspath(path), os.path.realpath(path)}:
        for h in hidden:
            if not _under(q, h):
                continue
            if any(_under(pre, h) and pre != h and _under(q, pre) for pre in prefixes):
                continue  # h is a folder around the Python installation, q is inside it
            return True
    return False


def interpreter_dirs() -> list[str]:
    """The interpreter's own library folders: its standard library and its site-packages (a
    venv's and its base's, Debian's dist-packages, the user's site-packages where Python uses
    it). What the child may import comes from these only: never the working folder,
    $PYTHONPATH, an editable install's source folder or any other sys.path entry, which may be
    a course folder holding the whole class's submissions or the grader's own code."""
    import site
    import sysconfig

    dirs = set()
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix,
                                          "installed_base": prefix, "installed_platbase": prefix})
        dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    dirs.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and user in sys.path:
        dirs.add(user)
    out = []
    for d in sorted(dirs):
        for q in (os.path.abspath(d), os.path.realpath(d)):
            if os.path.isdir(q) and q not in out:
                out.append(q)
    return out


def grader_copies(dirs: list[str]) -> list[str]:
    """Every copy of the grader package in these folders (a non-editable install puts one in
    site-packages, with its cases, hint models and input seeds): hidden in the sandbox, where
    the child imports only its own staged runtime."""
    out = []
    for d in dirs:
        candidate = os.path.join(d, PACKAGE_DIR.name)
        if os.path.isdir(candidate) and (os.path.isdir(os.path.join(candidate, "grading"))
                                         or os.path.isdir(os.path.join(candidate, "cases"))):
            out.append(candidate)
    return out


def child_sys_path(hidden: list[str]) -> list[str]:
    """The grader's sys.path entries that lie in the interpreter's own library folders, minus
    anything hidden (so no '', no working folder, no $PYTHONPATH, no repository)."""
    allowed = interpreter_dirs()
    out = []
    for p in sys.path:
        if not p:
            continue
        p = os.path.abspath(p)
        if not any(_under(p, a) or _under(os.path.realpath(p), a) for a in allowed):
            continue
        if os.path.exists(p) and not is_hidden(p, hidden) and p not in out:
            out.append(p)
    return out


def _python_dirs(sys_path: list[str]) -> list[str]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.abspath(sys.executable)),
            os.path.dirname(os.path.realpath(sys.executable))}
    dirs.update(sys_path)
    out = set()
    for d in dirs:
        if d and os.path.exists(d):
            out.add(os.path.abspath(d))
            out.add(os.path.realpath(d))
    return sorted(out)


# --------------------------------------------------------------------------- bubblewrap

SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _depth(path: str) -> int:
    return 0 if path == "/" else path.rstrip("/").count("/")


def bwrap_command(python_argv: list[str], hidden: list[str], sys_path: list[str], stage: Path,
                  limits: Limits, variant: int = 0, keep_root: bool = False, uid: int = NOBODY) -> list[str]:
    """The bwrap command line that runs `python_argv` in the sandbox.

    variant 0 is the full set of options; variant 1 leaves out the ones an older bwrap lacks.
    keep_root (the grader runs as root): the process stays root with its capabilities instead
    of becoming `nobody`; only for the zygote (`autograder.runtime.zygote`), which never runs student
    code and drops to `nobody` in every student's process it forks.
    """
    bwrap = shutil.which("bwrap") or "bwrap"
    root = os.geteuid() == 0
    args = [bwrap]
    if root:  # a user namespace would map the sandbox's uid to root outside; drop with setpriv
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                 "--unshare-cgroup-try"]
    else:
        args += ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net",
                 "--unshare-uts", "--unshare-cgroup-try"]
        if variant == 0:
            args += ["--disable-userns"]
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]

    ops: list[tuple[str, int, list[str]]] = []  # (dest, order at equal path, args)
    bound: list[str] = []
    # The fresh /tmp comes first (ops are applied shallowest first), so a Python installed under
    # /tmp (a venv in CI or a container) is bound on top of it instead of being covered by it.
    tmp = (["--perms", "1777", "--size", str(limits.tmp_size), "--tmpfs", "/tmp"] if variant == 0
           else ["--tmpfs", "/tmp", "--chmod", "1777", "/tmp"])
    ops.append(("/tmp", -2, tmp))
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            ops.append((d, 0, ["--symlink", os.readlink(d), d]))
        elif os.path.isdir(d):
            ops.append((d, 0, ["--ro-bind", d, d]))
            bound.append(d)
    gpu = sorted(glob.glob("/dev/nvidia*"))
    sys_dirs = ["/sys"] if gpu else ["/sys/devices/system/cpu"]
    for d in sys_dirs:
        if os.path.isdir(d):
            ops.append((d, 0, ["--ro-bind", d, d]))
    for d in _python_dirs(sys_path):
        if any(_under(d, b) for b in bound) or _under("/tmp", d):
            continue  # already visible (e.g. /usr/lib/python3), or /tmp itself (a script's folder)
        ops.append((d, 0, ["--ro-bind", d, d]))
    # Hidden paths that lie inside something bound get an empty tmpfs (or /dev/null) on top.
    visible = [op[0] for op in ops if op[2][0] == "--ro-bind"]
    for h in hidden:
        if any(_under(h, v) for v in visible) and os.path.exists(h):
            if os.path.isdir(h):
                ops.append((h, 1, ["--tmpfs", h]))
            else:
                ops.append((h, 1, ["--ro-bind", "/dev/null", h]))
    # Directories on the way to a bound path are created 0755 (bwrap would make them 0700).
    made = set()
    for dest, _, op in list(ops):
        if op[0] != "--ro-bind":
            continue
        parent = os.path.dirname(dest)
        chain = []
        while parent not in ("/", "") and parent not in made:
            if any(_under(parent, b) for b in bound) or parent in SYSTEM_DIRS or parent == "/tmp":
                break
            chain.append(parent)
            parent = os.path.dirname(parent)
        for p in chain:
            made.add(p)
            ops.append((p, -1, ["--perms", "0755", "--dir", p]))
    ops.sort(key=lambda op: (_depth(op[0]), op[1], op[0]))
    for _, _, op in ops:
        args += op

    args += ["--proc", "/proc", "--dev", "/dev"]
    for dev in gpu:
        args += ["--dev-bind", dev, dev]
    args += ["--perms", "0755", "--dir", "/run", "--ro-bind", str(stage), RUNTIME_DEST]
    args += ["--chdir", "/tmp"]
    if root and keep_root:
        args += ["--cap-add", "ALL", "--"]
    elif root:
        setpriv = shutil.which("setpriv")
        if setpriv:
            args += ["--", setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        else:
            args += ["--"]  # the worker drops privileges itself (config "drop")
    else:
        args += ["--"]
    return args + python_argv


def popen_bwrap(argv: list[str], pass_fds=(), **kwargs) -> subprocess.Popen:
    """Start a bwrap command line with its arguments read from a file descriptor (`--args`),
    not from its command line: bwrap is the sandbox's first process (PID 1 with --unshare-pid),
    and every process inside can read /proc/1/cmdline, which would list the hidden paths (the
    solutions, the results, the reference cache) as --tmpfs targets."""
    fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC) if hasattr(os, "memfd_create") else None
    if fd is None:  # (not Linux: no bwrap either)
        return subprocess.Popen(argv, pass_fds=pass_fds, **kwargs)
    end = argv.index("--")  # (the command itself must stay on the command line: bwrap's rule)
    try:
        os.write(fd, b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in argv[1:end]))
        os.lseek(fd, 0, os.SEEK_SET)
        return subprocess.Popen([argv[0], "--args", str(fd), *argv[end:]], pass_fds=(*pass_fds, fd), **kwargs)
    finally:
        os.close(fd)


_PROBE_LOCK = threading.Lock()
_PROBE: dict = {}


def probe_bubblewrap() -> tuple[bool, str, int]:
    """Whether bubblewrap can run the child here: (ok, why not, variant). Cached per process."""
    with _PROBE_LOCK:
        if "result" in _PROBE:
            return _PROBE["result"]
        if sys.platform != "linux":
            result = (False, f"bubblewrap needs Linux (this is {sys.platform})", 0)
        elif not shutil.which("bwrap"):
            result = (False, "bubblewrap (bwrap) is not installed", 0)
        else:
            result = (False, "", 0)
            hidden = hidden_paths()
            sys_path = child_sys_path(hidden)
            stage = stage_runtime()
            want_uid = NOBODY if os.geteuid() == 0 else os.getuid()
            # The grader's folder may exist there as an empty mount point (hidden inside a
            # bound folder): what matters is that none of its files can be read.
            code = ("import os, sys; sys.path[:0] = [%r]; import autograder; p = %r; "
                    "print(os.getuid(), os.path.isdir(p) and bool(os.listdir(p)))"
                    % (RUNTIME_DEST, str(PACKAGE_DIR)))
            reasons = []
            for variant in (0, 1):
                argv = [sys.executable, "-B", "-c", code]
                if os.geteuid() == 0 and not shutil.which("setpriv"):
                    argv = [sys.executable, "-B", "-c",
                            f"import os; os.setgroups([]); os.setgid({NOBODY}); "
                            f"os.setuid({NOBODY}); " + code]
                cmd = bwrap_command(argv, hidden, sys_path, stage, Limits(), variant)
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                                       stdin=subprocess.DEVNULL, env=_base_env("/tmp", "probe"))
                except (OSError, subprocess.TimeoutExpired) as e:
                    reasons.append(str(e))
                    continue
                if r.returncode == 0 and r.stdout.split() == [str(want_uid), "False"]:
                    result = (True, "", variant)
                    break
                reasons.append((r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1])
            if not result[0]:
                result = (False, f"bubblewrap ({shutil.which('bwrap')}) is installed but cannot "
                                 "start a sandbox here: " + "; ".join(reasons), 0)
        _PROBE["result"] = result
        return result


class SandboxUnavailable(RuntimeError):
    """Bubblewrap is installed (or was asked for) but cannot start a sandbox here. The command
    line turns this into exit status 3: grading never goes on unsandboxed because of it."""


FIX = ("Fix: let bubblewrap create namespaces (unprivileged user namespaces enabled: "
       "sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
       "kernel.apparmor_restrict_unprivileged_userns=0; in Docker run the grader as root or "
       "with --security-opt seccomp=unconfined --cap-add SYS_ADMIN), or grade trusted "
       "submissions without a sandbox with --sandbox none.")

FALLBACK_WARNING = ("the notebook ran as a plain child process with resource limits and "
                    "timeouts, but without namespaces: it could read the grader's files "
                    "(the solutions too) and reach the network. Grade untrusted submissions on "
                    "Linux with bubblewrap installed.")


def choose_mode(requested: str | None = None, hide=()) -> tuple[SandboxMode, str]:
    """(mode, note): the sandbox to use, and a sentence for the report when it is not bubblewrap.

    requested: "auto" (default; also $AUTOGRADER_SANDBOX), "bubblewrap", "container" or
    "none"/"fallback". auto takes bubblewrap where it can start a sandbox; else, where it is
    installed but cannot start and the grader is root on Linux (a Docker, Gradescope or
    Kubernetes container without the capabilities namespaces need), the container mode,
    provided the secret paths (`hide` and `hidden_paths`) are unreadable to a student's uid;
    else the fallback, only where bubblewrap is not installed. Anything else raises SandboxUnavailable rather than grading unsandboxed:
    bubblewrap installed but unable to start for a grader that is not root, a container whose
    secrets a student could read, a mode asked for that cannot work here.
    """
    requested = (requested or os.environ.get("AUTOGRADER_SANDBOX") or "auto").lower()
    if requested in ("none", "fallback", "off"):
        return SandboxMode.FALLBACK, ("Sandbox: none (--sandbox none or AUTOGRADER_SANDBOX=none): "
                            + FALLBACK_WARNING)
    if requested not in ("auto", "bubblewrap", "bwrap", "container"):
        raise ValueError(f"unknown sandbox mode {requested!r} (auto, bubblewrap, container or none)")
    why = ""
    if requested != "container":
        ok, why, _ = probe_bubblewrap()
        if ok:
            return SandboxMode.BUBBLEWRAP, ""
    installed = sys.platform == "linux" and shutil.which("bwrap")
    root = sys.platform == "linux" and os.geteuid() == 0
    if root and (requested == "container" or (requested == "auto" and installed)):
        readable = readable_secrets(hidden_paths(hide))
        if not readable:
            return SandboxMode.CONTAINER, f"Sandbox: container ({why or 'asked for'}): " + CONTAINER_NOTE
        raise SandboxUnavailable(
            f"{why + '; ' if why else ''}the container mode (a uid of the student's own) cannot be used: "
            f"a student's uid could read {', '.join(readable[:4])}. Fix: make them unreadable to other "
            f"users (chmod -R go-rwx {' '.join(readable[:4])}; the Gradescope run_autograder does this), "
            "or let bubblewrap create namespaces.")
    if requested == "container":
        raise SandboxUnavailable("--sandbox container needs a grader that runs as root on Linux.")
    if requested in ("bubblewrap", "bwrap") or installed:
        raise SandboxUnavailable(f"{why}. {FIX}" if installed else
                                 f"--sandbox bubblewrap was asked for, but {why}. Install "
                                 "bubblewrap (Debian/Ubuntu: apt-get install bubblewrap).")
    return SandboxMode.FALLBACK, f"Sandbox: fallback ({why}): " + FALLBACK_WARNING


CONTAINER_NOTE = ("no namespaces here, so each student's code runs as a uid of its own with resource "
                  "limits and timeouts; the grader's files are hidden by their owner and mode, every "
                  "process of that uid is killed when the student ends, but the network is not cut off.")

_READABLE_LOCK = threading.Lock()
_READABLE: dict = {}


def readable_secrets(paths: list[str]) -> list[str]:
    """Which of `paths` a student's uid could read (list a folder, open a file: access(2) with
    that uid, through every folder on the way), asked of /bin/sh run as such a uid. Cached per
    list of paths."""
    key = tuple(paths)
    with _READABLE_LOCK:
        if key in _READABLE:
            return _READABLE[key]
        lease = student_uid()
        uid = lease.uid if lease else NOBODY
        wanted = [p for p in paths if p != "/work" and os.path.exists(p)]  # (/work: where it is developed)
        script = 'for p in "$@"; do if [ -r "$p" ]; then printf "%s\\0" "$p"; fi; done'
        try:
            r = subprocess.run(["/bin/sh", "-c", script, "sh", *wanted], user=uid, group=uid, extra_groups=[],
                               capture_output=True, timeout=30, cwd="/", env={"PATH": "/usr/bin:/bin"})
            found = [p for p in r.stdout.decode(errors="replace").split("\0") if p]
            if r.returncode != 0:
                found = found or ["(the check could not run: " + r.stderr.decode(errors="replace")[:200] + ")"]
        except (OSError, subprocess.SubprocessError) as e:
            found = [f"(the check could not run: {e})"]
        finally:
            if lease:
                lease.release()
        _READABLE[key] = found
        return found


# --------------------------------------------------------------------------- the child

def _base_env(home: str, token: str) -> dict:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "MPLBACKEND": "Agg", "MPLCONFIGDIR": os.path.join(home, ".matplotlib"),
        "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8:backslashreplace",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "AUTOGRADER_CHILD": token,
    }
    for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def _config(mode: str, limits: Limits, runtime: str, sys_path: list[str], drop, token: str) -> dict:
    """The worker's configuration (see `autograder.runtime.child`)."""
    gpu = bool(glob.glob("/dev/nvidia*"))
    return {
        "sys_path": [runtime] + sys_path,
        "drop": drop,
        # fallback as root: torch and the usual modules are imported before the drop, since
        # `nobody` may not be able to read a Python installed under /root (pyenv)
        "drop_late": mode in ("fallback", "container"),
        "token": token,
        "threads": limits.threads,
        "cuda_fraction": limits.gpu_share,
        "rlimits": {
            "DATA": limits.memory,
            "AS": None if gpu else 2 * limits.memory,
            "CPU": limits.cpu_seconds,
            "FSIZE": limits.file_size,
            "CORE": 0,
            "NOFILE": limits.nofile,
        },
        "nproc": limits.nproc,
        "nproc_relative": mode == "fallback",
        "no_userns": True,  # confine.no_user_namespaces once the child is unprivileged
        "subreaper": mode in ("fallback", "container"),
    }


def _python_argv(runtime: str, entry: str, args: list[str], module: str = "runtime.child") -> list[str]:
    code = ("import sys; sys.path[:0] = [%r]; from autograder.%s import %s; "
            "%s(sys.argv[1:])" % (runtime, module, entry, entry))
    argv = [sys.executable, "-B", "-u"]
    if sys.version_info >= (3, 11):
        argv.append("-P")
    return argv + ["-c", code] + args


class Child:
    """One launched worker process and its three pipes (requests in, results out, output out).

    The parent's ends are non-blocking: `req_fd` (write), `res_fd` and `out_fd` (read).
    """

    def __init__(self, mode: str, limits: Limits, hidden: list[str], workdir: str, token: str,
                 data_headroom: int = 0):
        self.mode, self.limits, self.token = mode, limits, token
        req_r, self.req_fd = os.pipe()
        self.res_fd, res_w = os.pipe()
        self.out_fd, out_w = os.pipe()
        stage = stage_runtime()
        sys_path = child_sys_path(hidden)
        root = os.geteuid() == 0
        drop = None
        self.lease = None
        if mode == "bubblewrap":
            home = "/tmp"
            runtime = RUNTIME_DEST
            if root and not shutil.which("setpriv"):
                drop = [NOBODY, NOBODY]
        else:
            home, runtime = workdir, str(stage)
            if root:  # no namespaces, but the student's code must not run as root
                uid = NOBODY
                if mode == "container":  # a uid of its own: every process of it is this child's
                    self.lease = student_uid()
                    uid = self.lease.uid if self.lease else NOBODY
                drop = [uid, uid]
                os.chown(workdir, uid, uid)
        config = _config(mode, limits, runtime, sys_path, drop, token)
        if data_headroom:
            config["data_headroom"] = int(data_headroom)
        argv = _python_argv(runtime, "main", [str(req_r), str(res_w), json.dumps(config)])
        if mode == "bubblewrap":
            _, _, variant = probe_bubblewrap()
            argv = bwrap_command(argv, hidden, sys_path, stage, limits, variant)
        try:
            self.proc = (popen_bwrap if mode == "bubblewrap" else subprocess.Popen)(
                argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                pass_fds=(req_r, res_w), env=_base_env(home, token), cwd=workdir,
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

    def kill(self) -> None:
        """Kill the child and everything it started; close the pipes. Idempotent."""
        if self.mode == "bubblewrap":
            # bwrap's PID-1 has PDEATHSIG=SIGKILL; when it dies the kernel kills the namespace.
            procs.send(self.proc.pid, signal.SIGKILL)
            _killpg(self.proc.pid)
        else:
            kill_fallback_tree(self.proc.pid, self.token, self.limits.kill_rounds)
        if self.lease is not None:  # whatever escaped the tree (a double fork, a new session)
            procs.kill_uid(self.lease.uid, self.limits.kill_rounds)
        self.wait(self.limits.kill_wait)
        _close_pipes(self)
        if self.lease is not None:
            from .uid_cleanup import clean_up

            clean_up(self.lease.uid)  # its files in /tmp, /var/tmp, /dev/shm, its keyrings
            self.lease.release()
            self.lease = None

    def exit_description(self) -> str:
        """Why the child ended, in words."""
        return describe_exit(self.proc.poll(), self.limits, self.mode == "bubblewrap")


def describe_exit(rc: int | None, limits: Limits, shell_convention: bool = False) -> str:
    """A return code (Popen's convention: -N for signal N) in words; with shell_convention,
    128+N also means signal N (bubblewrap reports its child's death that way)."""
    if rc is None:
        return "is still running"
    sig = -rc if rc < 0 else (rc - 128 if shell_convention and 128 < rc < 160 else 0)
    if sig:
        return describe_signal(sig, limits)
    return f"exited with status {rc} (os._exit, sys.exit from a thread, or a fatal error)"


def describe_signal(sig: int, limits: Limits) -> str:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    why = {
        signal.SIGKILL: f"was killed ({name}), usually by the memory limit "
                        f"({limits.memory / GiB:g} GiB) or the system running out of memory",
        signal.SIGSEGV: f"crashed with a segmentation fault ({name})",
        signal.SIGBUS: f"crashed with a bus error ({name})",
        signal.SIGABRT: f"aborted ({name})",
        signal.SIGXCPU: f"used more than {limits.cpu_seconds} s of CPU time ({name})",
        signal.SIGXFSZ: f"wrote a file larger than {limits.file_size / MiB:g} MiB ({name})",
        signal.SIGFPE: f"crashed with a floating point exception ({name})",
    }
    return why.get(sig, f"was killed by {name}")


def _killpg(pgid: int) -> None:
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


def kill_fallback_tree(root_pid: int, token: str, rounds: int = Limits.kill_rounds) -> None:
    """Stop, then kill, the child, its descendants (orphans included: the worker is a child
    subreaper), its process group, and any process carrying its environment token (a daemon
    that escaped both). Without /proc only the process group is killed."""
    procs.kill_tree(root_pid, rounds, also=lambda table: _marked(token, table))


# --------------------------------------------------------------------------- the warm worker

def _close_pipes(child) -> None:
    """Close a child's three pipe ends, once (a child may be killed more than once)."""
    if not child.closed:
        child.closed = True
        for fd in (child.req_fd, child.res_fd, child.out_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class SandboxDied(OSError):
    """The student's warm worker (and so the sandbox) is gone or stopped answering."""


class _Bwrap:
    """A sandbox's bubblewrap process (`poll`, `stop`)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen, self.pid = popen, popen.pid

    @classmethod
    def start(cls, argv: list[str], sock_fd: int, out_fd: int, token: str, workdir: str) -> "_Bwrap":
        """Run `argv` (a bwrap command line) with the control socket and output pipe."""
        return cls(popen_bwrap(
            argv, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=out_fd, pass_fds=(sock_fd,),
            env=_base_env("/tmp", token), cwd=workdir, start_new_session=True, close_fds=True))

    def poll(self) -> int | None:
        return self.popen.poll()

    def stop(self, wait: float) -> None:
        """Kill bwrap: the PID namespace, and every process in it, goes with it."""
        procs.send(self.pid, signal.SIGKILL)
        _killpg(self.pid)
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
        import socket

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

    def _request(self, message, fds=(), reply=None):
        """Send a request; with `reply` (a message class) wait for it. SandboxDied if the
        process is gone or does not answer within `control_timeout` (it is killed then)."""
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

            self._wait(got, self.limits.control_timeout)
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
        try:
            self.sock.close()
        except OSError:
            pass


class WarmSandbox(_Controlled):
    """One student's sandbox holding a warm worker (`autograder.runtime.child.warm`) that has imported
    torch once and forks a fresh child per chapter (`fork`), each working in a folder of its own
    under /tmp that the worker removes when that child ends. Several chapters of the student may
    run in it at once (see `SandboxPool`); once none is left, `reset` kills whatever they left
    and empties /tmp before the next.

    The sandbox is a bubblewrap sandbox of its own, or, given a `Zygote` (batch grading as
    root), namespaces of its own forked from the zygote, whose torch is already imported."""

    def __init__(self, limits: Limits, hidden: list[str], workdir: str, zygote: "Zygote | None" = None,
                 uid: int = NOBODY):
        import secrets

        self.mode = SandboxMode.BUBBLEWRAP
        self.uid = uid  # (as root: the student's own, see `autograder.sandbox.uids`)
        sys_path = child_sys_path(hidden)
        drop = [uid, uid] if os.geteuid() == 0 and not shutil.which("setpriv") else None
        token = secrets.token_hex(16)
        config = _config("bubblewrap", limits, RUNTIME_DEST, sys_path, drop, token)
        self.exits: dict[int, int] = {}
        # kept by the SandboxPool: chapters in it now, whether it is being reset
        self.users, self.resetting = 0, False
        self.died_shared = False   # it died while more than one chapter was in it
        if zygote is not None:
            def launch(sock_fd, out_fd):
                return zygote.spawn(token, {**config, **zygote.box_config, "nobody": uid}, sock_fd, out_fd)
        else:
            def launch(sock_fd, out_fd):
                argv = _python_argv(RUNTIME_DEST, "warm", [str(sock_fd), json.dumps(config)])
                return _Bwrap.start(bwrap_command(argv, hidden, sys_path, stage_runtime(), limits,
                                                  probe_bubblewrap()[2], uid=uid),
                                    sock_fd, out_fd, token, workdir)
        super().__init__(limits, launch)

    def _on_message(self, message) -> None:
        if isinstance(message, self._p.Exited):
            self.exits[message.pid] = message.returncode
        else:
            super()._on_message(message)

    def fork(self, token: str, data_headroom: int = 0) -> "ForkedChild":
        """A fresh child for one chapter, forked from the warm worker (with `data_headroom`,
        its memory capped that far above what it holds when it starts)."""
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            config = {"threads": self.limits.threads, "cuda_fraction": self.limits.gpu_share}
            if data_headroom:
                config["data_headroom"] = int(data_headroom)
            forked = self._request(self._p.Fork(token, config),
                                   (req_r, res_w, out_w), self._p.Forked)
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

    def __init__(self, limits: Limits, hidden: list[str], workdir: str):
        import secrets

        sys_path = child_sys_path(hidden)
        token = secrets.token_hex(16)
        config = _config("bubblewrap", limits, RUNTIME_DEST, sys_path, None, token)
        self.box_config = {"tmp_size": limits.tmp_size, "nobody": NOBODY}
        self.ended: dict[str, int] = {}  # a student's sandbox (its token) -> how it ended
        self.broken = False  # a sandbox it started failed before answering: start no more

        def launch(sock_fd, out_fd):
            argv = _python_argv(RUNTIME_DEST, "zygote", [str(sock_fd), json.dumps(config)],
                                module="runtime.zygote")
            return _Bwrap.start(bwrap_command(argv, hidden, sys_path, stage_runtime(), limits,
                                              probe_bubblewrap()[2], keep_root=True),
                                sock_fd, out_fd, token, workdir)
        super().__init__(limits, launch)

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
        _close_pipes(self)

    def exit_description(self) -> str:
        return describe_exit(self.returncode(), self.limits, self.box.dead)


class SandboxPool:
    """One student's warm sandboxes (never shared between students).

    A chapter takes a sandbox (`acquire`) and gives it back (`release`). Up to `size` chapters
    run at once in the same sandbox, each in a child forked from its warm worker (so torch is
    imported once per student, not once per chapter at a time), in a folder of its own that
    the worker removes when the chapter ends. When no chapter is left in a sandbox it is reset
    (every other process killed, /tmp emptied) for the next one.

    If a sandbox dies while two chapters share it, neither can tell which one killed it, so
    each gets to redo what it was doing once (see `died_shared`), and from then on this
    student's chapters get a sandbox each: a chapter that kills its sandbox again is alone
    there, and that costs it alone. `prestart` starts a sandbox early, so its imports overlap
    the grader's own. With a `zygote` (batch grading), sandboxes are forked from it instead."""

    def __init__(self, limits: Limits | None = None, hide=(), size: int = 1,
                 zygote: Zygote | None = None):
        self.limits = limits or Limits.from_env()
        self.zygote = zygote
        self.hidden = hidden_paths(hide)
        self.size = max(1, size)
        self.sharing = self.size > 1
        self._boxes: list[WarmSandbox] = []   # alive or in use
        self._fresh: set[int] = set()         # ids of boxes no chapter has used yet
        self._cond = threading.Condition()
        self._workdir = tempfile.mkdtemp(prefix="autograder-sandbox-")
        os.chmod(self._workdir, 0o700)
        self.closed = False
        self._lease = student_uid()  # this student's own uid (as root), for all their sandboxes
        self.uid = self._lease.uid if self._lease else NOBODY

    def _new(self) -> WarmSandbox:
        box = None
        if self.zygote is not None and self.zygote.usable_now():
            try:
                box = WarmSandbox(self.limits, self.hidden, self._workdir, self.zygote, self.uid)
            except OSError:  # (SandboxDied) the zygote is gone: a sandbox of its own then
                box = None
        if box is None:
            box = WarmSandbox(self.limits, self.hidden, self._workdir, uid=self.uid)
        with self._cond:
            self._boxes.append(box)
        return box

    def prestart(self, n: int = 1) -> None:
        for _ in range(n):
            box = self._new()
            with self._cond:
                self._fresh.add(id(box))

    def adopt(self, box: WarmSandbox) -> None:
        """Take a fresh sandbox (never used by anyone) started elsewhere, e.g. a spare (only one
        that runs as this pool's uid: a uid is one student's)."""
        if box.uid != self.uid:
            box.kill()
            return
        with self._cond:
            self._boxes.append(box)
            self._fresh.add(id(box))

    def take_fresh(self) -> WarmSandbox | None:
        """A sandbox that no chapter has used yet (a prestarted one), or None; it leaves this
        pool (the caller's pool adopts it)."""
        with self._cond:
            for box in self._boxes:
                if id(box) in self._fresh and box.users == 0 and box.alive():
                    self._boxes.remove(box)
                    self._fresh.discard(id(box))
                    return box
        return None

    def acquire(self) -> WarmSandbox:
        """A sandbox with room for one more chapter (waiting for one being reset)."""
        with self._cond:
            while True:
                room = self.size if self.sharing else 1
                alive = [b for b in self._boxes if b.alive() or b.users]
                usable = [b for b in alive if not b.resetting and b.users < room and b.alive()]
                if usable:
                    box = min(usable, key=lambda b: b.users)
                    box.users += 1
                    self._fresh.discard(id(box))
                    return box
                if not any(b.resetting for b in alive):
                    break
                self._cond.wait(self.limits.control_timeout)
            box = self._new()  # under the lock, so two chapters starting at once share it
            box.users += 1
            return box

    def release(self, box: WarmSandbox) -> None:
        """A chapter is done with `box` (its child already killed)."""
        with self._cond:
            box.users -= 1
            if box.died_shared:
                self.sharing = False  # see the class docstring
            last = box.users == 0
            if last:
                box.resetting = True
        if not last:
            return
        keep = box.alive() and not self.closed and box.reset()
        with self._cond:
            box.resetting = False
            if not keep:
                if box in self._boxes:
                    self._boxes.remove(box)
            self._cond.notify_all()
        if not keep:
            box.kill()

    def close(self) -> None:
        self.closed = True
        with self._cond:
            boxes, self._boxes = list(self._boxes), []
            self._cond.notify_all()
        for box in boxes:
            box.kill()
        shutil.rmtree(self._workdir, ignore_errors=True)
        if self._lease is not None:
            procs.kill_uid(self.uid)  # (nothing should be left: the namespaces are gone)
            self._lease.release()
            self._lease = None

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def student_uid():
    """A `uids.Lease` on a uid of a student's own where the grader is root, else None (the
    sandbox then runs as the grader's own uid, in a user namespace). OSError when the range is
    exhausted: `nobody` then, as before (said on stderr)."""
    if os.geteuid() != 0 or sys.platform != "linux":
        return None
    from . import uids

    try:
        return uids.lease()
    except OSError as e:
        print(f"autograder: {e}; this student's code runs as nobody (65534)", file=sys.stderr)
        return None


def time_now() -> float:
    import time

    return time.monotonic()

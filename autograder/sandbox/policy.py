"""What a sandboxed child sees: the staged runtime (`shared/` and `runtime/`, nothing else of the
package), the paths hidden from it (solutions, the grader's copies, the reference cache), its
sys.path and environment, and bubblewrap's argv built from them."""
from __future__ import annotations

import atexit
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .limits import Limits, NOBODY


from ..references.solutions import PACKAGE_DIR, REPO_DIR, solutions_dir
from ..references.store import cache_dir

# What the child imports, staged whole: nothing secret (no references, no cases, no solutions).
# tests/unit/test_runtime_boundary.py fails if anything there imports from outside these folders.
RUNTIME_PACKAGES = ("shared", "runtime")
RUNTIME_DEST = "/run/autograder-runtime"  # where the staged modules appear inside bubblewrap


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
    solutions (`references.solutions.solutions_dir`), $AUTOGRADER_HIDE (os.pathsep separated;
    results and hidden test data belong here), the reference outcomes' cache folder
    (`references.store.cache_dir`) and `extra`. Each is defined once, where it is used."""
    library = interpreter_dirs()
    # An installed grader's "repository" is site-packages itself: its package is hidden (below),
    # the rest of site-packages (torch) must stay visible.
    repo = [] if any(os.path.realpath(REPO_DIR) == os.path.realpath(d) for d in library) else [str(REPO_DIR)]
    paths = repo + [str(PACKAGE_DIR), str(solutions_dir())]
    paths += [p for p in os.environ.get("AUTOGRADER_HIDE", "").split(os.pathsep) if p]
    paths += [os.fspath(p) for p in extra]
    paths += grader_copies(library)
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
    args = [bwrap] + _namespace_options(root, variant)
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    gpu = sorted(glob.glob("/dev/nvidia*"))
    for _, _, op in _filesystem_ops(hidden, sys_path, limits, variant, gpu):
        args += op
    args += ["--proc", "/proc", "--dev", "/dev"]
    for dev in gpu:
        args += ["--dev-bind", dev, dev]
    args += ["--perms", "0755", "--dir", "/run", "--ro-bind", str(stage), RUNTIME_DEST]
    args += ["--chdir", "/tmp"]
    args += _privilege_options(root, keep_root, uid)
    return args + python_argv


def _namespace_options(root: bool, variant: int) -> list[str]:
    """The namespaces to unshare."""
    if root:  # a user namespace would map the sandbox's uid to root outside; drop with setpriv
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    args = ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try"]
    if variant == 0:
        args += ["--disable-userns"]
    return args


def _filesystem_ops(hidden: list[str], sys_path: list[str], limits: Limits, variant: int,
                    gpu: list[str]) -> list[tuple[str, int, list[str]]]:
    """The sandbox's file system as (dest, order at equal path, bwrap args), in the order to
    apply them: shallowest path first."""
    ops: list[tuple[str, int, list[str]]] = []
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
    sys_dirs = ["/sys"] if gpu else ["/sys/devices/system/cpu"]
    for d in sys_dirs:
        if os.path.isdir(d):
            ops.append((d, 0, ["--ro-bind", d, d]))
    for d in _python_dirs(sys_path):
        if any(_under(d, b) for b in bound) or _under("/tmp", d):
            continue  # already visible (e.g. /usr/lib/python3), or /tmp itself (a script's folder)
        ops.append((d, 0, ["--ro-bind", d, d]))
    ops += _hiding_ops(hidden, ops)
    ops += _parent_dir_ops(ops, bound)
    ops.sort(key=lambda op: (_depth(op[0]), op[1], op[0]))
    return ops


def _hiding_ops(hidden: list[str], ops: list) -> list:
    """Hidden paths that lie inside something bound get an empty tmpfs (or /dev/null) on top."""
    visible = [op[0] for op in ops if op[2][0] == "--ro-bind"]
    hiding = []
    for h in hidden:
        if any(_under(h, v) for v in visible) and os.path.exists(h):
            if os.path.isdir(h):
                hiding.append((h, 1, ["--tmpfs", h]))
            else:
                hiding.append((h, 1, ["--ro-bind", "/dev/null", h]))
    return hiding


def _parent_dir_ops(ops: list, bound: list[str]) -> list:
    """Directories on the way to a bound path are created 0755 (bwrap would make them 0700)."""
    made, dirs = set(), []
    for dest, _, op in ops:
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
            dirs.append((p, -1, ["--perms", "0755", "--dir", p]))
    return dirs


def _privilege_options(root: bool, keep_root: bool, uid: int) -> list[str]:
    """How the sandboxed process gives up root (where the grader runs as root), ending with `--`."""
    if root and keep_root:
        return ["--cap-add", "ALL", "--"]
    if root:
        setpriv = shutil.which("setpriv")
        if setpriv:
            return ["--", setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        return ["--"]  # the worker drops privileges itself (config "drop")
    return ["--"]


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
        wanted = [p for p in paths if os.path.exists(p)]
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

def base_env(home: str, token: str) -> dict:
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


def child_config(mode: str, limits: Limits, runtime: str, sys_path: list[str], drop, token: str) -> dict:
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


def python_argv(runtime: str, entry: str, args: list[str], module: str = "runtime.child") -> list[str]:
    code = ("import sys; sys.path[:0] = [%r]; from autograder.%s import %s; "
            "%s(sys.argv[1:])" % (runtime, module, entry, entry))
    argv = [sys.executable, "-B", "-u"]
    if sys.version_info >= (3, 11):
        argv.append("-P")
    return argv + ["-c", code] + args


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

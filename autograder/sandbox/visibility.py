"""What a sandboxed child may see and import: the staged runtime (`shared/` and `runtime/`,
nothing else of the package), the paths hidden from it (the checkout, the solutions, the
grader's copies, the reference cache) and the interpreter's own folders it imports from. Facts
of this machine and this grader, read by `policy.SandboxPolicy` when it is built."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import threading
from multiprocessing import util
from pathlib import Path

from .. import settings as _settings
from ..references.solutions import PACKAGE_DIR, REPO_DIR, solutions_dir
from ..references.store import cache_dir
from .limits import NOBODY
from . import scratch

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
        root = Path(scratch.mkdtemp("autograder-runtime-"))
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
        # A batch's pool workers leave by os._exit, skipping atexit: multiprocessing's own
        # finalizers run there (and only in the process that registered them).
        util.Finalize(None, shutil.rmtree, args=(root, True), exitpriority=10)
        _STAGE = root
        return root


# --------------------------------------------------------------------------- paths

def under(path: str, parent: str) -> bool:
    """Whether `path` is `parent` or lies inside it."""
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
    paths += list(_settings.current().hide)
    paths += [os.fspath(p) for p in extra]
    paths += grader_copies(library)
    if (cache := cache_dir()) is not None:  # the stored reference outcomes hold the hidden inputs
        paths.append(str(cache))
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
            if not under(q, h):
                continue
            if any(under(pre, h) and pre != h and under(q, pre) for pre in prefixes):
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
        if not any(under(p, a) or under(os.path.realpath(p), a) for a in allowed):
            continue
        if os.path.exists(p) and not is_hidden(p, hidden) and p not in out:
            out.append(p)
    return out


def python_dirs(sys_path: list[str]) -> list[str]:
    """The Python installation's folders to bind: its prefixes, its executable's folder and `sys_path`."""
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



# --------------------------------------------------------------------------- who could read them

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

"""What a student's process does to itself before any student code runs, and cannot undo: the
imports it needs (so a late privilege drop leaves nothing to import), the drop, the resource
limits, a GPU memory share, and the memory case's cap."""
from __future__ import annotations


import os
import signal
import sys

from .procs import status_field


# Imported by the warm worker before any fork, and before a late privilege drop (fallback as
# root) for a Python installation that the unprivileged user cannot read (pyenv under /root):
# what notebooks and their graded code import. Sympy (torch's symbolic shapes) is imported
# before any fork: torch.broadcast_shapes and the meta device import it, and inside the memory
# case's cap it would take 34 MB of the student's headroom. Not torch._dynamo (0.7 s): the
# device check does without it (execute._avoid_dynamo_import); only a late drop imports it,
# for code that compiles.
LATE_DROP_IMPORTS = ("torch._dynamo",)
PREIMPORT = ("resource", "ctypes", "torch", "torch.nn", "torch.nn.functional", "torch.utils._device",
             "torch.fx.experimental.symbolic_shapes",
             "torch.utils._device",  # `with torch.device(...)` imports it lazily (execute._Defaults)
             "numpy", "numpy.random", "math", "cmath", "random", "itertools", "functools",
             "collections", "typing", "dataclasses", "copy", "json", "time", "socket",
             "subprocess", "threading", "signal", "uuid", "inspect", "traceback", "linecache",
             "warnings", "operator", "string", "textwrap", "io", "contextlib", "weakref", "re",
             "enum", "abc", "struct", "heapq", "bisect", "statistics", "fractions", "decimal",
             "numbers", "pprint", "types", "pickle", "tempfile", "pathlib", "shutil")


def _drop(config: dict) -> None:
    """Become the unprivileged user named in the config (no groups, no_new_privs)."""
    drop = config.get("drop")
    if drop:
        os.setgroups([])
        os.setgid(drop[1])
        os.setuid(drop[0])
        if os.getuid() != drop[0] or os.geteuid() != drop[0]:
            os._exit(70)
        prctl(38, 1)  # PR_SET_NO_NEW_PRIVS


def prepare(config: dict) -> None:
    """Before anything else: drop privileges (if asked and not late), set sys.path and the hard
    limits. A late drop imports PREIMPORT first, then drops."""
    sys.path[:] = config["sys_path"]
    if config.get("drop") and config.get("drop_late"):
        import importlib

        for name in (*PREIMPORT, *LATE_DROP_IMPORTS):
            try:
                importlib.import_module(name)
            except Exception:
                pass
    _drop(config)
    if config.get("no_userns") and os.getuid() != 0:
        from .confine import no_user_namespaces

        if not no_user_namespaces() and config.get("no_userns") == "required":
            os._exit(72)
    if config.get("subreaper"):  # after the drop: changing credentials clears PDEATHSIG  # the fallback: no PID namespace to do these for us
        prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the student's code stay ours
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: die with the grader
    os.makedirs(os.environ.get("MPLCONFIGDIR", "/tmp/.matplotlib"), exist_ok=True)


def prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:
        pass


def set_limits(config: dict) -> None:
    try:
        import resource
    except ImportError:  # not on Linux/macOS
        return
    rlimits = dict(config["rlimits"])
    headroom = config.get("data_headroom")
    if headroom:  # the memory case's child (autograder.session.memory_case): this much beyond what it
        # holds now (torch included), counted over every mapping (RLIMIT_AS sees shared and
        # file-backed ones, which RLIMIT_DATA does not), with no GPU (its cases run on the CPU)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        _one_malloc_arena()
        if config.get("mapped_heap"):
            map_large_blocks()
        for name, key in (("DATA", "VmData:"), ("AS", "VmSize:")):
            cap = headroom + status_bytes(key)
            rlimits[name] = min(rlimits.get(name) or cap, cap)
    for name, value in rlimits.items():
        res = getattr(resource, f"RLIMIT_{name}", None)
        if res is None or value is None:
            continue
        try:
            soft, hard = resource.getrlimit(res)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass
    if headroom:
        confine_memory_case(resource, rlimits["AS"])
    nproc = config.get("nproc")
    res = getattr(resource, "RLIMIT_NPROC", None)
    if nproc and res is not None and os.getuid() != 0:
        if config.get("nproc_relative"):
            nproc += _tasks_of(os.getuid())
        try:
            resource.setrlimit(res, (nproc, nproc))
        except (ValueError, OSError):
            pass


# Well-known libraries a chapter 7 notebook may import (plots, statistics, progress bars): the
# memory case's child imports those its cells import before its cap is measured (`preimport`).
LIBRARIES = frozenset({"numpy", "scipy", "matplotlib", "IPython", "pandas", "seaborn", "sklearn",
                       "tqdm", "einops", "PIL", "sympy"})


def preimport(names) -> None:
    """Import `names` (modules of LIBRARIES the notebook's cells import, found in their source
    by the grader: `session.memory_case.libraries_imported`) before the memory case's cap is
    measured, so that what importing them maps (scipy's and OpenBLAS's code, matplotlib's, about
    200 MiB of address space with IPython.display) is not counted against the case, which an
    honest solution lost under the cap (stop 49). Library code only: sys.path holds the
    installation's folders, not the student's (`python -P`, the sandbox's sys.path), and no
    cell has run. A name that does not import is left to the cell that imports it."""
    import importlib

    for name in names or ():
        if isinstance(name, str) and name.split(".")[0] in LIBRARIES:
            try:
                importlib.import_module(name)
            except BaseException:  # (ImportError, or a library's own failure: the cell says so)
                pass


def cuda_fraction(fraction) -> None:
    """This child's share of the GPU's memory (`Limits.gpu_share`), applied when CUDA first
    starts (torch's queued lazy calls), so a chapter that never uses CUDA does not start it.
    It bounds torch's caching allocator; `autograder.sandbox.gpu_share` does the rest."""
    if not fraction or fraction >= 1 or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return
    try:
        import torch

        def apply():
            torch.cuda.set_per_process_memory_fraction(float(fraction))

        if torch.cuda.is_initialized():
            apply()
        else:
            torch.cuda._lazy_call(apply)
    except Exception:  # no CUDA build, or a torch without these: nothing to bound
        pass


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # (glibc's malloc.h)


def _one_malloc_arena() -> None:
    """Every thread allocates from glibc's main arena: by default each new thread that
    allocates gets an arena of its own, which reserves 64 MiB of address space, and the memory
    case's cap counts it (a notebook that set torch's threads to 8 lost the case, stop 49)."""
    _mallopt(M_ARENA_MAX, 1)


def map_large_blocks(threshold: int = 128 << 10) -> None:
    """glibc maps every block of `threshold` bytes or more of its own and unmaps it when it is
    freed: its default (a threshold that grows to the largest block freed so far) puts large
    blocks in the heap, where a small block kept between them (honest code's per-block maximum)
    can pin the holes they leave, and the heap grows by a block per block of keys. Page faults
    on every block make this slower, so the memory case uses it only to measure again a run
    that ran out of memory (`autograder.session.memory_case`). A libc without mallopt (not
    glibc) keeps its own policy."""
    _mallopt(M_MMAP_THRESHOLD, threshold)


def _mallopt(option: int, value: int) -> None:
    """glibc's mallopt; nothing where the C library has none."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(option, value)
    except (AttributeError, OSError):
        pass


MEMORY_CASE_UNCONFINED = 73  # the exit status of a memory case's child that could not be confined


def confine_memory_case(resource, address_space: int) -> None:
    """The memory case's child seals what it holds, now that its caps count it
    (`confine.seal_mappings`; where the kernel cannot, Linux before 6.10: docs/security.md),
    refuses shared anonymous memory, memfd_create, shmget, sockets, new processes and programs
    (`confine.no_hidden_memory`), then checks that its address-space cap and that filter are in
    place, the filter on every thread; where either is not, it exits before any student code
    runs, so a memory case is never credited where memory went unmeasured."""
    from .confine import no_hidden_memory, seal_mappings

    seal_mappings()

    filtered = no_hidden_memory() and every_thread_filtered()
    try:
        capped = resource.getrlimit(resource.RLIMIT_AS)[1] <= address_space
    except (ValueError, OSError):
        capped = False
    if not (filtered and capped):
        why = b"no seccomp filter on every thread" if not filtered else b"no address-space limit"
        os.write(2, b"the memory case cannot be measured here: " + why + b"\n")
        os._exit(MEMORY_CASE_UNCONFINED)


def every_thread_filtered() -> bool:
    """Whether every thread of this process has the seccomp filters this one has. A filter
    installed with prctl binds the calling thread and the threads it starts later, not those
    already running: a thread that a library started at import (OpenBLAS's pool, before the
    environment kept it from doing so) could map shared memory beside the memory case's cap."""
    def filters(status: str) -> str | None:
        with open(status) as f:
            for line in f:
                if line.startswith("Seccomp_filters:"):  # (Linux 5.9+)
                    return line.split(":", 1)[1].strip()
        return None

    try:
        tasks = os.listdir("/proc/self/task")
        mine = filters("/proc/thread-self/status")
        if mine is None:  # (an older kernel, gVisor: the count is not shown, so one thread only)
            return len(tasks) == 1
        for tid in tasks:
            try:
                if filters(f"/proc/self/task/{tid}/status") != mine:
                    return False
            except (FileNotFoundError, ProcessLookupError):  # (a thread that has just ended)
                continue
    except OSError:
        return False
    return mine != "0"


def status_bytes(key: str) -> int:
    """A size from /proc/self/status in bytes (VmData: what RLIMIT_DATA counts, heap and
    private writable mappings; VmSize: what RLIMIT_AS counts, every mapping)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tasks_of(uid: int) -> int:
    """Tasks (threads included) this user already runs; RLIMIT_NPROC counts them all."""
    count = 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status", "rb") as f:  # (bytes: any process's name, see status_field)
                status = f.read()
            if (status_field(status, b"Uid") or "").split()[:1] == [str(uid)]:
                count += int(status_field(status, b"Threads") or 1)
        except (OSError, ValueError):
            continue
    return count

"""The grading process's temporary folders, each listed where the batch can find it if the
process is killed before it removes them.

A batch worker removes its folders (its staged runtime, zygote, sandbox and session folders)
as it ends; one that is killed (the watchdog, a stop's last resort, a student) cannot. Each
worker lists every folder it makes in a ledger in the batch's spool, and the command removes
what is listed there when the batch ends (`remove_listed`). The folders stay where they were,
in the system's temporary folder: a longer path would shorten what the student's code may
name under its TMPDIR (a socket's path is at most 108 bytes), and the uid clean-up of
`sandbox.uid_cleanup` looks there for what a student's uid owns.

A batch command that is itself killed (SIGKILL, a cluster job out of time or memory) cannot
remove them either. Its spool (`claim_spool`) says which process owns it, and lists the
command's own folders (the first zygote's) too; the next batch on the machine removes the
spools whose owner is gone and what they list (`sweep_abandoned`).
"""
from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile

PREFIX = "autograder-"
MP_PREFIX = "pymp-"  # (multiprocessing's folder for its forkserver's socket: `batch.forkserver`)
SPOOL_PREFIX = PREFIX + "batch-"
OWNER = "owner"  # in a claimed spool: "pid start-time pid-namespace" of the command that made it
_LEDGER: str | None = None  # this process's list of its folders (a batch worker's), or None
_CLAIMED: str | None = None  # the batch command's spool (`claim_spool`)


def keep_ledger(path: str) -> None:
    """List this process's folders in `path` from now on."""
    global _LEDGER
    _LEDGER = path


def mkdtemp(prefix: str) -> str:
    """`tempfile.mkdtemp(prefix=prefix)` (a PREFIX name), listed in the ledger if there is one."""
    path = tempfile.mkdtemp(prefix=prefix)
    list_folder(path)
    return path


def list_folder(path: str) -> None:
    """List `path` in the ledger if there is one (it is removed only if `remove_listed` takes
    its name: PREFIX..., or multiprocessing's MP_PREFIX...)."""
    if _LEDGER is not None:
        with open(_LEDGER, "a", encoding="utf-8") as f:
            f.write(path + "\n")


def claim_spool() -> str:
    """The batch command's spool, made at its start: a SPOOL_PREFIX folder of the temporary
    folder whose `OWNER` names this process, where this process lists its own folders from
    now on, removed with what it lists when this process exits (its runs' spools are folders
    in it: `claimed_spool`). Spools of killed commands are removed first (`sweep_abandoned`)."""
    global _CLAIMED
    sweep_abandoned()
    spool = tempfile.mkdtemp(prefix=SPOOL_PREFIX)
    with open(os.path.join(spool, OWNER + ".tmp"), "w", encoding="utf-8") as f:
        f.write(_identity(os.getpid()) or "")
    os.replace(os.path.join(spool, OWNER + ".tmp"), os.path.join(spool, OWNER))
    keep_ledger(os.path.join(spool, f"ledger-{os.getpid()}"))
    atexit.register(_release, spool, (PREFIX,))  # (multiprocessing removes its own folder at exit)
    _CLAIMED = spool
    return spool


def claimed_spool() -> str | None:
    """This process's claimed spool (None: not a batch command)."""
    return _CLAIMED


def _release(spool: str, names: tuple = (PREFIX, MP_PREFIX)) -> None:
    for folder in (spool, *_subfolders(spool)):
        remove_listed(folder, names)
    shutil.rmtree(spool, ignore_errors=True)


def _identity(pid: int) -> str | None:
    """What tells process `pid` from a later one of the same number: its start time and PID
    namespace (None: no such process here)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            start = f.read().rsplit(b")", 1)[1].split()[19].decode()
        return f"{pid} {start} {os.stat('/proc/self/ns/pid').st_ino}"
    except (OSError, IndexError, ValueError):
        return None


def sweep_abandoned() -> None:
    """Remove the spools of batch commands that are gone (killed: they could not), with what
    they list: only this user's spools, and only where their owner is of this PID namespace
    (a command in another container that shares the folder is not seen here, and is left)."""
    top = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(top) if n.startswith(SPOOL_PREFIX)]
    except OSError:
        return
    namespace = (_identity(os.getpid()) or "").split()[2:]
    for name in names:
        spool = os.path.join(top, name)
        try:
            info = os.lstat(spool)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            with open(os.path.join(spool, OWNER), encoding="utf-8") as f:
                owner = f.read().split()
        except OSError:  # (no owner: an older grader's spool, or one being made)
            continue
        if len(owner) != 3 or not owner[0].isdigit() or owner[2:] != namespace:
            continue
        if _identity(int(owner[0])) != " ".join(owner):
            _release(spool)


def _subfolders(spool: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(spool) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def remove_listed(spool: str, names: tuple = (PREFIX, MP_PREFIX)) -> None:
    """Remove every folder listed in the ledgers (`ledger-*`) in `spool` that is still there:
    only folders of the temporary folder whose names start with one of `names`, whatever a
    ledger says."""
    top = os.path.realpath(tempfile.gettempdir())
    try:
        entries = os.listdir(spool)
    except OSError:
        return
    for name in entries:
        if not name.startswith("ledger-"):
            continue
        try:
            with open(os.path.join(spool, name), encoding="utf-8") as f:
                paths = f.read().splitlines()
        except OSError:
            continue
        for path in paths:
            if os.path.realpath(os.path.dirname(path)) == top and \
                    os.path.basename(path).startswith(names) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)

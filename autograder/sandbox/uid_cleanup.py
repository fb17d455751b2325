"""After a student's uid is done (the container mode: its `SandboxPool` or `Child`): nothing of theirs stays.

Without namespaces the student's code shares the machine's /tmp, /var/tmp and /dev/shm, and the
kernel keeps a keyring per uid and System V IPC objects (shared memory, message queues,
semaphores) that outlive their processes. A student could leave a world-readable file or segment
there (their code, a copy of their answers) for a later student to read or run, or a key in
their uid's keyring for whoever gets that uid next. So when the student's processes are gone:
every file their uid owns in those folders is removed, their IPC objects too, and their
keyrings are cleared. Their TMPDIR (and HOME) is a folder
of the session's own (`StudentSession`), removed with it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys

from ..runtime.procs import as_uid

SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

KEYCTL = {"x86_64": 250, "aarch64": 219, "i686": 288, "ppc64le": 287, "s390x": 280}  # syscall numbers
KEYCTL_CLEAR, USER_KEYRING, USER_SESSION_KEYRING = 7, -4, -5
IPC_RMID = 0


_DIR_FLAGS = (os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK  # (a FIFO swapped in: no wait)
              | getattr(os, "O_CLOEXEC", 0))
MAX_DEPTH = 64         # folders below a shared one: deeper is not walked (the clean-up is incomplete)
MAX_ENTRIES = 200_000  # entries looked at in all: a classmate could keep making folders ahead of it


class _Incomplete(Exception):
    """The walk met its size limit (MAX_ENTRIES): some of the uid's files may be left."""


def remove_files_of(uid: int, dirs=SHARED_DIRS) -> tuple[int, bool]:
    """Remove what `uid` owns in `dirs`: at their top and in any world-writable folder below
    (the only places another uid's files can hold theirs); a folder of theirs goes whole. Links
    are removed, never followed. Returns (entries removed, whether the walk was complete).

    This runs as root, in folders other students write to while they are graded, so every step
    is relative to a folder it opened (`dir_fd`, `O_NOFOLLOW`, each folder checked by device
    and inode against what was read), never a path: by path, a classmate swapping a folder for
    a link between the scan and the removal had root remove a file of that name anywhere. The
    walk holds one open folder per level, at most MAX_DEPTH levels and MAX_ENTRIES entries, and
    opens nothing that could block; what it cannot finish it reports, for the caller to keep
    the uid from the next student (`release_clean`)."""
    budget = [MAX_ENTRIES, True]  # (entries left to look at, no folder left unwalked)
    removed, complete = 0, True
    for d in dirs:
        try:
            fd = os.open(d, _DIR_FLAGS)
        except OSError:
            continue
        try:
            removed += _walk(fd, uid, 0, False, budget)
        except _Incomplete:
            complete = False
        except OSError:  # (EMFILE, ...: the walk could not finish)
            complete = False
        finally:
            os.close(fd)
    return removed, complete and budget[1]


def _walk(folder: int, uid: int, depth: int, theirs: bool, budget: list) -> int:
    """The open `folder`'s entries of `uid` removed (all of them when `theirs`: a folder of
    the uid's, emptied before it goes), world-writable folders of others searched; how many
    entries went."""
    removed = 0
    try:
        names = [e.name for e in os.scandir(folder)]
    except OSError:
        return 0
    budget[0] -= len(names)
    if budget[0] < 0:
        raise _Incomplete("too many entries")
    for name in names:
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            continue
        owned = theirs or st.st_uid == uid
        if stat.S_ISDIR(st.st_mode) and (owned or st.st_mode & stat.S_IWOTH):
            if depth >= MAX_DEPTH:
                budget[1] = False  # (the rest of the walk goes on)
                continue
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=folder)  # (a link in its place: ELOOP)
            except OSError as e:
                if e.errno == errno.EMFILE:
                    raise
                continue
            try:
                found = os.fstat(sub)
                if (found.st_dev, found.st_ino) != (st.st_dev, st.st_ino):
                    continue  # (swapped since the stat: not the folder that was read)
                removed += _walk(sub, uid, depth + 1, owned, budget)
            finally:
                os.close(sub)
            if owned:
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=folder)
                    removed += 1
        elif owned:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
                removed += 1
    return removed


def clear_keyrings(uid: int) -> None:
    """Clear `uid`'s user and user-session keyrings (as that uid: `as_uid`)."""
    import ctypes
    import platform

    nr = KEYCTL.get(platform.machine())
    if os.geteuid() != 0 or sys.platform != "linux" or nr is None:
        return
    syscall = ctypes.CDLL(None, use_errno=True).syscall  # (loaded before the fork)
    try:
        as_uid(uid, lambda: [syscall(nr, KEYCTL_CLEAR, ring) for ring in (USER_KEYRING, USER_SESSION_KEYRING)]
               and 0)
    except OSError:
        pass


def remove_ipc_of(uid: int) -> int:
    """Remove the System V shared memory segments, message queues and semaphore sets `uid` owns
    or created (as /proc/sysvipc lists them; as root, on Linux); how many went. A segment
    still attached goes when its last process detaches, and the uid's processes are gone."""
    if os.geteuid() != 0 or sys.platform != "linux":
        return 0
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    removers = {"shm": lambda i: libc.shmctl(i, IPC_RMID, None), "msg": lambda i: libc.msgctl(i, IPC_RMID, None),
                "sem": lambda i: libc.semctl(i, 0, IPC_RMID)}
    removed = 0
    for kind, remove in removers.items():
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as f:
                header, *rows = f.read().splitlines()
        except (OSError, ValueError):
            continue
        names = header.split()  # (key, then the id: shmid, msqid or semid; uid and cuid further on)
        for row in rows:
            entry = dict(zip(names, row.split()))
            try:
                ident, owners = int(entry[names[1]]), {int(entry["uid"]), int(entry["cuid"])}
            except (KeyError, ValueError, IndexError):
                continue
            if uid in owners and remove(ident) == 0:
                removed += 1
    return removed


_QUARANTINED: list = []  # leases kept until this process ends: their uid's clean-up did not finish


def clean_up(uid: int) -> bool:
    """The uid's files, IPC objects and keyrings removed; whether completely (never raises)."""
    try:
        _, complete = remove_files_of(uid)
    except Exception:
        complete = False
    try:
        remove_ipc_of(uid)
        clear_keyrings(uid)
    except Exception:
        complete = False
    return complete


def release_clean(lease) -> None:
    """Clean up after `lease`'s uid, then hand it back; or, where the clean-up could not finish
    (a hostile tree of folders), keep it from every later student of this run (its lock held
    until the process ends)."""
    if clean_up(lease.uid):
        lease.release()
    else:
        _QUARANTINED.append(lease)

"""Unprivileged user ids for students' code, one per student being graded at once (grader as root).

The kernel counts some things per user: processes (RLIMIT_NPROC), keyrings, inotify watches,
user namespaces. If every student ran as `nobody`, one student's fork bomb would stop another's
threads and a key left in `nobody`'s keyring would reach the next student. So each student being
graded gets a uid of their own from a range that nothing else uses (`AUTOGRADER_UID_RANGE`,
default 62000-62999: no passwd entry needed; a uid with one, or with a process running, is
skipped). A uid is held with a lock on a file, so the batch's worker processes never hand out the
same one at once (a process that dies lets go of its lock), and the range is walked in turn, so
a uid comes back only after every other one has been used: what a student leaves behind in the
kernel (a key in the user keyring) does not reach the next student who gets that uid for as long
as the range lasts.
"""
from __future__ import annotations

import fcntl
import os
import pwd

from .. import settings as _settings
LOCK_DIRS = ("/run/autograder-uids", "/tmp/autograder-uids")


def uid_range() -> tuple[int, int]:
    """(first, last) from $AUTOGRADER_UID_RANGE ("62000-62999"), else the default
    (`settings.Settings.uid_range`)."""
    return _settings.current().uid_range


def _lock_dir() -> str:
    for d in LOCK_DIRS:
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
            if st.st_uid == os.geteuid() and not (st.st_mode & 0o077):
                return d
        except OSError:
            continue
    raise OSError("no folder to hold the student uids' locks (tried " + ", ".join(LOCK_DIRS) + ")")


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def running_uids() -> set[int]:
    """The real uids of every process on this machine (as /proc shows them)."""
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.add(os.stat(f"/proc/{pid}").st_uid)
            except OSError:
                pass
    return out


class Lease:
    """One uid, held until `release` (or until this process ends)."""

    def __init__(self, uid: int, fd: int):
        self.uid, self._fd = uid, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # (closing drops the lock)
            self._fd = None

    def __del__(self):
        self.release()


def lease() -> Lease:
    """A uid of the range that no one holds and nothing uses. OSError if there is none."""
    first, last = uid_range()
    folder = _lock_dir()
    size = last - first + 1
    turn_fd = os.open(os.path.join(folder, "turn"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(turn_fd, fcntl.LOCK_EX)
        try:
            start = int(os.pread(turn_fd, 32, 0) or b"0") % size
        except ValueError:
            start = 0
        busy = running_uids()
        for step in range(size):
            uid = first + (start + step) % size
            if uid in busy or _has_account(uid):
                continue
            fd = os.open(os.path.join(folder, f"{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            os.ftruncate(turn_fd, 0)
            os.pwrite(turn_fd, str((start + step + 1) % size).encode(), 0)
            # A uid's keyrings, files and IPC objects outlive its processes: what its last
            # holder (this run's student or an earlier run's, whose clean-up may not have
            # finished) left must not reach the next. A uid whose files cannot all be removed
            # is skipped.
            from .uid_cleanup import clear_keyrings, remove_files_of, remove_ipc_of
            if not remove_files_of(uid)[1]:
                os.close(fd)
                continue
            remove_ipc_of(uid)
            clear_keyrings(uid)
            return Lease(uid, fd)
    finally:
        os.close(turn_fd)
    raise OSError(f"every uid of {first}-{last} is in use (AUTOGRADER_UID_RANGE)")

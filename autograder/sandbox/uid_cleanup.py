"""After a student's uid is done (the container mode: its `SandboxPool` or `Child`): nothing of theirs stays.

Without namespaces the student's code shares the machine's /tmp, /var/tmp and /dev/shm, and the
kernel keeps a keyring per uid. A student could leave a world-readable file there (their code, a
copy of their answers) for a later student to read or run, or a key in their uid's keyring for
whoever gets that uid next. So when the student's processes are gone: every file their uid owns
in those folders is removed, and their keyrings are cleared. Their TMPDIR (and HOME) is a folder
of the session's own (`StudentSession`), removed with it.
"""
from __future__ import annotations

import os
import shutil
import stat
import sys

SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

KEYCTL = {"x86_64": 250, "aarch64": 219, "i686": 288, "ppc64le": 287, "s390x": 280}  # syscall numbers
KEYCTL_CLEAR, USER_KEYRING, USER_SESSION_KEYRING = 7, -4, -5


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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def remove_files_of(uid: int, dirs=SHARED_DIRS) -> int:
    """Remove what `uid` owns in `dirs`: at their top and in any world-writable folder below
    (the only places another uid's files can hold theirs); a folder of theirs goes whole. Links
    are removed, never followed. Returns how many entries were removed.

    Every step is relative to an open folder (`dir_fd`), never a path: this runs as root, in
    folders other students write to while they are graded. By path, a student could swap a
    folder on the way for a link between the scan and the removal, and have root remove a file
    of that name anywhere (a class's grades)."""
    removed = 0
    todo = []
    for d in dirs:
        try:
            todo.append(os.open(d, _DIR_FLAGS))
        except OSError:
            pass
    while todo:
        folder = todo.pop()
        try:
            removed += _remove_in(folder, uid, todo)
        finally:
            os.close(folder)
    return removed


def _remove_in(folder: int, uid: int, todo: list) -> int:
    """One open folder's entries of `uid` removed; its other world-writable folders opened
    and added to `todo`."""
    removed = 0
    try:
        names = [e.name for e in os.scandir(folder)]
    except OSError:
        return 0
    for name in names:
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if st.st_uid == uid:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=folder, ignore_errors=True)  # (fd-based: links not followed)
                else:
                    os.unlink(name, dir_fd=folder)
                removed += 1
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                sub = os.open(name, _DIR_FLAGS, dir_fd=folder)  # (a link in its place: ELOOP)
                found = os.fstat(sub)
                if (found.st_dev, found.st_ino) == (st.st_dev, st.st_ino):
                    todo.append(sub)
                else:  # (swapped since the stat: not the folder that was read)
                    os.close(sub)
        except OSError:
            pass
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


def clean_up(uid: int) -> None:
    remove_files_of(uid)
    clear_keyrings(uid)

"""The grading process's temporary folders, each listed where the batch can find it if the
process is killed before it removes them.

A batch worker removes its folders (its staged runtime, zygote, sandbox and session folders)
as it ends; one that is killed (the watchdog, a stop's last resort, a student) cannot. Each
worker lists every folder it makes in a ledger in the batch's spool, and the command removes
what is listed there when the batch ends (`remove_listed`). The folders stay where they were,
in the system's temporary folder: a longer path would shorten what the student's code may
name under its TMPDIR (a socket's path is at most 108 bytes), and the uid clean-up of
`sandbox.uid_cleanup` looks there for what a student's uid owns.
"""
from __future__ import annotations

import os
import shutil
import tempfile

PREFIX = "autograder-"
_LEDGER: str | None = None  # this process's list of its folders (a batch worker's), or None


def keep_ledger(path: str) -> None:
    """List this process's folders in `path` from now on."""
    global _LEDGER
    _LEDGER = path


def mkdtemp(prefix: str) -> str:
    """`tempfile.mkdtemp(prefix=prefix)` (a PREFIX name), listed in the ledger if there is one."""
    path = tempfile.mkdtemp(prefix=prefix)
    if _LEDGER is not None:
        with open(_LEDGER, "a", encoding="utf-8") as f:
            f.write(path + "\n")
    return path


def remove_listed(spool: str) -> None:
    """Remove every folder listed in the ledgers (`ledger-*`) in `spool` that is still there:
    only folders of the temporary folder named PREFIX..., whatever a ledger says."""
    top = os.path.realpath(tempfile.gettempdir())
    for name in os.listdir(spool):
        if not name.startswith("ledger-"):
            continue
        try:
            with open(os.path.join(spool, name), encoding="utf-8") as f:
                paths = f.read().splitlines()
        except OSError:
            continue
        for path in paths:
            if os.path.realpath(os.path.dirname(path)) == top and os.path.basename(path).startswith(PREFIX) \
                    and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)

"""The batch's first zygote, started by the command before it imports torch.

Kept free of torch imports (like `forkserver`), so the zygote's sandbox imports torch while the
command and the forkserver do, instead of after the command has (about 1.7 s of a batch's start
on two cores)."""
from __future__ import annotations

import os
import shutil

from ..sandbox.modes import SandboxMode

_STARTED = None  # (the command's Zygote, the address it clones at)


def start(limits) -> None:
    """In the command (as root with bubblewrap): one zygote sandbox that imports torch while this
    process does, and forks a zygote for each batch worker that asks (`Zygote.cloned`). Without
    it each worker started a sandbox of its own and imported torch there, before its first
    student. Nothing where it cannot start."""
    global _STARTED
    import atexit
    import socket

    from ..sandbox import scratch
    from ..sandbox.policy import hidden_paths
    from ..sandbox.warm import Zygote

    if _STARTED is not None or not Zygote.usable(SandboxMode.BUBBLEWRAP):
        return
    workdir = scratch.mkdtemp("autograder-zygote-")  # (0700: only root reaches the socket; listed)
    address = os.path.join(workdir, "clone")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
            listener.bind(address)
            listener.listen(16)
            zygote = Zygote(limits, hidden_paths(), workdir, listener)
    except OSError:
        shutil.rmtree(workdir, ignore_errors=True)
        return

    def end() -> None:
        zygote.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    atexit.register(end)
    _STARTED = (zygote, address)


def address() -> str | None:
    """Where a batch worker asks the first zygote for a zygote of its own (None: it was not
    started, and each worker starts one)."""
    return _STARTED[1] if _STARTED else None

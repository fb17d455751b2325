"""Warm sandboxes kept ready for the next student: `SandboxPool`, the one owner of a student's
sandboxes, and `student_pool`, the one rule for making one."""
from __future__ import annotations

import os
import shutil
import threading

from .. import settings as _settings
from ..runtime import procs
from .limits import Limits, NOBODY
from . import scratch
from .modes import SandboxChoice, SandboxMode
from .policy import hidden_paths, own_pid_namespace, student_uid
from .warm import SandboxDied, WarmSandbox, Zygote


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
    the grader's own. With a `zygote` (batch grading), sandboxes are forked from it instead.
    In the container mode a sandbox is a warm worker process as the student's uid, without
    namespaces (`WarmSandbox`); closing the pool removes that uid's files and keyrings too."""

    def __init__(self, limits: Limits | None = None, hide=(), size: int = 1,
                 zygote: Zygote | None = None, mode: SandboxMode = SandboxMode.BUBBLEWRAP):
        self.limits = limits or _settings.current().limits
        self.mode = SandboxMode(mode)
        self.zygote = zygote if self.mode == SandboxMode.BUBBLEWRAP else None
        self.hidden = hidden_paths(hide)
        self.size = max(1, size)
        self.sharing = self.size > 1
        self._boxes: list[WarmSandbox] = []   # alive or in use
        self._fresh: set[int] = set()         # ids of boxes no chapter has used yet
        self._cond = threading.Condition()
        self._workdir = scratch.mkdtemp("autograder-sandbox-")
        os.chmod(self._workdir, 0o700)
        self.closed = False
        self._lease = student_uid()  # this student's own uid (as root), for all their sandboxes
        self.uid = self._lease.uid if self._lease else NOBODY
        if self.mode == SandboxMode.CONTAINER and self._lease is not None:
            os.chown(self._workdir, self.uid, self.uid)  # their HOME and TMPDIR (no /tmp of their own)

    def _new(self) -> WarmSandbox:
        box = None
        if self.zygote is not None and self.zygote.usable_now():
            try:
                box = WarmSandbox(self.limits, self.hidden, self._workdir, self.zygote, self.uid)
            except OSError:  # (SandboxDied) the zygote is gone: a sandbox of its own then
                box = None
        if box is None:
            box = WarmSandbox(self.limits, self.hidden, self._workdir, uid=self.uid, mode=self.mode)
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
                if self.closed:  # (the grading was stopped: no sandbox is started after that)
                    raise SandboxDied("the student's sandboxes were closed: the grading was stopped")
                room = self.size if self.sharing else 1
                alive = [b for b in self._boxes if b.alive() or b.users]
                usable = [b for b in alive if not b.resetting and b.users < room and b.alive()]
                if usable:
                    box = min(usable, key=lambda b: b.users)
                    box.users += 1
                    self._fresh.discard(id(box))
                    break
                if not any(b.resetting for b in alive):
                    box = self._new()  # under the lock, so two chapters starting at once share it
                    box.users += 1
                    break
                self._cond.wait(self.limits.control_timeout)
        self._sweep()
        return box

    def _sweep(self) -> None:
        """The container mode, before a chapter starts: kill every process of the student's uid
        that is neither a live warm worker of this pool nor below one. That is what escaped its
        chapter: a helper whose chapter killed its own worker (it then belongs to init, and may
        have wiped its environment's token), which would otherwise compute beside the memory
        case's capped child or outlive its chapter's limits. (Under bubblewrap the sandbox's
        PID namespace ends such a process with its worker.)"""
        if self.mode != SandboxMode.CONTAINER or self._lease is None:
            return
        for _ in range(self.limits.kill_rounds):
            with self._cond:
                workers = {b.proc.pid for b in self._boxes if b.proc is not None and b.alive()}
            # (one reading: a process that starts meanwhile is seen next time, never taken for a
            # stray because its parent was read before it existed; no process can leave the uid)
            theirs = procs.parents_of_uid(self.uid)
            strays = [pid for pid in theirs if not _below(pid, workers, theirs)]
            if not strays:
                return
            for pid in strays:
                procs.kill_tree(pid, self.limits.kill_rounds)

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

    def close(self, release_gpu: bool = False) -> None:
        """Kill the student's sandboxes and every process of their uid, remove their files, then
        hand the uid back. With `release_gpu`, wait first until the GPU's driver holds nothing of
        theirs (`gpu_share.release`), while the uid is still theirs."""
        self.closed = True
        with self._cond:
            boxes, self._boxes = list(self._boxes), []
            self._cond.notify_all()
        for box in boxes:
            box.kill()
        if self._lease is not None:
            # (the kill(-1) backstop only where the student's processes outlive their sandboxes:
            # the end of a PID namespace of their own has killed them all)
            procs.kill_uid(self.uid, backstop=not own_pid_namespace(self.mode))
        shutil.rmtree(self._workdir, ignore_errors=True)  # (after the uid's processes are gone)
        if release_gpu:
            from .gpu_share import release

            release(self.uid)
        if self._lease is not None:
            lease, self._lease = self._lease, None
            if self.mode == SandboxMode.CONTAINER:
                from .uid_cleanup import release_clean

                release_clean(lease)  # its files in the machine's /tmp, /var/tmp, /dev/shm; its keyrings
            else:
                lease.release()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def student_pool(sandbox: SandboxChoice, limits: Limits | None = None, hide=(), size: int = 1,
                 zygote: Zygote | None = None) -> SandboxPool | None:
    """One student's warm sandboxes where `sandbox` is bubblewrap, or the container mode as root
    (a uid of the student's own), else None (the fallback mode starts each child as a process
    of its own). Made by whoever grades the
    student, who closes it after their last chapter: the command line's `grade`,
    `Grader.grade_path` when it is handed none, a batch worker. A `StudentSession` is handed
    the pool and never makes one, so no sandbox outlives its student unseen."""
    if not pooled(sandbox.mode):
        return None
    return SandboxPool(limits, hide, size, zygote, sandbox.mode)


def pooled(mode: SandboxMode) -> bool:
    """Whether this mode's children are forked from a student's warm worker (a `SandboxPool`)."""
    return mode == SandboxMode.BUBBLEWRAP or (mode == SandboxMode.CONTAINER and os.geteuid() == 0)


def _below(pid: int, ancestors: set[int], parents: dict[int, int]) -> bool:
    """Whether `pid` is one of `ancestors` or a descendant of one, through `parents` (pid ->
    parent, the uid's processes: a descendant of its worker is of its uid all the way up)."""
    for _ in range(len(parents) + 1):
        if pid in ancestors:
            return True
        if pid not in parents:
            return False
        pid = parents[pid]
    return False

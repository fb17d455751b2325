"""One uid per student being graded at once (grader as root): what the kernel counts per user
(processes, keyrings) is each student's own, and no student can make a user namespace.

Two students run at the same time, each in a sandbox pool of their own (as `batch` gives them),
with and without a zygote.
"""
from __future__ import annotations

import ctypes
import os
import time

import pytest
import torch

from autograder.shared.calls import Call
from autograder.sandbox.limits import Limits
from autograder.sandbox.modes import SandboxMode
from autograder.sandbox.pool import SandboxPool
from autograder.sandbox.warm import Zygote
from autograder.sandbox.policy import hidden_paths
from autograder.session.student_session import StudentSession
from autograder.sandbox.uids import uid_range

ROOT = os.geteuid() == 0
pytestmark = [pytest.mark.needs_bwrap,
              pytest.mark.skipif(not ROOT, reason="a uid per student is for a grader that runs as root with bubblewrap")]
FAST = Limits(cell_timeout=20.0, call_timeout=20.0, grace=1.0, notebook_timeout=60.0)


def call(target, *args):
    return Call(chapter="t", exercise=target, case="c", target=target, args=list(args))


@pytest.fixture(params=["own sandbox", "zygote"])
def zygote(request, tmp_path):
    if request.param == "own sandbox":
        yield None
        return
    if not Zygote.usable(SandboxMode.BUBBLEWRAP):
        pytest.skip("no zygote here")
    z = Zygote(FAST, hidden_paths(), str(tmp_path))
    assert z.wait_ready(time.monotonic() + 60) is None
    yield z
    z.kill()


HOG = '''import os, time, torch
held = []
def hold(x):
    """Fork until the kernel says no, and keep every child."""
    while True:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        held.append(pid)
    return torch.tensor([len(held)])
'''

THREADS = '''import threading, torch
def threads(x):
    ts = [threading.Thread(target=lambda: None) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    torch.set_num_threads(4)
    return x @ x
'''

KEYS = '''import ctypes, platform, torch
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
USER_KEYRING, KEYCTL_READ = -4, 11
def add(x):
    key = libc.syscall(ADD_KEY, b"user", b"classmate-answer", b"42", 2, USER_KEYRING)
    return torch.tensor([key > 0])
def count(x):
    buf = ctypes.create_string_buffer(4096)
    n = libc.syscall(KEYCTL, KEYCTL_READ, USER_KEYRING, buf, 4096)
    return torch.tensor([max(n, 0) // 4])
'''

USERNS = '''import ctypes, subprocess, torch
def userns(x):
    rc = ctypes.CDLL(None, use_errno=True).unshare(0x10000000)
    shell = subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode
    return torch.tensor([rc, ctypes.get_errno(), shell])
'''


def test_two_students_have_their_own_uid_process_count_and_keyring(zygote):
    with SandboxPool(FAST, zygote=zygote) as pool_a, SandboxPool(FAST, zygote=zygote) as pool_b:
        first, last = uid_range()
        assert pool_a.uid != pool_b.uid and first <= min(pool_a.uid, pool_b.uid) <= max(pool_a.uid, pool_b.uid) <= last
        with StudentSession([HOG, KEYS], FAST, sandbox="bubblewrap", sandboxes=pool_a) as a, \
                StudentSession([THREADS, KEYS], FAST, sandbox="bubblewrap", sandboxes=pool_b) as b:
            a.start()
            b.start()
            held = a.run(call("hold", torch.ones(1)))
            assert held.error is None and 100 < held.outputs[0].item() <= FAST.nproc
            x = torch.randn(4, 4, dtype=torch.float64)
            out = b.run(call("threads", x))  # before: "can't start new thread"
            assert out.error is None, out.error
            assert torch.allclose(out.outputs[0], x @ x)
            added = a.run(call("add", torch.ones(1)))
            assert added.error is None and added.outputs[0].item(), added.error
            assert a.run(call("count", torch.ones(1))).outputs[0].item() >= 1
            assert b.run(call("count", torch.ones(1))).outputs[0].item() == 0  # A's key is not B's


def test_no_student_can_make_a_user_namespace(zygote):
    with SandboxPool(FAST, zygote=zygote) as pool, \
            StudentSession([USERNS], FAST, sandbox="bubblewrap", sandboxes=pool) as s:
        s.start()
        out = s.run(call("userns", torch.ones(1)))
    assert out.error is None, out.error
    rc, errno, shell = out.outputs[0].tolist()
    assert rc == -1 and errno == 1 and shell != 0  # EPERM, both ways


def test_a_uid_is_not_handed_out_twice_at_once_and_comes_back_last():
    from autograder.sandbox import uids

    a, b = uids.lease(), uids.lease()
    try:
        assert a.uid != b.uid
        first, last = uid_range()
        size = last - first + 1
        assert (b.uid - a.uid) % size == 1  # the range is walked in turn
    finally:
        a.release()
        b.release()
    c = uids.lease()
    try:
        assert c.uid not in (a.uid, b.uid)  # released ones come back only after the others
    finally:
        c.release()


def test_a_key_left_in_a_uids_keyring_does_not_reach_its_next_student(monkeypatch):
    """A uid's keyring outlives its processes (and the batch): a student who leaves a key there
    must not hand it to whoever is given that uid next, in this run or a later one."""
    from autograder.sandbox import uids
    from autograder.sandbox.uid_cleanup import KEYCTL, USER_KEYRING, as_uid

    syscall = ctypes.CDLL(None, use_errno=True).syscall
    nr = KEYCTL[os.uname().machine]
    add_key = {"x86_64": 248, "aarch64": 217}[os.uname().machine]
    first, last = uid_range()
    monkeypatch.setattr(uids, "uid_range", lambda: (last, last))  # (the one uid lease can give)

    def keys() -> int:
        return as_uid(last, lambda: max(syscall(nr, 11, USER_KEYRING, None, 0), 0) // 4)  # KEYCTL_READ

    as_uid(last, lambda: syscall(add_key, b"user", b"left-behind", b"42", 2, USER_KEYRING) <= 0)
    assert keys() == 1  # (the attack: a key in the uid's keyring, no process of it left)
    lease = uids.lease()
    try:
        assert lease.uid == last and keys() == 0
    finally:
        lease.release()


def test_a_folder_swapped_for_a_link_during_the_clean_up_removes_nothing_through_it(tmp_path, monkeypatch):
    """The attack on the clean-up of a student's uid (two students graded at once, the
    container mode): X leaves a file named like a victim's in a world-writable folder `b` of
    Y's; while root cleans up X's uid, Y swaps `b` for a link to the victim's folder. Root
    removed the victim's file through the link, by path; every step now is relative to the
    folder it opened (uid_cleanup.remove_files_of)."""
    from autograder.sandbox import uid_cleanup

    x, y = 64001, 64002
    shared, victim = tmp_path / "shared", tmp_path / "victim"
    a = shared / "a"
    b = a / "b"
    b.mkdir(parents=True)
    victim.mkdir()
    for folder in (shared, a, b):
        folder.chmod(0o777)
    for folder in (a, b):
        os.chown(folder, y, y)
    (b / "grades.csv").write_text("X's decoy")
    os.chown(b / "grades.csv", x, x)
    (victim / "grades.csv").write_text("the class's grades")
    os.chown(victim / "grades.csv", x, x)  # (even a file of X's uid: not through a link)
    real_scandir, calls = os.scandir, []

    def scandir(where):
        calls.append(where)
        if len(calls) == 3:  # (shared, a, then b: Y swaps b for a link just now)
            b.rename(a / "b-old")
            b.symlink_to(victim, target_is_directory=True)
        return real_scandir(where)

    monkeypatch.setattr(os, "scandir", scandir)
    removed, complete = uid_cleanup.remove_files_of(x, dirs=(str(shared),))
    monkeypatch.setattr(os, "scandir", real_scandir)
    assert (victim / "grades.csv").read_text() == "the class's grades"
    assert removed == 1 and complete and not (a / "b-old" / "grades.csv").exists()  # (X's own file, in the folder read)


def test_a_hostile_tree_never_crashes_the_clean_up_and_keeps_the_uid_from_later_students(tmp_path, monkeypatch):
    """Reviewer's attacks on the clean-up: a chain of 1,500 folders (shutil.rmtree recursed
    once per level: a RecursionError escaped, and the uid was never handed back), 400 open
    folders of a classmate beside the student's files under a limit of open files that fits MAX_DEPTH (every
    sibling was held open: EMFILE, and the student's files stayed for the next holder of the
    uid). The walk holds one folder per level: the files go; what it cannot finish keeps the
    uid out of this run's leases."""
    import resource

    from autograder.sandbox import uid_cleanup

    x, y = 64011, 64012
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    for i in range(400):  # a classmate's world-writable folders, each searched
        d = shared / f"y{i:03d}"
        d.mkdir()
        d.chmod(0o777)
        os.chown(d, y, y)
    (shared / "y399" / "x-left-this").write_text("x")
    os.chown(shared / "y399" / "x-left-this", x, x)
    deep = shared / "x-deep"
    deep.mkdir()
    os.chown(deep, x, x)
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(1500):  # (relative to an open folder: the path would pass PATH_MAX)
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (len(os.listdir("/proc/self/fd")) + uid_cleanup.MAX_DEPTH + 16, hard))
    try:
        removed, complete = uid_cleanup.remove_files_of(x, dirs=(str(shared),))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        level, n = deep, 0
        while (level / "d").exists():  # (flattened, so that pytest's own clean-up can remove it)
            n += 1
            os.rename(level / "d", shared / f"flat{n}")
            level = shared / f"flat{n}"
    assert not (shared / "y399" / "x-left-this").exists()
    assert not complete  # (the chain is deeper than MAX_DEPTH)

    class Lease:
        uid, released = x, False

        def release(self):
            self.released = True

    lease = Lease()
    monkeypatch.setattr(uid_cleanup, "SHARED_DIRS", (str(shared),))
    monkeypatch.setattr(uid_cleanup, "remove_files_of", lambda uid: (0, False))
    uid_cleanup.release_clean(lease)
    assert not lease.released and lease in uid_cleanup._QUARANTINED
    uid_cleanup._QUARANTINED.remove(lease)


def test_a_file_an_earlier_holder_left_does_not_reach_the_uids_next_student(monkeypatch, tmp_path):
    """A run whose clean-up could not finish (or was killed) leaves the uid's files behind:
    the next lease of that uid, in a later run, removes them first, and skips a uid whose
    files it cannot all remove."""
    from autograder.sandbox import uid_cleanup, uids

    first, last = uid_range()
    monkeypatch.setattr(uids, "uid_range", lambda: (last, last))  # (the one uid lease can give)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    left = shared / "answers.txt"
    left.write_text("an earlier holder's")
    os.chown(left, last, last)
    monkeypatch.setattr(uid_cleanup, "SHARED_DIRS", (str(shared),))
    monkeypatch.setattr(uid_cleanup.remove_files_of, "__defaults__", ((str(shared),),))
    lease = uids.lease()
    try:
        assert lease.uid == last and not left.exists()
    finally:
        lease.release()
    monkeypatch.setattr(uid_cleanup, "remove_files_of", lambda uid: (0, False))
    with pytest.raises(OSError, match="in use"):
        uids.lease()


def _ipc_of(uid: int) -> list:
    """(kind, id) of every System V IPC object `uid` owns."""
    found = []
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as f:
            header, *rows = f.read().splitlines()
        for row in rows:
            entry = dict(zip(header.split(), row.split()))
            if int(entry["uid"]) == uid:
                found.append((kind, int(row.split()[1])))
    return found


def test_ipc_objects_a_uid_left_do_not_reach_its_next_student(monkeypatch):
    """System V shared memory, message queues and semaphores outlive their processes, and the
    container mode shares the machine's IPC namespace: a segment of a student's, readable by
    all (a copy of their answers), is removed by their clean-up and by the uid's next lease;
    another uid's stays."""
    from autograder.sandbox import uid_cleanup, uids

    libc = ctypes.CDLL(None, use_errno=True)
    _, last = uid_range()
    monkeypatch.setattr(uids, "uid_range", lambda: (last, last))  # (the one uid lease can give)

    def leave() -> int:  # the student's code: one of each, IPC_PRIVATE, IPC_CREAT | 0666
        return int(min(libc.shmget(0, 4096, 0o1666), libc.msgget(0, 0o1666), libc.semget(0, 1, 0o1666)) < 0)

    assert uid_cleanup.as_uid(last, leave) == 0 and len(_ipc_of(last)) == 3
    lease = uids.lease()
    try:
        assert lease.uid == last and _ipc_of(last) == []
    finally:
        lease.release()
    mine = libc.shmget(0, 4096, 0o1600)
    try:
        assert uid_cleanup.as_uid(last, leave) == 0 and len(_ipc_of(last)) == 3
        assert uid_cleanup.clean_up(last) and _ipc_of(last) == []
        assert ("shm", mine) in _ipc_of(os.geteuid())
    finally:
        libc.shmctl(mine, uid_cleanup.IPC_RMID, None)

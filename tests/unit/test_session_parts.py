"""The parts of a StudentSession, in process and without a sandbox: the pipes (`Channel.send`
and `receive`, over plain os pipes), the typed report (`NotebookRun`, `CellRun`,
`CellRecorder`) and what the grader reads from it, and the budget sentinel."""
from __future__ import annotations

import os
import time

import pytest
import torch

from autograder.grading.grader import _start_notes
from autograder.sandbox.limits import Limits
from autograder.shared import protocol, wire
from autograder.shared.calls import Call
from autograder.session.channel import Budget, Capture, Channel, Lost, LostKind
from autograder.session.notebook_run import CellRecorder, CellRun, NotebookRun
from autograder.session.student_session import StudentSession
from autograder.session.time_budget import BUDGET_SPENT, budget_message

LIMITS = Limits(drain_cap=1 << 20, exit_wait=0.1)


class PipeChild:
    """A stand-in for `sandbox.processes.Child`: the three pipes, from the child's far side."""

    token = "t0ken"

    def __init__(self):
        self.res_fd, self.res_w = os.pipe()
        self.out_fd, self.out_w = os.pipe()
        self.req_r, self.req_fd = os.pipe()
        for fd in (self.res_fd, self.out_fd, self.req_fd):
            os.set_blocking(fd, False)

    def wait(self, timeout):
        return None

    def close(self):
        for fd in (self.res_fd, self.res_w, self.out_fd, self.out_w, self.req_r, self.req_fd):
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.fixture
def child():
    c = PipeChild()
    yield c
    c.close()


def test_receive_gives_the_message_and_the_output_between(child):
    channel = Channel(child, LIMITS)
    capture = channel.captures[0] = Capture(Budget(100))
    os.write(child.out_w, b"hello")
    os.write(child.res_w, wire.encode(protocol.plain(protocol.ChildReady(pid=1, uid=2, seconds=0.5))))
    message = channel.receive(time.monotonic() + 5)
    assert message == protocol.ChildReady(pid=1, uid=2, seconds=0.5)
    channel.drain_output(1 << 10)
    channel.flush_output()
    assert capture.text() == "hello"


def test_receive_says_why_no_message_came(child):
    channel = Channel(child, LIMITS)
    t0 = time.monotonic()
    lost = channel.receive(t0 + 0.2)
    assert lost == Lost(LostKind.TIMEOUT) and time.monotonic() - t0 >= 0.2
    os.write(child.res_w, b"\xff" * 64)  # not a frame
    assert channel.receive(time.monotonic() + 5).kind == LostKind.MALFORMED
    other = PipeChild()
    try:
        os.close(other.res_w)
        assert Channel(other, LIMITS).receive(time.monotonic() + 5) == Lost(LostKind.DEAD)
    finally:
        other.close()


def test_send_writes_a_frame_and_fails_on_a_closed_pipe(child):
    channel = Channel(child, LIMITS)
    message = protocol.RunCells(["x = 1"], [], 1.0, 2.0)
    assert channel.send(message, time.monotonic() + 5)
    reader = wire.FrameReader()
    reader.feed(os.read(child.req_r, 1 << 16))
    assert protocol.from_plain(wire.decode(reader.pop())) == message
    os.close(child.req_r)  # the child ended
    assert not channel.send(message, time.monotonic() + 5)


def test_the_recorder_keeps_each_cells_first_run(child):
    recorder = CellRecorder(3, Budget(100))
    channel = Channel(child, LIMITS)
    recorder.listen(channel)
    channel.feed_output(b"one" + channel.separator + b"two")
    channel.flush_output()  # (segment 0 is the start-up's; cell 1 is segment 1)
    recorder.record(CellRun(2, "crash", {"type": "Crash", "message": "this cell crashed", "where": "<cell 2>"}))
    recorder.record(CellRun(2, "ok"))  # a later child's run of it does not replace the first
    cells = recorder.cells()
    assert [(c.cell, c.status) for c in cells] == [(1, "not run"), (2, "crash"), (3, "not run")]
    assert cells[0].output == "two"
    assert cells[1].message == "this cell crashed"
    assert cells[0].message == "not run: the notebook's time budget ran out before this cell"


def test_a_cell_message_names_the_error_and_where():
    error = CellRun(4, "error", {"type": "NameError", "message": "name 'q' is not defined",
                                 "where": "File <cell 4>\n  line 2 in f"})
    assert error.message == "NameError: name 'q' is not defined (  line 2 in f)"
    assert CellRun(1, "ok").message == ""


def test_the_grader_reads_the_typed_report():
    run = NotebookRun("fallback", "Sandbox: none", None,
                      [CellRun(1, "ok", output="a\n"), CellRun(2, "skipped"),
                       CellRun(3, "error", {"type": "ValueError", "message": "bad", "where": ""}, output="b")],
                      defined=["f"])
    assert run.output == "[cell 1]\na\n[cell 3]\nb\n"
    assert _start_notes(run) == ["sandbox: fallback", "Sandbox: none", "cell 2: ", "cell 3: ValueError: bad"]


def _session_without_child(monkeypatch, spawn_says: str | None, deadline: float | None) -> StudentSession:
    """A fallback session whose notebook 'ran' (no child) and whose next child cannot start."""
    session = StudentSession(["def f(x):\n    return x"], Limits(), sandbox="none", deadline=deadline)
    monkeypatch.setattr(session, "start", lambda: NotebookRun("fallback", "", None))
    monkeypatch.setattr(session._slot, "spawn", lambda: spawn_says)
    return session


def test_a_spent_budget_is_a_timeout_by_its_sentinel_not_by_its_text(monkeypatch):
    call = Call(chapter="t", exercise="f", case="c", target="f", args=[torch.ones(1)])
    spent = _session_without_child(monkeypatch, None, deadline=time.monotonic() - 1)
    with spent:
        assert spent._run_notebook() is BUDGET_SPENT
        outcome = spent._run(call, 1.0)  # (past run()'s own check: the budget ran out meanwhile)
    assert outcome.error["type"] == "Timeout" and outcome.error["message"] == budget_message(spent.limits)
    # a child that cannot start is a crash, even if what it says reads like the budget's message
    mimic = _session_without_child(monkeypatch, budget_message(Limits()), deadline=None)
    with mimic:
        outcome = mimic._run(call, 1.0)
    assert outcome.error["type"] == "Crash" and "could not be run again after a crash" in outcome.error["message"]


def test_a_session_never_makes_the_students_sandboxes():
    """Whoever grades the student owns their pool (`student_pool`: bubblewrap, and the container
    mode as root) and hands it down; a bubblewrap session without one is refused, not given a
    pool of its own."""
    from autograder.sandbox.modes import SandboxChoice, SandboxMode
    from autograder.sandbox.pool import SandboxPool, student_pool

    with pytest.raises(ValueError, match="SandboxPool"):
        StudentSession(["x = 1"], Limits(), sandbox=SandboxChoice(SandboxMode.BUBBLEWRAP))
    container = student_pool(SandboxChoice(SandboxMode.CONTAINER), Limits())
    try:
        if os.geteuid() == 0:  # (a uid of the student's own: their warm worker runs as it)
            assert isinstance(container, SandboxPool) and container.mode == SandboxMode.CONTAINER
        else:
            assert container is None
    finally:
        if container is not None:
            container.close()
    assert student_pool(SandboxChoice(SandboxMode.FALLBACK), Limits()) is None
    pool = student_pool(SandboxChoice(SandboxMode.BUBBLEWRAP), Limits(), size=2)
    try:
        assert isinstance(pool, SandboxPool) and pool.size == 2  # (no sandbox started yet)
    finally:
        pool.close()


def test_a_zombie_is_no_live_process_of_its_uid():
    """procs.pids_of_uid and parents_of_uid skip zombies: where PID 1 does not reap, they would
    make every kill_uid and sweep run all their rounds."""
    import os
    import time

    from autograder.runtime import procs

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        for _ in range(200):  # (until it has exited: a zombie, as nobody waits for it yet)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert pid not in procs.pids_of_uid(os.getuid())
        assert pid not in procs.parents_of_uid(os.getuid())
        assert os.getpid() in procs.pids_of_uid(os.getuid())
    finally:
        os.waitpid(pid, 0)


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="SYS_exit's number is x86-64's")
def test_a_process_whose_main_thread_ended_while_another_runs_is_still_killed(tmp_path):
    """Its main thread ended with the raw exit syscall, so /proc says "Z", but another thread
    still runs (reviewer's attack on the zombie filter): it is live, and kill_uid's targets."""
    import subprocess
    import sys
    import time

    from autograder.runtime import procs

    flag = tmp_path / "alive"
    code = ("import ctypes, threading, time\n"
            f"threading.Thread(target=lambda: (time.sleep(3), open({str(flag)!r}, 'w').write('ran'))).start()\n"
            "time.sleep(0.1)\n"
            "ctypes.CDLL(None).syscall(60, 0)\n")  # SYS_exit (x86-64): the main thread alone
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(300):
            with open(f"/proc/{p.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert p.pid in procs.pids_of_uid(os.getuid()) and p.pid in procs.parents_of_uid(os.getuid())
        procs.send(p.pid, 9)
        p.wait(10)
        time.sleep(3.5)
        assert not flag.exists(), "the thread outlived the kill"
    finally:
        p.kill()
        p.wait()


def test_kill_uid_stops_at_the_first_round_that_finds_nothing_new(monkeypatch):
    """A process already killed but not yet gone (a student's namespaces being torn down) is
    not a reason for another round: before, each student's end spun through all 20 rounds."""
    from autograder.runtime import procs

    scans, signals = [], []
    monkeypatch.setattr(procs, "pids_of_uid", lambda uid: scans.append(uid) or {4242, 4243})
    monkeypatch.setattr(procs, "send", lambda pid, sig: signals.append((pid, sig)))
    procs.kill_uid(12345)
    assert len(scans) == 2 and sorted(signals) == [(4242, 9), (4242, 19), (4243, 9), (4243, 19)]


ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _none_left(uid: int) -> bool:
    """No live process of `uid`, now and in every scan of the next 0.3 s (a killed process may
    take a few ms to go)."""
    from autograder.runtime import procs

    time.sleep(0.05)
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        if procs.pids_of_uid(uid):
            return False
    return True


@pytest.mark.skipif(not ROOT, reason="a uid of its own needs root")
def test_kill_uid_leaves_nothing_of_a_process_that_keeps_forking_away():
    """The runaway a student would write: a process that forks and exits in a tight loop, so its
    pid moves between a scan's listing of /proc and its reading (a scan alone missed it 4 times
    in 5: reviewer, stop 41). kill(-1) from the student's uid reaches it wherever it is."""
    from autograder.runtime import procs
    from autograder.sandbox import uids
    from autograder.sandbox.uid_cleanup import as_uid

    def runaway():
        while True:
            if os.fork():
                os._exit(0)

    lease = uids.lease()
    try:
        for _ in range(3):
            as_uid(lease.uid, runaway)  # (a fork of this process: the uid may not read its Python)
            time.sleep(0.2)
            procs.kill_uid(lease.uid)
            assert _none_left(lease.uid)
    finally:
        procs._kill_all_as(lease.uid)
        lease.release()


@pytest.mark.skipif(not ROOT, reason="a uid of its own needs root")
@pytest.mark.parametrize("name", [b"x\rUid:\t7", b"\xff\xfe", b"a\nUid:\t7", b"Uid:\t7"])
def test_a_process_is_found_whatever_name_it_gives_itself(name):
    """A student names their process (prctl PR_SET_NAME), and the name is the first line of its
    /proc status: a carriage return before a fake "Uid:" hid it from the scan, and so did bytes
    that are not UTF-8 (reviewer, stop 41). Found, its uid read right, and killed."""
    import ctypes

    from autograder.runtime import procs
    from autograder.runtime.prepare import _tasks_of
    from autograder.sandbox.gpu_share import uid_of
    from autograder.sandbox import uids
    from autograder.sandbox.uid_cleanup import as_uid

    r, w = os.pipe()

    def named():
        os.setsid()
        if os.fork():  # (away from its parent, as a daemon would go)
            os._exit(0)
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
        os.write(w, str(os.getpid()).encode())
        while True:
            time.sleep(0.05)

    lease = uids.lease()
    try:
        as_uid(lease.uid, named)
        os.close(w)
        pid = int(os.read(r, 32))
        with open(f"/proc/{pid}/comm", "rb") as f:
            assert f.read().rstrip(b"\n") == name[:15]
        assert pid in procs.pids_of_uid(lease.uid) and pid in procs.parents_of_uid(lease.uid)
        assert uid_of(pid) == lease.uid and _tasks_of(lease.uid) == 1  # (the GPU's, the fallback's NPROC)
        procs.kill_uid(lease.uid)
        assert _none_left(lease.uid)
    finally:
        os.close(r)
        procs._kill_all_as(lease.uid)
        lease.release()

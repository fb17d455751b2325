"""The warm worker: one sandbox per student, a fresh child forked per chapter, and the control
protocol between the grader and the warm worker."""
from __future__ import annotations

import socket
import time
import uuid

import pytest
import torch

from autograder.shared import protocol
from autograder.shared.calls import Call
from autograder.sandbox.limits import Limits
from autograder.sandbox.pool import SandboxPool
from autograder.session.student_session import StudentSession
from test_sandbox import DAEMON_CELL, processes_with

FAST = Limits(cell_timeout=1.5, call_timeout=1.5, grace=1.0, notebook_timeout=30.0)


def call(target, *args) -> Call:
    return Call(chapter="test", exercise=target, case="warm", target=target, args=list(args))


# ------------------------------------------------------------------ protocol

def test_every_control_message_round_trips():
    for message in (protocol.Ready(2, 65534, 1.5), protocol.Fork("ab", {"threads": 1}),
                    protocol.Forked(7), protocol.Kill(7), protocol.Exited(7, -9),
                    protocol.Reset(), protocol.ResetDone()):
        assert protocol.decode(protocol.encode(message)) == message


def test_every_chapter_message_round_trips_through_wire():
    from autograder.shared import wire

    for message in (protocol.ChildReady(3, 65534, 0.2), protocol.RunCells(["x = 1"], [2], 10.0, 120.0),
                    protocol.CellDone(1, "error", {"type": "E", "message": "m", "where": ""}, 0.1),
                    protocol.CellDone(2, "ok", None, 0.0), protocol.CellsDone(["x"]),
                    protocol.RunCall(4, {"target": "f"}, 10.0),
                    protocol.CallDone(4, {"outputs": [torch.ones(2)]})):
        back = protocol.from_plain(wire.decode(wire.encode(protocol.plain(message))))
        assert type(back) is type(message)
        assert repr(back) == repr(message)


def test_malformed_chapter_messages_are_rejected():
    for data in ([1], {"kind": "Ready", "pid": 1, "uid": 1, "seconds": 1.0},  # a control kind
                 {"kind": "CallDone", "id": 1}, {"kind": "CallDone", "id": True, "outcome": {}},
                 {"kind": "CellDone", "cell": 1, "status": "ok", "error": "x", "seconds": 0.0},
                 {"kind": "RunCells", "cells": "x = 1", "skip": [], "timeout": 1.0, "budget": 1.0}):
        with pytest.raises(protocol.ProtocolError):
            protocol.from_plain(data)


def test_malformed_control_messages_are_rejected():
    for data in (b"not json", b'{"kind": "Nope"}', b'{"kind": "Kill"}',
                 b'{"kind": "Kill", "pid": "7"}', b'{"kind": "Kill", "pid": true}',
                 b'{"kind": "Kill", "pid": 7, "extra": 1}', b"[1, 2]"):
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(data)


def test_fds_travel_with_a_fork_request():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = __import__("os").pipe()
    protocol.send(a, protocol.Fork("t", {}), [r])
    message, fds = protocol.receive(b)
    assert message == protocol.Fork("t", {}) and len(fds) == 1
    __import__("os").write(w, b"x")
    assert __import__("os").read(fds[0], 1) == b"x"
    a.close()
    assert protocol.receive(b) == (None, [])


# ------------------------------------------------------------------ one student, many chapters

@pytest.mark.needs_bwrap
def test_a_chapter_cannot_affect_the_next_chapter_of_the_same_student():
    """Chapter A patches torch, leaves a file in /tmp and a daemon, then kills itself; chapter
    B, forked afterwards from the same warm worker, sees none of it."""
    marker = f"warm-{uuid.uuid4().hex}"
    hostile = [
        "import torch, os\ntorch.add = lambda *a, **k: 'patched'\n"
        "open('/tmp/left-behind', 'w').write('x')",
        DAEMON_CELL.format(marker=marker),
        "def boom(x):\n    os._exit(3)",
    ]
    honest = ["import torch, os\n"
              "def f(x):\n    return torch.add(x, 1)\n"
              "def tmp_files(x):\n    return torch.tensor(len(os.listdir('/tmp')))"]
    with SandboxPool(FAST) as pool:
        with StudentSession(hostile, FAST, sandbox="bubblewrap", sandboxes=pool) as a:
            assert [c.status for c in a.start().cells] == ["ok", "ok", "ok"]
            deadline = time.monotonic() + 60  # waits end as soon as the daemon is there
            while not processes_with(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert processes_with(marker), "the daemon should run while the chapter is open"
            out = a.run(call("boom", torch.ones(1)))
            assert out.error["type"] == "Crash" and "status 3" in out.error["message"]
            box = a.box
        deadline = time.monotonic() + 30  # (the daemon would live 600 s)
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes_with(marker)
        with StudentSession(honest, FAST, sandbox="bubblewrap", sandboxes=pool) as b:
            b.start()
            assert b.box is box, "the same warm sandbox serves the next chapter"
            out = b.run(call("f", torch.ones(2)))
            assert out.error is None and out.outputs[0].tolist() == [2.0, 2.0]
            out = b.run(call("tmp_files", torch.ones(1)))
            assert out.error is None and out.outputs[0].item() <= 1  # at most .matplotlib


@pytest.mark.needs_bwrap
def test_a_chapter_that_kills_the_warm_worker_costs_only_its_own_call():
    """os.kill(-1) takes down every process of the sandbox, the warm worker included: that
    call crashes, the chapter goes on in a new sandbox, and so does the next chapter."""
    cells = ["import os, signal, time, torch\n"
             "def kill_all(x):\n    os.kill(-1, signal.SIGKILL)\n    time.sleep(5)\n    return x\n"
             "def f(x):\n    return x * 3"]
    with SandboxPool(FAST) as pool:
        with StudentSession(cells, FAST, sandbox="bubblewrap", sandboxes=pool) as a:
            a.start()
            assert a.run(call("kill_all", torch.ones(1))).error["type"] == "Crash"
            assert a.run(call("f", torch.ones(1))).outputs[0].item() == 3.0
        with StudentSession(cells, FAST, sandbox="bubblewrap", sandboxes=pool) as b:
            b.start()
            assert b.run(call("f", torch.ones(1))).outputs[0].item() == 3.0


@pytest.mark.needs_bwrap
def test_a_hanging_chapter_does_not_delay_the_next_one():
    cells = ["import signal, torch\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
             "def hang(x):\n    while True:\n        pass\n"
             "def f(x):\n    return x + 1"]
    with SandboxPool(FAST) as pool:
        with StudentSession(cells, FAST, sandbox="bubblewrap", sandboxes=pool) as a:
            a.start()
            assert a.run(call("hang", torch.ones(1))).error["type"] == "Timeout"
        with StudentSession(cells, FAST, sandbox="bubblewrap", sandboxes=pool) as b:
            b.start()
            assert b.run(call("f", torch.ones(1))).outputs[0].item() == 2.0
            assert b.children == 1


@pytest.mark.needs_bwrap
def test_a_malformed_control_message_ends_that_sandbox_only():
    """A malformed control message ends the warm worker (never a grader crash); the next
    chapter gets a fresh sandbox."""
    with SandboxPool(FAST) as pool:
        box = pool.acquire()
        assert box.wait_ready(time.monotonic() + 60) is None
        box.sock.send(b"x")  # not a control message: the worker ends, and the sandbox with it
        deadline = time.monotonic() + 30  # ends as soon as the worker is gone
        while box.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not box.alive()
        pool.release(box)
        with StudentSession(["def f(x):\n    return x"], FAST, sandbox="bubblewrap",
                            sandboxes=pool) as s:
            s.start()
            assert s.box is not box
            assert s.run(call("f", torch.ones(1))).error is None


# ------------------------------------------------------------------ chapters at once

def _in_threads(*fns):
    """Run the functions at once; their results (an exception is raised here)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(fns)) as pool:
        return [f.result() for f in [pool.submit(fn) for fn in fns]]


@pytest.mark.needs_bwrap
def test_two_chapters_run_at_once_in_one_sandbox_each_in_a_folder_of_its_own():
    waiting = ["import os, tempfile, time, torch\n"
               "open('here.txt', 'w').write('a')\n"
               "open(os.path.join(tempfile.gettempdir(), 'tmp.txt'), 'w').write('a')\n"
               "def wait_for_b(x):\n"
               "    for _ in range(100):  # 5 s: succeeds only if B runs meanwhile\n"
               "        if os.path.exists('/tmp/b-was-here'):\n"
               "            return x * 2\n"
               "        time.sleep(0.05)\n"
               "    return x * 0\n"
               "def files(x):\n    return torch.tensor(len(os.listdir('.')))"]
    other = ["import os, torch\n"
             "def mine(x):\n    return torch.tensor(float(os.path.exists('here.txt')))\n"
             "def mark(x):\n    open('/tmp/b-was-here', 'w').write('b')\n    return x\n"
             "def in_tmp(x):  # (not counting the worker's .matplotlib, nor the folder that importing\n"
             "    # torch._dynamo makes, $TMPDIR/torchinductor_<user>: the device check's fake tensors need it)\n"
             "    return torch.tensor(len([n for n in os.listdir('/tmp') if n[0] != '.' and not n.startswith('torchinductor_')]))"]
    slow = Limits(cell_timeout=1.5, call_timeout=8.0, grace=1.0, notebook_timeout=30.0)
    with SandboxPool(slow, size=2) as pool:
        a = StudentSession(waiting, slow, sandbox="bubblewrap", sandboxes=pool)
        b = StudentSession(other, slow, sandbox="bubblewrap", sandboxes=pool)
        with a, b:
            _in_threads(a.start, b.start)
            assert a.box is b.box, "one warm sandbox (one torch import) serves both chapters"
            assert a.run(call("files", torch.ones(1))).outputs[0].item() == 3  # + .matplotlib
            assert b.run(call("mine", torch.ones(1))).outputs[0].item() == 0.0, \
                "A's files are in A's folder, not B's"

            def b_while_a_waits():
                time.sleep(0.3)
                return b.run(call("mark", torch.ones(1)))
            waited, marked = _in_threads(lambda: a.run(call("wait_for_b", torch.ones(1))),
                                         b_while_a_waits)
            assert marked.error is None
            assert waited.outputs[0].item() == 2.0, "B ran while A's call was running"
            assert b.run(call("in_tmp", torch.ones(1))).outputs[0].item() == 3  # 2 folders + mark
    # both chapters done: the sandbox is reset, and the next chapter finds an empty /tmp
        with StudentSession(other, slow, sandbox="bubblewrap", sandboxes=pool) as c:
            c.start()
            assert c.box is a.box or a.box is None
            assert c.run(call("in_tmp", torch.ones(1))).outputs[0].item() == 1  # its own folder


@pytest.mark.needs_bwrap
def test_a_chapter_that_kills_a_shared_sandbox_costs_the_other_chapter_nothing():
    """os.kill(-1) in chapter A ends the sandbox while chapter B is in a call and in a slow
    cell: B's call and cell run again (in a sandbox of their own) and count as if nothing
    happened; A's call is a crash once it kills its own sandbox too."""
    killer = ["import os, signal, time, torch\n"
              "def kill_all(x):\n    time.sleep(0.3)\n    os.kill(-1, signal.SIGKILL)\n"
              "    time.sleep(5)\n    return x\n"
              "def f(x):\n    return x * 3"]
    victim = ["import time, torch\n"
              "def slow(x):\n    time.sleep(1.0)\n    return x + 1"]
    with SandboxPool(FAST, size=2) as pool:
        with StudentSession(killer, FAST, sandbox="bubblewrap", sandboxes=pool) as a, \
                StudentSession(victim, FAST, sandbox="bubblewrap", sandboxes=pool) as b:
            _in_threads(a.start, b.start)
            assert a.box is b.box
            killed, survived = _in_threads(lambda: a.run(call("kill_all", torch.ones(1))),
                                           lambda: b.run(call("slow", torch.ones(1))))
            assert killed.error["type"] == "Crash", killed.error
            assert survived.error is None and survived.outputs[0].item() == 2.0, survived.error
            assert not pool.sharing and a.box is not b.box, "a sandbox each from then on"
            assert a.run(call("f", torch.ones(1))).outputs[0].item() == 3.0
            assert b.run(call("slow", torch.ones(1))).outputs[0].item() == 2.0

    cell_killer = ["import os, signal, time\ntime.sleep(0.3)\nos.kill(-1, signal.SIGKILL)\n"
                   "time.sleep(5)", "def f(x):\n    return x * 3"]
    slow_cell = ["import time\ntime.sleep(1.0)", "def g(x):\n    return x - 1"]
    with SandboxPool(FAST, size=2) as pool:
        with StudentSession(cell_killer, FAST, sandbox="bubblewrap", sandboxes=pool) as a, \
                StudentSession(slow_cell, FAST, sandbox="bubblewrap", sandboxes=pool) as b:
            ra, rb = _in_threads(a.start, b.start)
            assert [c.status for c in rb.cells] == ["ok", "ok"], rb.cells
            assert [c.status for c in ra.cells] == ["crash", "ok"], ra.cells
            assert b.run(call("g", torch.ones(1))).outputs[0].item() == 0.0
            assert a.run(call("f", torch.ones(1))).outputs[0].item() == 3.0

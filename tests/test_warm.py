"""The warm worker: one sandbox per student, a fresh child forked per chapter, and the control
protocol between the grader and the warm worker."""
from __future__ import annotations

import socket
import time
import uuid

import pytest
import torch

from autograder import protocol
from autograder.calls import Call
from autograder.sandbox import Limits, SandboxPool, probe_bubblewrap
from autograder.session import StudentSession
from test_sandbox import DAEMON_CELL, processes_with

BWRAP_OK, BWRAP_WHY, _ = probe_bubblewrap()
needs_bwrap = pytest.mark.skipif(not BWRAP_OK, reason=f"bubblewrap unavailable: {BWRAP_WHY}")
FAST = Limits(cell_timeout=1.5, call_timeout=1.5, grace=1.0, notebook_timeout=30.0)


def call(target, *args) -> Call:
    return Call(chapter="test", exercise=target, case="warm", target=target, args=list(args))


# ------------------------------------------------------------------ protocol

def test_every_control_message_round_trips():
    for message in (protocol.Ready(2, 65534, 1.5), protocol.Fork("ab", {"threads": 1}),
                    protocol.Forked(7), protocol.Kill(7), protocol.Exited(7, -9),
                    protocol.Reset(), protocol.ResetDone()):
        assert protocol.decode(protocol.encode(message)) == message


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

@needs_bwrap
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
            assert [c["status"] for c in a.start()["cells"]] == ["ok", "ok", "ok"]
            deadline = time.monotonic() + 10
            while not processes_with(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert processes_with(marker), "the daemon should run while the chapter is open"
            out = a.run(call("boom", torch.ones(1)))
            assert out.error["type"] == "Crash" and "status 3" in out.error["message"]
            box = a._box
        deadline = time.monotonic() + 5
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes_with(marker)
        with StudentSession(honest, FAST, sandbox="bubblewrap", sandboxes=pool) as b:
            b.start()
            assert b._box is box, "the same warm sandbox serves the next chapter"
            out = b.run(call("f", torch.ones(2)))
            assert out.error is None and out.outputs[0].tolist() == [2.0, 2.0]
            out = b.run(call("tmp_files", torch.ones(1)))
            assert out.error is None and out.outputs[0].item() <= 1  # at most .matplotlib


@needs_bwrap
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


@needs_bwrap
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


@needs_bwrap
def test_a_malformed_control_message_ends_that_sandbox_only():
    """A malformed control message ends the warm worker (never a grader crash); the next
    chapter gets a fresh sandbox."""
    with SandboxPool(FAST) as pool:
        box = pool.acquire()
        assert box.wait_ready(time.monotonic() + 60) is None
        box.sock.send(b"x")  # not a control message: the worker ends, and the sandbox with it
        deadline = time.monotonic() + 10
        while box.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not box.alive()
        pool.release(box)
        with StudentSession(["def f(x):\n    return x"], FAST, sandbox="bubblewrap",
                            sandboxes=pool) as s:
            s.start()
            assert s._box is not box
            assert s.run(call("f", torch.ones(1))).error is None

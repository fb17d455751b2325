"""The zygote (batch grading as root): students' sandboxes forked from one process that imported
torch once, each in namespaces of its own. What must hold is what separate bubblewrap sandboxes
give: no shared /tmp, /dev/shm, processes, loopback or IPC, no privileges, and a student who
kills everything they can reach costs nobody else anything."""
from __future__ import annotations

import csv
import os
import socket
import tempfile
import time
import uuid

import pytest
import torch

from autograder.batch import grade_class as batch
from autograder.batch import workers
from autograder.shared.calls import Call
from autograder.grading.grader import Grader
from autograder.runtime import procs
from autograder.sandbox.uids import uid_range
from autograder.sandbox.limits import NOBODY, Limits
from autograder.sandbox.modes import SandboxMode
from autograder.sandbox.pool import SandboxPool
from autograder.sandbox.warm import Zygote, _SpawnedBox
from autograder.sandbox.policy import SandboxPolicy, hidden_paths
from autograder.shared.mounts import Mount
from autograder.session.student_session import StudentSession
from test_sandbox import processes_with

pytestmark = [pytest.mark.needs_bwrap,
              pytest.mark.skipif(not Zygote.usable(SandboxMode.BUBBLEWRAP),
                                 reason="the zygote needs bubblewrap and a grader running as root")]
FAST = Limits(cell_timeout=3.0, call_timeout=5.0, grace=1.0, notebook_timeout=30.0)


def call(target, *args) -> Call:
    return Call(chapter="test", exercise=target, case="zygote", target=target, args=list(args))


def _first_zygote(workdir: str) -> tuple[Zygote, str]:
    """A batch's first zygote (as `first_zygote.start` makes it) and its address."""
    address = os.path.join(workdir, "clone")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind(address)
        listener.listen(16)
        return Zygote(FAST, hidden_paths(), workdir, listener), address


@pytest.fixture(params=["its own", "forked by the batch's first"])
def zygote(request):
    """A worker's zygote: in a sandbox of its own, or forked by the batch's first zygote (what
    `batch` uses as root); every test below holds for both."""
    first = None
    if request.param == "its own":
        z = Zygote(FAST, hidden_paths(), tempfile.mkdtemp())
    else:
        first, address = _first_zygote(tempfile.mkdtemp())
        z = Zygote.cloned(FAST, address)
    assert z.wait_ready(time.monotonic() + 60) is None, bytes(z.output)
    yield z
    z.kill()
    if first is not None:
        first.kill()


def session(cells, pool) -> StudentSession:
    return StudentSession(cells, FAST, sandbox="bubblewrap", sandboxes=pool)


FACTS = '''
import os, socket, torch

def status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)

def cmdlines():
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                out.append(open(f"/proc/{p}/cmdline", "rb").read())
            except OSError:
                pass
    return out

def facts(port):
    """What this student can see of the other one (1 = seen), and its own privileges."""
    try:
        socket.create_connection(("127.0.0.1", int(port.item())), timeout=1).close()
        connected = 1.0
    except OSError:
        connected = 0.0
    me, init = status("self"), status(1)
    return torch.tensor([
        float(os.path.exists("/tmp/a-secret")), float(os.path.exists("/dev/shm/a-secret")),
        float(any(MARKER.encode() in c for c in cmdlines())), connected,
        float(int(me["Uid"].split()[0])), float(int(init["Uid"].split()[0])),
        float(sum(int(me[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))),
        float(int(init["CapEff"], 16) + int(init["CapBnd"], 16)),
        float(me["NoNewPrivs"].strip() == "1"), float(len(cmdlines())),
        float(len([n for n in os.listdir("/dev/pts") if n.isdigit()]))])
'''


def test_two_students_of_one_zygote_share_nothing(zygote):
    marker = f"zygote-{uuid.uuid4().hex}"
    a_cells = ["import os, socket, subprocess, torch\n"
               "open('/tmp/a-secret', 'w').write('a')\n"
               "open('/dev/shm/a-secret', 'w').write('a')\n"
               "terminal = os.openpty()\n"
               "server = socket.socket()\nserver.bind(('127.0.0.1', 0))\nserver.listen()\n"
               f"sleeper = subprocess.Popen(['/bin/sh', '-c', 'sleep 600; :', {marker!r}])\n"
               "def port(x):\n    return torch.tensor(server.getsockname()[1])\n"
               "def own_port(x):\n"
               "    socket.create_connection(('127.0.0.1', int(x.item())), timeout=1).close()\n"
               "    return x",
               f"MARKER = {marker!r}\n" + FACTS]
    b_cells = [f"MARKER = {marker!r}\n" + FACTS]
    with SandboxPool(FAST, zygote=zygote) as pool_a, SandboxPool(FAST, zygote=zygote) as pool_b:
        with session(a_cells, pool_a) as a, session(b_cells, pool_b) as b:
            assert [c.status for c in a.start().cells] == ["ok", "ok"]
            b.start()
            assert isinstance(a.box.proc, _SpawnedBox) and isinstance(b.box.proc, _SpawnedBox)
            assert a.box.proc.token != b.box.proc.token
            port = a.run(call("port", torch.ones(1))).outputs[0]
            assert a.run(call("own_port", port)).error is None  # loopback is up
            mine = a.run(call("facts", port)).outputs[0].tolist()
            assert mine[:4] == [1.0, 1.0, 1.0, 1.0], "A sees its own files, process and port"
            assert mine[-1] == 1.0, "and its own pseudo-terminal"
            assert processes_with(marker), "A's process runs"
            theirs = b.run(call("facts", port))
            assert theirs.error is None, theirs.error
            (seen_tmp, seen_shm, seen_proc, connected, uid, init_uid, caps, init_caps, nnp, procs,
             seen_pty) = theirs.outputs[0].tolist()
            assert (seen_tmp, seen_shm, seen_proc, connected, seen_pty) == (0.0,) * 5
            first, last = uid_range()
            assert uid == init_uid == pool_b.uid != pool_a.uid, "B's chapter and init run as B's own uid"
            assert first <= pool_a.uid <= last and first <= pool_b.uid <= last
            assert caps == 0.0 and init_caps == 0.0, "no capabilities, none to regain"
            assert nnp == 1.0
            assert procs <= 3, "B's /proc shows B's processes only"
    deadline = time.monotonic() + 30  # ends as soon as they are gone (the daemon would live 600 s)
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_with(marker), "closing A's sandbox ends every process of A's"
    assert zygote.alive()


def test_a_student_who_kills_everything_costs_no_one_else(zygote):
    """os.kill(-1) reaches every process the student could signal: only their own (their
    sandbox's init, the zygote and the other students are out of reach; with nothing else of
    theirs running, the kill finds no process at all)."""
    killer = ["import os, signal, time, torch\n"
              "def kill_all(x):\n    os.kill(-1, signal.SIGKILL)\n    time.sleep(5)\n    return x\n"
              "def f(x):\n    return x * 3"]
    other = ["import time, torch\n"
             "def slow(x):\n    time.sleep(1.0)\n    return x + 1"]
    with SandboxPool(FAST, zygote=zygote) as pool_a, SandboxPool(FAST, zygote=zygote) as pool_b:
        with session(killer, pool_a) as a, session(other, pool_b) as b:
            a.start()
            b.start()
            assert a.run(call("kill_all", torch.ones(1))).error["type"] in ("Crash", "ProcessLookupError")
            assert b.run(call("slow", torch.ones(1))).outputs[0].item() == 2.0
            assert a.run(call("f", torch.ones(1))).outputs[0].item() == 3.0
    assert zygote.alive()


def assert_graded_in_a_sandbox_of_its_own(zygote) -> None:
    with SandboxPool(FAST, zygote=zygote) as pool:
        with session(["def f(x):\n    return x + 1"], pool) as s:
            s.start()
            assert not isinstance(s.box.proc, _SpawnedBox)
            assert s.run(call("f", torch.ones(1))).outputs[0].item() == 2.0


def test_when_the_zygote_is_gone_students_get_sandboxes_of_their_own(zygote):
    zygote.kill()
    assert_graded_in_a_sandbox_of_its_own(zygote)


def test_a_zygote_whose_sandboxes_fail_to_start_is_not_used(zygote, monkeypatch):
    broken = (Mount("tmpfs", "/no/such/folder"),)  # its mount fails: the box exits
    monkeypatch.setattr(SandboxPolicy, "box_mounts", lambda policy: broken)
    assert not workers._try(zygote)
    assert zygote.broken and not zygote.usable_now() and zygote.alive()
    assert_graded_in_a_sandbox_of_its_own(zygote)


def test_the_zygote_stays_out_of_reach_of_what_it_starts(zygote):
    """It is root inside its own sandbox, which shows none of the grader's secrets."""
    assert zygote.ready.uid == 0
    with SandboxPool(FAST, zygote=zygote) as pool:
        box = pool.acquire()
        assert box.wait_ready(time.monotonic() + 30) is None
        assert box.ready.pid == 1 and box.ready.uid == pool.uid != NOBODY
        pool.release(box)


@pytest.fixture
def fresh_batch_worker(monkeypatch):
    """batch's per-process zygote, reset around the test."""
    monkeypatch.setattr(workers, "_ZYGOTE", None)
    yield
    if workers._ZYGOTE:
        workers._ZYGOTE.kill()


def _class(tmp_path):
    from grading_helpers import REPO

    for name, src in (("good", "solutions"), ("stub", "exercises")):
        (tmp_path / name).mkdir()
        for chapter in ("01_intuition", "05_masks"):
            (tmp_path / name / f"{chapter}.ipynb").write_bytes(
                (REPO / src / f"{chapter}.ipynb").read_bytes())
    return tmp_path


def test_batch_grades_through_the_zygote_and_scores_as_without(tmp_path, fresh_batch_worker,
                                                               monkeypatch):
    folder = _class(tmp_path)
    grader = Grader(sandbox="bubblewrap")
    with_zygote = batch.grade_class(folder, grader, jobs=1, progress=False, in_process=True)
    assert isinstance(workers._ZYGOTE, Zygote), "a root grader forks students from a zygote"
    workers._ZYGOTE.kill()
    monkeypatch.setattr(workers, "_ZYGOTE", None)
    monkeypatch.setattr(Zygote, "usable", staticmethod(lambda mode: False))
    without = batch.grade_class(folder, grader, jobs=1, progress=False, in_process=True)
    assert workers._ZYGOTE is False
    assert {n: r.score for n, r in with_zygote.items()} == {n: r.score for n, r in without.items()}
    assert with_zygote["good"].score == with_zygote["good"].max_score > 0
    assert with_zygote["stub"].score == 0


def test_a_zygote_that_cannot_start_costs_nothing(tmp_path, fresh_batch_worker, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("no zygote here")
    monkeypatch.setattr("autograder.sandbox.warm.Zygote.__init__", broken)
    results = batch.grade_class(_class(tmp_path), Grader(sandbox="bubblewrap"), jobs=1, in_process=True,
                                progress=False)
    assert results["good"].score == results["good"].max_score > 0
    assert workers._ZYGOTE is False


def _holders(inode: int) -> set[int]:
    """The pids of every process (seen from here, as root) that holds socket `inode` open."""
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    held.add(int(pid))
            except OSError:
                pass
    return held


def test_the_first_zygotes_listening_socket_reaches_no_one_it_forks():
    """Whoever holds the batch's first zygote's listening socket gets a zygote (root in its
    sandbox, making namespaces): only the first zygote holds it. Not the workers' zygotes it
    forks, not a student's sandbox or chapter, not the command once the zygote has started.
    And a worker's zygote that goes takes its students' sandboxes with it, and no one else's."""
    workdir = tempfile.mkdtemp()
    address = os.path.join(workdir, "clone")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind(address)
        listener.listen(16)
        inode = os.fstat(listener.fileno()).st_ino
        first = Zygote(FAST, hidden_paths(), workdir, listener)
    try:
        a, b = Zygote.cloned(FAST, address), Zygote.cloned(FAST, address)
        for z in (first, a, b):
            assert z.wait_ready(time.monotonic() + 60) is None, bytes(z.output)
        code = ["import os\ndef fds(x):\n    return x + len(os.listdir('/proc/self/fd'))"]
        with SandboxPool(FAST, zygote=a) as pool_a, SandboxPool(FAST, zygote=b) as pool_b:
            with session(code, pool_a) as sa, session(code, pool_b) as sb:
                sa.start()
                sb.start()
                assert sa.run(call("fds", torch.zeros(1))).outputs and sb.run(call("fds", torch.zeros(1))).outputs
                assert all(isinstance(s.box.proc, _SpawnedBox) for s in (sa, sb))
                (holder,) = _holders(inode)
                with open(f"/proc/{holder}/status") as f:
                    nspid = next(line for line in f if line.startswith("NSpid:")).split()
                assert int(nspid[-1]) == first.ready.pid != a.ready.pid  # (pids in their sandbox)
                assert procs.pids_of_uid(pool_a.uid)
                a.kill()  # (its control socket closes: it kills its students' sandboxes and ends)
                deadline = time.monotonic() + 10
                while procs.pids_of_uid(pool_a.uid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert not procs.pids_of_uid(pool_a.uid)
                assert sb.run(call("fds", torch.zeros(1))).outputs
        assert first.alive() and b.alive()
    finally:
        first.kill()


def _first_zygote_pid() -> int | None:
    """The batch's first zygote, seen from here: a zygote whose parent is bubblewrap (the
    workers' zygotes are its forks)."""
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                parent = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if b"runtime.zygote import zygote" in cmd and parent.split(b"\0")[0].endswith(b"bwrap"):
            return pid
    return None


SLOW_FIRST_CALL = """import time
_softmax, _calls = softmax, []

def softmax(x, dim=-1):
    if not _calls:
        _calls.append(time.sleep(3))
    return _softmax(x, dim)
"""


def test_a_first_zygote_that_dies_under_students_has_them_graded_again(tmp_path):
    """`batch`: the first zygote killed while students are graded (it takes every worker's
    zygote and their students' sandboxes with it). Each worker whose student lost their
    sandbox ends, and the batch grades them again (in sandboxes of their own): the scores are
    those of a batch nothing happened to, and nothing is an error."""
    import json
    import signal
    import subprocess
    import sys
    import threading

    from grading_helpers import REPO

    (tmp_path / "class").mkdir()
    folder = _class(tmp_path / "class")
    slow = folder / "good" / "01_intuition.ipynb"  # (its first call sleeps: the kill comes mid-call)
    book = json.loads(slow.read_text())
    book["cells"].append({"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                          "source": SLOW_FIRST_CALL})
    slow.write_text(json.dumps(book))
    killed = []

    def kill_when_a_student_runs() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            if _a_student_runs():
                pid = _first_zygote_pid()
                if pid:
                    time.sleep(1.5)  # (the cells have run; the first call sleeps)
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.05)
    threading.Thread(target=kill_when_a_student_runs, daemon=True).start()
    r = subprocess.run([sys.executable, "-m", "autograder", "batch", str(folder), "--jobs", "2", "--csv",
                        str(tmp_path / "grades.csv"), "--no-progress", "--device", "cpu", "--seed", "1234567"],
                       check=False, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert killed, "the first zygote was never seen"
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(tmp_path / "grades.csv", newline="") as f:
        possible, *students = list(csv.DictReader(f))
    rows = {row["Student"]: row for row in students}
    assert set(rows) == {"good", "stub"} and all(row["Status"] == "ok" for row in students), rows
    for chapter in ("01_intuition", "05_masks"):
        assert rows["good"][chapter] == possible[chapter] and float(rows["stub"][chapter]) == 0


def _a_student_runs() -> bool:
    """Whether a process of a student's uid (the batch's range) is running."""
    first, last = uid_range()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                uid = int(procs.status_field(f.read(), b"Uid").split()[0])
        except (OSError, ValueError, IndexError, AttributeError):
            continue
        if first <= uid <= last:
            return True
    return False

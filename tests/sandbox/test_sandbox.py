"""Hostile submissions against the sandbox: isolation, limits, crashes and broken notebooks.

Each test runs a StudentSession (a real child process) in the sandbox modes available here:
"bubblewrap" (skipped with the probe's reason where bwrap or namespaces are unavailable) and
"none" (the fallback). Timeouts are short so the whole file stays fast.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from autograder.shared.calls import Call
from autograder.source.notebook import notebook_cells, to_python
from autograder.sandbox.bwrap import bwrap_command
from autograder.sandbox.policy import sandbox_policy
from autograder.sandbox.visibility import PACKAGE_DIR, REPO_DIR
from autograder.sandbox.limits import Limits
from autograder.sandbox.modes import probe_bubblewrap
from autograder.runtime.prepare import MEMORY_CASE_UNCONFINED
from autograder.session.student_session import StudentSession
from session_helpers import lone_session
from test_notebook import _nb
from timing import child_start

MODES = [pytest.param("bubblewrap", marks=pytest.mark.needs_bwrap), "none"]
ROOT = os.geteuid() == 0

FAST = dict(cell_timeout=1.5, call_timeout=1.5, grace=1.0, notebook_timeout=30.0)


def session(cells, mode, **limits):
    """A session in `mode` with FAST limits (a context manager: see `lone_session`)."""
    return lone_session(cells, Limits(**{**FAST, **limits}), sandbox=mode)


def call(target, *args, **kw) -> Call:
    return Call(chapter="test", exercise=target, case="hostile", target=target, args=list(args), **kw)


def value(outcome):
    assert outcome.error is None, outcome.error
    return outcome.outputs[0]


def _round_trip(s: StudentSession) -> float:
    """Seconds a trivial call takes in the open session `s` (HOSTILE's `fine`), now."""
    t0 = time.monotonic()
    assert value(s.run(call("fine", torch.zeros(1)))).tolist() == [1.0]
    return time.monotonic() - t0


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


# ------------------------------------------------------------------ isolation of results

LIAR = '''
import torch
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
torch.testing.assert_close = lambda *a, **k: None

class Liar(torch.Tensor):
    """Every operation on it 'returns' the expected answer (zeros, say)."""
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        return torch.zeros(3) if isinstance(out, torch.Tensor) else out

def f(x):
    print("All tests passed! 100/100")
    return (x + 41).as_subclass(Liar)
'''


@pytest.mark.parametrize("mode", MODES)
def test_patched_torch_and_subclasses_do_not_reach_the_grader(mode):
    with session([LIAR], mode) as s:
        assert s.start().cells[0].status == "ok"
        out = s.run(call("f", torch.ones(3)))
        t = value(out)
        assert type(t) is torch.Tensor            # a fresh, plain tensor, made from bytes
        assert t.tolist() == [42.0, 42.0, 42.0]  # the real data, not what the subclass claims
        assert out.returned == "Tensor"
        assert "100/100" in s.last_output        # printing a fake result changes nothing
    assert torch.allclose(torch.zeros(1), torch.zeros(1))
    assert not torch.equal(torch.zeros(1), torch.ones(1))  # the grader's torch is untouched


@pytest.mark.parametrize("mode", MODES)
def test_forged_result_frames_are_a_crash_not_a_score(mode):
    cells = ['''
import os, sys, torch
def forge(x):
    os.write(int(sys.argv[2]), b"AGW1" + (10).to_bytes(8, "big") + b'{"a": 1}xx' * 3)
    return x

def f(x):
    return x * 2
''']
    with session(cells, mode) as s:
        s.start()
        out = s.run(call("forge", torch.ones(2)))
        assert out.error["type"] == "Crash" and "malformed" in out.error["message"]
        assert value(s.run(call("f", torch.ones(2)))).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("mode", MODES)
def test_well_framed_but_forged_messages_are_a_crash_not_a_score(mode):
    """Whole frames of the chapter channel that are not what the grader waits for: a reply
    with another id, a field of the wrong type, a kind the grader sends itself."""
    forgeries = {
        "other_id": {"kind": "CallDone", "id": 10 ** 6, "outcome": {}},
        "bad_field": {"kind": "CallDone", "id": "1", "outcome": {}},
        "request": {"kind": "RunCall", "id": 1, "call": {}, "timeout": 1.0},
    }
    cells = ["import os, sys, torch\nfrom autograder.shared import wire\n"
             + "".join(f"def {name}(x):\n    os.write(int(sys.argv[2]), wire.encode({message!r}))\n"
                       "    return x\n" for name, message in forgeries.items())
             + "def f(x):\n    return x * 2"]
    with session(cells, mode) as s:
        s.start()
        for name in forgeries:
            out = s.run(call(name, torch.ones(2)))
            assert out.error["type"] == "Crash", (name, out.error)
            assert value(s.run(call("f", torch.ones(2)))).tolist() == [2.0, 2.0], name


# ------------------------------------------------------------------ the sandbox (bubblewrap)

@pytest.mark.needs_bwrap
def test_no_network_not_even_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []
    done = threading.Event()

    def accept():
        # until the test is over (not a fixed 15 s: a child that starts late on a loaded machine
        # connects late), or the server is closed
        while not done.is_set() and not accepted:
            try:
                accepted.append(server.accept())
            except socket.timeout:
                pass
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    cells = [f'''
import socket, torch
def probe():
    results = []
    for family, addr in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET6, ("::1", {port}))):
        try:
            s = socket.socket(family)
            s.settimeout(2)
            results.append(s.connect_ex(addr))
        except OSError as e:
            results.append(-1)
    names = [n for _, n in socket.if_nameindex()]
    return torch.tensor(results + [len(names), int(names == ["lo"])])
''']
    try:
        with session(cells, "bubblewrap") as s:
            s.start()
            r = value(s.run(call("probe"))).tolist()
        assert r[0] != 0 and r[1] != 0, r      # both connections refused: another network
        assert r[3] == 1, r                    # the only interface is the sandbox's own loopback
        thread.join(1)
        done.set()
        thread.join(5)
        assert not accepted
    finally:
        done.set()
        server.close()


@pytest.mark.needs_bwrap
def test_grader_files_solutions_and_results_are_invisible(tmp_path, monkeypatch):
    results = tmp_path / "results.json"
    results.write_text("{}")
    solutions = os.environ.get("AUTOGRADER_SOLUTIONS") or str(REPO_DIR / "solutions")
    targets = [str(REPO_DIR / "solutions"), solutions, str(PACKAGE_DIR / "references" / "solutions.py"),
               str(PACKAGE_DIR / "sandbox" / "policy.py"), str(REPO_DIR), "/work", "/root/.bashrc", "/home",
               str(results), "/etc/shadow", "/proc/1/environ"]
    cells = [f'''
import os, torch
TARGETS = {targets!r}
def snoop():
    seen = []
    for t in TARGETS:
        try:
            if os.path.isdir(t):
                seen.append(1 if os.listdir(t) else 0)   # an empty dir hides nothing
            else:
                with open(t, "rb") as f:
                    f.read(1)
                seen.append(1)
        except OSError:
            seen.append(0)
    return torch.tensor(seen)
def whoami():
    return torch.tensor([os.getuid(), os.getgid()])
def root_entries():
    return torch.tensor([len(os.listdir("/root"))] if os.path.isdir("/root") else [0])
''']
    with lone_session(cells, Limits(**FAST), sandbox="bubblewrap", hide=[tmp_path]) as s:
        s.start()
        seen = value(s.run(call("snoop"))).tolist()
        assert dict(zip(targets, seen)) == dict.fromkeys(targets, 0)
        uid = value(s.run(call("whoami"))).tolist()
        if ROOT:
            from autograder.sandbox.uids import uid_range
            first, last = uid_range()
            assert first <= uid[0] == uid[1] <= last  # a uid of this student's own, no account
        # /root shows at most the way to the Python installation (here /root/.pyenv/...)
        import sys
        python_under_root = {Path(d).parts[2] for d in (sys.prefix, sys.base_prefix)
                             if d.startswith("/root/")}
        assert value(s.run(call("root_entries"))).tolist() == [len(python_under_root)]


@pytest.mark.needs_bwrap
def test_hidden_path_inside_a_visible_directory_is_masked():
    hidden = "/usr/share/doc"  # visible (under /usr) unless masked
    assert os.listdir(hidden)
    args = bwrap_command(sandbox_policy("bubblewrap", Limits(), [hidden]), ["python"])
    i = args.index(hidden)
    assert args[i - 1] == "--tmpfs"
    cells = ["import os\nN = len(os.listdir('/usr/share/doc'))\nM = len(os.listdir('/usr/bin'))\n"
             "import torch\ndef n():\n    return torch.tensor([N, M])\n"]
    with lone_session(cells, Limits(**FAST), sandbox="bubblewrap", hide=[hidden]) as s:
        s.start()
        n, m = value(s.run(call("n"))).tolist()
    assert n == 0 and m > 0


@pytest.mark.needs_bwrap
def test_writes_outside_tmp_fail_and_leave_no_trace():
    marker = f"pwned-{uuid.uuid4().hex}"
    places = [str(REPO_DIR / marker), str(REPO_DIR / "solutions" / marker), f"/work/{marker}",
              f"/root/{marker}", f"/usr/{marker}", f"/etc/{marker}", f"/{marker}",
              str(PACKAGE_DIR / marker)]
    cells = [f'''
import os, torch
PLACES = {places!r}
def vandal():
    ok = []
    for p in PLACES + ["/tmp/{marker}"]:
        try:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write("x")
            ok.append(1)
        except OSError:
            ok.append(0)
    return torch.tensor(ok)
def append_to_grader():
    with open({str(PACKAGE_DIR / "shared" / "calls.py")!r}, "a") as f:
        f.write("# pwned")
''']
    before = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=REPO_DIR, capture_output=True, text=True).stdout
    calls_py = (PACKAGE_DIR / "shared" / "calls.py").read_bytes()
    with session(cells, "bubblewrap") as s:
        s.start()
        wrote = value(s.run(call("vandal"))).tolist()
        # Only the sandbox's own /tmp is writable. A checkout that lives under /tmp (a CI clone)
        # does not exist in the sandbox, whose /tmp is a private tmpfs: a write "there" lands in
        # that tmpfs, and the checks below prove it leaves no trace on the host.
        assert wrote == [1 if p.startswith("/tmp/") else 0 for p in places] + [1]
        appended = s.run(call("append_to_grader")).error
        if not str(PACKAGE_DIR).startswith("/tmp/"):  # else it lands in the private /tmp (see above)
            assert appended["type"] in ("FileNotFoundError", "OSError", "PermissionError")
    for p in places + [f"/tmp/{marker}"]:
        assert not os.path.exists(p), p
    assert (PACKAGE_DIR / "shared" / "calls.py").read_bytes() == calls_py
    after = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                           cwd=REPO_DIR, capture_output=True, text=True).stdout
    assert marker not in after
    assert set(after.splitlines()) - set(before.splitlines()) <= {
        line for line in after.splitlines() if "pwned" not in line}


@pytest.mark.needs_bwrap
def test_fork_bomb_is_contained_by_the_process_limit():
    cells = ['''
import os, torch
def bomb():
    children = 0
    while True:
        if os.fork() == 0:
            children = 0
        else:
            children += 1
def fine():
    return torch.ones(1)
''']
    t0 = time.monotonic()
    with session(cells, "bubblewrap", nproc=64, call_timeout=5) as s:
        s.start()
        started = time.monotonic() - t0
        out = s.run(call("bomb"))
        assert out.error is not None
        assert out.error["type"] in ("BlockingIOError", "OSError", "Timeout", "Crash"), out.error
        assert value(s.run(call("fine"))).tolist() == [1.0]
    # 30 s on an idle machine, plus this session's start and a restart after the bomb at the
    # speed the machine has now (under load a child's start alone can take 10 s)
    assert time.monotonic() - t0 < 30 + 2 * started


# ------------------------------------------------------------------ processes outlive nothing

# A cell that leaves a daemon behind (double fork, new session), findable by `marker`.
DAEMON_CELL = '''
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        # /bin/sh, not sys.executable: in the fallback as root the child is `nobody`, who may
        # not be able to run a Python installed under /root (pyenv)
        os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 600; :", "{marker}"])
    os._exit(0)
os.wait()
'''


@pytest.mark.parametrize("mode", MODES)
def test_daemon_is_gone_after_close(mode):
    marker = f"daemon-{uuid.uuid4().hex}"
    cells = [DAEMON_CELL.format(marker=marker)]
    with session(cells, mode) as s:
        try:
            assert s.start().cells[0].status == "ok"
            deadline = time.monotonic() + 60  # waits end as soon as the daemon is there
            while not processes_with(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert processes_with(marker), "the daemon should run while the session is open"
        finally:
            s.close()
        # (the student's sandboxes are still open: the session's own close ends the daemon)
        deadline = time.monotonic() + 30  # (the daemon would live 600 s)
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker) == []


# ------------------------------------------------------------------ limits and crashes

HOSTILE = '''
import os, sys, signal, ctypes, torch
def fine(x):
    return x + 1
def exit3(x):
    os._exit(3)
def segfault(x):
    ctypes.string_at(0)
def spin(x):
    while True:
        pass
def stubborn(x):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
def hog(x):
    return torch.empty(20 * 2**30, dtype=torch.uint8).fill_(1)
def hog_slowly(x):
    chunks = []
    while True:
        chunks.append(bytearray(256 * 2**20))
def chatter(x):
    for _ in range(200_000):
        print("spam" * 50)
    return x
def interrupt(x):
    raise KeyboardInterrupt
'''


@pytest.mark.parametrize("mode", MODES)
def test_os_exit_and_segfault_cost_one_call(mode):
    with session([HOSTILE], mode) as s:
        s.start()
        out = s.run(call("exit3", torch.zeros(1)))
        assert out.error["type"] == "Crash" and "status 3" in out.error["message"], out.error
        assert value(s.run(call("fine", torch.zeros(1)))).tolist() == [1.0]
        out = s.run(call("segfault", torch.zeros(1)))
        assert out.error["type"] == "Crash" and "SIGSEGV" in out.error["message"], out.error
        assert value(s.run(call("fine", torch.zeros(1)))).tolist() == [1.0]
        out = s.run(call("interrupt", torch.zeros(1)))
        assert out.error["type"] == "KeyboardInterrupt"
        assert s.children == 3


@pytest.mark.parametrize("mode", MODES)
def test_infinite_loop_in_a_function_times_out_and_the_next_call_works(mode):
    with session([HOSTILE], mode) as s:
        s.start()
        # a call's round trip now (the scheduling delay of a loaded machine), the worst of three
        trip = max(_round_trip(s) for _ in range(3))
        t0 = time.monotonic()
        out = s.run(call("spin", torch.zeros(1)), timeout=1.0)
        assert out.error["type"] == "Timeout" and "1 s" in out.error["message"]
        # the child interrupted itself: the answer comes before the parent's grace runs out
        assert time.monotonic() - t0 < 1.0 + FAST["grace"] + 5 * trip
        assert value(s.run(call("fine", torch.zeros(1)))).tolist() == [1.0]
        assert s.children == 1  # interrupted inside the child: no restart needed


@pytest.mark.parametrize("mode", MODES)
def test_ignoring_the_alarm_is_still_bounded_by_the_parent(mode):
    with session([HOSTILE], mode) as s:
        t0 = time.monotonic()
        s.start()
        started = time.monotonic() - t0  # a child's start now: the parent may start the next one
        t0 = time.monotonic()
        out = s.run(call("stubborn", torch.zeros(1)), timeout=1.0)
        elapsed = time.monotonic() - t0
        assert out.error["type"] == "Timeout" and "stopped" in out.error["message"]
        assert 1.0 + FAST["grace"] - 0.1 <= elapsed < 1.0 + FAST["grace"] + 2 + started
        assert value(s.run(call("fine", torch.zeros(1)))).tolist() == [1.0]
        assert s.children == 2


@pytest.mark.parametrize("mode", MODES)
def test_memory_hog_is_stopped_and_reported(mode):
    with session([HOSTILE], mode, memory=2 << 30, call_timeout=10) as s:
        s.start()
        for name in ("hog", "hog_slowly"):
            out = s.run(call(name, torch.zeros(1)))
            assert out.error is not None
            assert out.error["type"] in ("RuntimeError", "MemoryError", "Crash"), out.error
            if out.error["type"] == "Crash":
                assert "memory" in out.error["message"]
            assert value(s.run(call("fine", torch.zeros(1)))).tolist() == [1.0]


def test_the_memory_case_child_caps_every_mapping_and_sees_no_gpu(monkeypatch):
    """The memory case's child (autograder.session.memory_case): RLIMIT_DATA and RLIMIT_AS (which counts
    shared and file-backed mappings too) at what it holds plus the headroom, its mappings sealed after, the seccomp filter
    installed, and CUDA hidden (its case runs on the CPU, and a driver started there would count
    against the headroom). A child without a memory case gets none of these."""
    import resource

    from autograder.runtime import confine
    from autograder.runtime import prepare as worker

    events = []
    sizes = {"VmData:": 1 << 30, "VmSize:": 3 << 30}
    monkeypatch.setattr(worker, "status_bytes", lambda key: sizes[key])
    held = {}
    monkeypatch.setattr(resource, "setrlimit", lambda res, value: events.append(("limit", res, value))
                        or held.__setitem__(res, value))
    monkeypatch.setattr(resource, "getrlimit", lambda res: held.get(res, (resource.RLIM_INFINITY,) * 2))
    monkeypatch.setattr(confine, "no_hidden_memory", lambda: events.append("filter") or True)
    # (not this test process's mappings: sealed, its threads' arenas could not grow, and pytest
    # aborted in a later test, CI at stop 45)
    monkeypatch.setattr(confine, "seal_mappings", lambda: events.append("seal") or True)
    monkeypatch.setattr(worker, "every_thread_filtered", lambda: True)  # (this test process has no filter)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    worker.set_limits({"rlimits": {"DATA": None, "AS": 8 << 30}, "data_headroom": 64 << 20})
    assert ("limit", resource.RLIMIT_DATA, ((1 << 30) + (64 << 20),) * 2) in events
    assert ("limit", resource.RLIMIT_AS, ((3 << 30) + (64 << 20),) * 2) in events
    assert "filter" in events and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert events.index("seal") > max(i for i, e in enumerate(events) if e[0] == "limit")  # (after the caps)
    events.clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    worker.set_limits({"rlimits": {"DATA": None}})
    assert "filter" not in events and "seal" not in events and os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def _memory_case_child(setup: str) -> subprocess.CompletedProcess:
    """A fresh Python that runs `setup`, confines itself as a memory case's child does, then
    stands for student code (it prints "student code ran")."""
    code = (setup + "import autograder.runtime.prepare as w\n"
            "w.set_limits({'rlimits': {}, 'data_headroom': 64 << 20})\n"
            "print('student code ran')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def test_a_memory_case_child_that_cannot_be_confined_never_runs_student_code():
    """Where the filter cannot be installed, the child exits (MEMORY_CASE_UNCONFINED) before
    any student code: a memory case is never credited where memory went unmeasured."""
    r = _memory_case_child("import autograder.runtime.confine as c\n"
                           "c.no_hidden_memory = lambda: False\n")
    assert r.returncode == MEMORY_CASE_UNCONFINED and "student code ran" not in r.stdout
    assert "cannot be measured" in r.stderr


def test_a_memory_case_child_with_a_thread_older_than_its_filter_never_runs_student_code():
    """A thread started before the filter (as OpenBLAS starts its pool when numpy is imported)
    does not have it, and could map the shared memory the filter refuses: the child exits
    before any student code (reviewer's finding, stop 40: the fallback mode's child had one)."""
    r = _memory_case_child("import threading\n"
                           "stop = threading.Event(); threading.Thread(target=stop.wait, daemon=True).start()\n")
    assert r.returncode == MEMORY_CASE_UNCONFINED and "student code ran" not in r.stdout, r.stdout + r.stderr
    assert "no seccomp filter on every thread" in r.stderr


PROBE_THREADS = """import os
def _filters(tid):
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("Seccomp_filters:"))
print(sorted({_filters(t) for t in os.listdir("/proc/self/task")}), len(os.listdir("/proc/self/task")))
"""


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_the_memory_case_child_has_one_thread_and_it_runs(mode, threads):
    """Where student code runs in the memory case's child, in every mode, it is the child's one
    thread (no library pool started before the filters: OpenBLAS's was, in the fallback mode),
    whatever `Limits.threads` gives the other children (a second thread, started before the
    filter, made every memory case fail: reviewer's finding, stop 40)."""
    with lone_session([PROBE_THREADS], Limits(**FAST, threads=threads), sandbox=mode, memory_capped=True) as s:
        report = s.start()
        assert report.error is None and report.cells[0].status == "ok", (report.error, report.cells)
        filters, tasks = report.cells[0].output.strip().rsplit(" ", 1)  # ("['N'] T")
        assert filters.count("'") == 2 and int(tasks) == 1, report.cells[0].output


def test_the_memory_case_filter_refuses_hidden_memory_and_sockets():
    """confine.no_hidden_memory in a child process: private mappings and file mappings still
    work (torch needs them); shared anonymous ones, memfd_create and socket do not."""
    code = ("import mmap, os, socket, tempfile, autograder.runtime.confine as c\n"
            "assert c.no_hidden_memory()\n"
            "mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE)\n"
            "f = tempfile.TemporaryFile(); f.truncate(4096); mmap.mmap(f.fileno(), 4096)\n"
            "for name, act in [('shared', lambda: mmap.mmap(-1, 4096)), ('memfd', lambda: os.memfd_create('x')),\n"
            "                  ('socket', lambda: socket.socket(socket.AF_UNIX))]:\n"
            "    try:\n        act(); print(name, 'allowed')\n"
            "    except PermissionError:\n        print(name, 'refused')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["shared refused", "memfd refused", "socket refused"], r.stdout


@pytest.mark.parametrize("mode", MODES)
def test_giant_output_is_capped(mode):
    cells = ["for _ in range(100_000):\n    print('x' * 100)\n", "y = 1", HOSTILE]
    baseline = child_start(mode)  # a child's start and close, at the machine's speed now
    with session(cells, mode, output_cap=10_000) as s:
        t0 = time.monotonic()
        report = s.start()
        first = report.cells[0]
        assert first.status == "ok"
        assert len(first.output) < 10_200 and "more bytes of output not shown" in first.output
        assert report.cells[1].status == "ok"
        out = s.run(call("chatter", torch.zeros(1)), timeout=8)
        assert value(out).tolist() == [0.0]
        assert len(s.last_output) < 10_200
        assert time.monotonic() - t0 < 20 + 2 * baseline  # 20 s idle; a start, and output as slow


@pytest.mark.parametrize("mode", MODES)
def test_top_level_hazards_cost_only_their_cell(mode):
    cells = [
        "import torch\ndef before(x):\n    return x + 1",
        "while True:\n    pass",                                     # 2: interrupted
        "import sys\nsys.exit(1)",                                   # 3: SystemExit
        "raise SystemExit",                                          # 4
        "exit()",                                                    # 5: the site builtin
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",  # 6
        "import ctypes\nctypes.string_at(0)",                        # 7: segfault
        "import os\nos._exit(0)",                                    # 8
        "def broken(:\n    pass",                                    # 9: syntax error
        "x = torch.zeros(1).cuda()",                                 # 10: no GPU here
        "def after(x):\n    return x + 2",                           # 11
    ]
    baseline = child_start(mode)  # a child's start and close, at the machine's speed now
    with session(cells, mode) as s:
        report = s.start()
        status = [c.status for c in report.cells]
        errors = [(c.error or {}).get("type") for c in report.cells]
        assert status[0] == "ok" and status[-1] == "ok"
        assert status[1] == "timeout" and "interrupted" in report.cells[1].error["message"]
        assert errors[2:5] == ["SystemExit"] * 3
        assert status[5] == "timeout" and "could not be interrupted" in report.cells[5].error["message"]
        assert status[6] == "crash" and "SIGSEGV" in report.cells[6].error["message"]
        assert status[7] == "crash" and "status 0" in report.cells[7].error["message"]
        assert errors[8] == "SyntaxError"
        if not torch.cuda.is_available():
            assert status[9] == "error" and ("CUDA" in report.cells[9].error["message"]
                                             or "NVIDIA" in report.cells[9].error["message"])
        assert value(s.run(call("before", torch.zeros(1)))).tolist() == [1.0]
        assert value(s.run(call("after", torch.zeros(1)))).tolist() == [2.0]
        # 25 s on an idle machine, plus each child this start needed (the hazards kill it) at
        # the speed a start has now
        assert report.seconds < 25 + s.children * baseline, (report.seconds, s.children, baseline)


def test_notebook_time_budget_bounds_start():
    # unbounded, the cells would take 12 x 1.2 = 14.4 s; the 2 s budget (plus grace and the start
    # of the child, measured now: slow on a loaded machine) must cut that short. Sleeping takes
    # as long under any load: at most two cells of 1.2 s fit in the budget.
    cells = ["import time\ntime.sleep(1.2)"] * 12 + ["z = 1"]
    baseline = child_start("none")
    with session(cells, "none", notebook_timeout=2.0, cell_timeout=1.5) as s:
        t0 = time.monotonic()
        report = s.start()
        assert time.monotonic() - t0 < 2.0 + FAST["grace"] + 2 + baseline
        status = [c.status for c in report.cells]
        assert status[0] == "ok" and status[-1] == "not run"
        assert status.count("ok") <= 2, status


# ------------------------------------------------------------------ determinism, threads

@pytest.mark.parametrize("mode", MODES)
def test_unseeded_randomness_and_hashes_are_reproducible(mode):
    cells = ["import random, torch\nR = torch.rand(3)\nH = hash('attention') % 1000\n"
             "P = random.random()\ndef f():\n    return torch.cat([R, torch.tensor([H, P])])"]
    values = []
    for _ in range(2):
        with session(cells, mode) as s:
            s.start()
            values.append(value(s.run(call("f"))))
    assert torch.equal(values[0], values[1])


def test_sessions_in_threads():
    cells = ["import torch\ndef f(x):\n    return x * 3"]
    results = {}

    def grade(i):
        with session(cells, "auto") as s:
            results[i] = value(s.run(call("f", torch.full((2,), float(i))))).tolist()

    threads = [threading.Thread(target=grade, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: [3.0 * i, 3.0 * i] for i in range(3)}


def test_missing_names_wrong_types_and_nan_are_plain_outcomes():
    cells = ["import torch\ndef words(x):\n    return 'not a tensor'\n"
             "def nan(x):\n    return x * float('nan')\n"]
    with session(cells, "auto") as s:
        assert s.run(call("absent", torch.zeros(1))).error["type"] == "Missing"
        assert s.run(call("words", torch.zeros(1))).returned == "str"
        assert torch.isnan(value(s.run(call("nan", torch.zeros(2))))).all()


def test_closed_session_and_run_without_start():
    s = StudentSession(["import torch\ndef f(x):\n    return x"], Limits(**FAST), sandbox="none")
    assert value(s.run(call("f", torch.ones(1)))).tolist() == [1.0]  # start() is implicit
    s.close()
    assert s.run(call("f", torch.ones(1))).error["type"] == "Crash"
    s.close()  # idempotent


# ------------------------------------------------------------------ broken notebooks

def test_ipython_syntax_keeps_definitions():
    """IPython syntax, neutralised by the notebook reader (tests/unit/test_notebook.py), runs."""
    py = to_python("%matplotlib inline\n!pip install nothing\nimport torch\n"
                   "def f(x):\n    %time y = x + 1\n    return y\ntorch.nn?\n")
    with session([py, to_python("%%timeit -n 3\nz = f(torch.ones(1))\n"),
                  "def h():\n    return z"], "auto") as s:
        report = s.start()
        assert [c.status for c in report.cells] == ["ok"] * 3, report
        assert value(s.run(call("h"))).tolist() == [2.0]


def test_a_broken_notebook_file_end_to_end(tmp_path):
    path = tmp_path / "02_scaled_dot_product_attention.ipynb"
    path.write_text(_nb([("code", "import torch\n"), ("code", "def f(x):\n    return x +"),
                         ("code", "def g(x):\n    return x - 1")]))
    with session(notebook_cells(path), "auto") as s:
        report = s.start()
        assert [c.status for c in report.cells] == ["ok", "error", "ok"]
        assert report.cells[1].error["type"] == "SyntaxError"
        assert s.run(call("f", torch.ones(1))).error["type"] == "Missing"
        assert value(s.run(call("g", torch.ones(1)))).tolist() == [0.0]


def test_mode_is_reported():
    with session(["x = 1"], "none") as s:
        report = s.start()
        assert report.sandbox == "fallback" and "AUTOGRADER_SANDBOX=none" in report.sandbox_note
    if probe_bubblewrap()[0]:
        with session(["x = 1"], "auto") as s:
            report = s.start()
            assert report.sandbox == "bubblewrap" and report.sandbox_note == ""


@pytest.mark.needs_bwrap
def test_everything_dies_with_a_killed_grader(tmp_path):
    """SIGKILL to the grader itself (no close(), no clean-up): bwrap's --die-with-parent and
    the PID namespace still take the worker and the student's daemon with it."""
    marker = f"orphan-{uuid.uuid4().hex}"
    script = tmp_path / "grader.py"
    script.write_text(f'''
import sys
sys.path.insert(0, {str(REPO_DIR)!r})
from autograder.session.student_session import StudentSession, Limits
from autograder.sandbox.modes import resolve_sandbox
from autograder.sandbox.pool import student_pool
cells = [{DAEMON_CELL.format(marker=marker)!r}, "print('ready', flush=True)", "while True:\\n    pass"]
limits, sandbox = Limits(cell_timeout=60, notebook_timeout=120), resolve_sandbox("bubblewrap")
s = StudentSession(cells, limits, sandbox=sandbox, sandboxes=student_pool(sandbox, limits))
s.start()
''')
    grader = subprocess.Popen([os.sys.executable, str(script)], cwd=tmp_path)
    try:
        # the grader script imports torch, then starts its child: a minute under load
        deadline = time.monotonic() + 120  # waits end as soon as the daemon is there
        while len(processes_with(marker)) < 1 and time.monotonic() < deadline and grader.poll() is None:
            time.sleep(0.05)
        assert processes_with(marker), "the daemon should be running"
    finally:
        grader.kill()
        grader.wait()
    deadline = time.monotonic() + 30  # (the daemon would live 600 s)
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def _results_first(take_in):
    """`Channel._take_in` as it goes when the child's result frames are read before what it
    printed just before them (a race a loaded machine wins now and then): output left unread."""
    def results_first(self, deadline, writing=None):
        self.drain_output = lambda limit: None  # (only inside this wait: the output pipe is not read)
        try:
            read = take_in(self, deadline, writing)
        finally:
            del self.drain_output
        if read is False:
            time.sleep(0.01)  # (the output pipe stays readable: do not spin)
        return read
    return results_first


@pytest.mark.parametrize("mode", MODES)
def test_output_printed_just_before_the_end_is_kept(mode, monkeypatch):
    """CI once graded a notebook whose last cells' output was missing from its report: the
    pass ended on the child's last message before the output pipe was read."""
    from autograder.session.channel import Channel
    monkeypatch.setattr(Channel, "_take_in", _results_first(Channel._take_in))
    shout = "def shout(x):\n    print('called')\n    return x\n"
    cells = ["print('first cell')", "x = 1", shout, "print('last cell')"]
    with session(cells, mode) as s:
        report = s.start()
        assert [c.status for c in report.cells] == ["ok"] * 4
        assert report.cells[0].output.strip() == "first cell"
        assert report.cells[3].output.strip() == "last cell"
        assert "last cell" in report.output
        assert value(s.run(call("shout", torch.zeros(1)))).tolist() == [0.0]
        assert s.last_output.strip() == "called"


UNSENDABLE = '''
import torch
class Name(int):  # a "type name" whose encoding runs the student's code, which raises
    def __abs__(self):
        raise RuntimeError("no")
class Meta(type):
    @property
    def __name__(cls):
        return Name(7)
class Weird(metaclass=Meta):
    pass
def weird(x):
    return Weird()
def fine(x):
    return x + 1
'''


@pytest.mark.parametrize("mode", MODES)
def test_a_result_whose_encoding_raises_anything_is_that_calls_failure_not_a_dead_child(mode):
    """The child sends what a call returned described by grader code that reads the student's
    objects (a returned object's type name): encoding it may run their code and raise anything.
    That call fails, saying so; the child lives on for the next one."""
    with session([UNSENDABLE], mode) as s:
        s.start()
        o = s.run(call("weird", torch.zeros(1)))
        assert o.error and o.error["type"] == "TypeError", o.error
        assert "cannot be sent to the grader: RuntimeError" in o.error["message"], o.error
        assert value(s.run(call("fine", torch.zeros(1)))).tolist() == [1.0]

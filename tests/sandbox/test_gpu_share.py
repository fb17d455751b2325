"""No student can take the GPU from another (autograder.sandbox.gpu_share), with CUDA simulated.

The stand-in GPU: a folder where a process "allocates" by leaving a file named after its pid,
and a stand-in `nvidia-smi` on PATH that lists those processes as the driver does, for a while
after they die too (a driver gives a killed process's memory back late). A simulated chapter's
CUDA cases report "CUDA error: out of memory" while a process of another student holds the
device. The hog (issue 26: a notebook that allocates the GPU until allocation fails, graded
first with --jobs 1) leaves a process behind that holds it.

Before: the honest students graded after the hog lost their CUDA rows, and nothing in the CSV
said so. Now their scores equal those of a batch without the hog, and a GPU held by someone else
for the whole batch makes them `error` in the CSV, never a silent loss of points.
"""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autograder.batch import grade_class as batch
from autograder.batch import workers
from autograder.runtime import procs
from autograder.grading.grader import Grader
from autograder.grading.results import CaseResult, ChapterResult, TestResult
from autograder.sandbox import gpu_share
from autograder.sandbox.modes import SandboxChoice, SandboxMode

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux",
                                reason="needs root (students' processes under uids of their own)")

FAKE_SMI = '''#!{python}
import os, sys, time
reg = {reg!r}
for name in sorted(os.listdir(reg)):
    path = os.path.join(reg, name)
    alive = os.path.exists("/proc/%s" % name) and "Z" not in open("/proc/%s/stat" % name).read().split(")")[-1][:3]
    if not alive:
        dead = os.path.join(reg, "dead-" + name)
        if not os.path.exists(dead):
            open(dead, "w").write(str(time.time()))
        if time.time() - float(open(dead).read()) > {lag}:
            continue
    if name.isdigit():
        print("%s, 4000" % name)
'''
LAG = 1.5  # seconds the stand-in driver keeps a dead process's memory


@pytest.fixture
def gpu(tmp_path, monkeypatch, request):
    import shutil
    import tempfile

    reg = Path(tempfile.mkdtemp(prefix="stand-in-gpu-"))  # (pytest's tmp_path: 0700 parents)
    os.chmod(reg, 0o777)
    request.addfinalizer(lambda: shutil.rmtree(reg, ignore_errors=True))
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    smi = bin_ / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, reg=str(reg), lag=LAG))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    return reg


def holders(reg: Path) -> set[int]:
    out = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
    return {int(line.split(",")[0]) for line in out.splitlines() if line.strip()}


def hold(reg: Path, uid: int) -> int:
    """A process of `uid` that holds the stand-in GPU until killed (what the hog leaves)."""
    p = subprocess.Popen(["/bin/sh", "-c", f'echo > "{reg}/$$"; exec sleep 600'],
                         preexec_fn=lambda: (os.setgid(uid), os.setuid(uid)), start_new_session=True)
    for _ in range(200):
        if (reg / str(p.pid)).exists():
            return p.pid
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("the stand-in holder did not start")


UIDS = iter(range(62100, 62200))


def free_uid() -> int:
    for uid in UIDS:
        if not procs.pids_of_uid(uid):
            return uid
    raise RuntimeError("no free uid")


class FakePool:
    """A student's sandboxes, as workers.grade_student uses them: a uid of their own; closing
    kills every process of it (what SandboxPool.close does)."""

    def __init__(self, limits=None, hide=(), size=1, zygote=None):
        self.uid = free_uid()
        self.limits = limits

    def prestart(self, n=1):
        pass

    def close(self, release_gpu=False):
        procs.kill_uid(self.uid)
        if release_gpu:  # (while the uid is still the student's)
            gpu_share.release(self.uid)


def simulated_chapter(reg: Path, leftovers: list):
    """Grader.grade_planned with CUDA simulated: a CPU test that passes and a CUDA test that
    runs out of memory while a process of another uid holds the stand-in GPU; the hog's notebook
    leaves a process holding it."""
    def grade_planned(self, chapter_id, notebook, pool, deadline=None):
        text = Path(notebook).read_text()
        others = [pid for pid in holders(reg) if procs_uid(pid) != pool.uid]
        cuda_ok = not others
        message = "" if cuda_ok else "RuntimeError: CUDA error: out of memory"
        tests = [TestResult(chapter_id, "softmax", "cpu", 4.0, 4.0,
                            cases=[CaseResult("c", "cpu", "float64", True)]),
                 TestResult(chapter_id, "softmax", "cuda", 1.0 if cuda_ok else 0.0, 1.0,
                            cases=[CaseResult("c", "cuda", "float32", cuda_ok, message=message)])]
        if "HOG" in text:
            leftovers.append(hold(reg, pool.uid))
        return ChapterResult(chapter_id, str(notebook), tests, sandbox=SandboxMode.BUBBLEWRAP)
    return grade_planned


def procs_uid(pid: int):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except (OSError, StopIteration):
        return None


def make_class(root: Path, names: list[str]) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "01_intuition.ipynb").write_text("HOG" if name.startswith("a-hog") else "honest")
    return root


def run_batch(tmp_path, monkeypatch, reg, names, leftovers, warmed=None) -> dict:
    monkeypatch.setattr(workers, "student_pool", lambda sandbox, limits=None, hide=(), size=1, zygote=None:
                        FakePool(limits, hide, size, zygote))
    monkeypatch.setattr(workers, "resolve_sandbox", lambda requested=None, hide=(): SandboxChoice(SandboxMode.BUBBLEWRAP))
    monkeypatch.setattr(workers, "_zygote", lambda grader: None)
    monkeypatch.setattr(Grader, "grade_planned", simulated_chapter(reg, leftovers))
    monkeypatch.setattr(Grader, "plan", lambda self, folder, chapters=None: (
        __import__("autograder.grading.results", fromlist=["SubmissionResult"]).SubmissionResult(str(folder)),
        [("01_intuition", Path(folder) / "01_intuition.ipynb")]))
    from autograder.references.cache import REFERENCES

    monkeypatch.setattr(REFERENCES, "warm", lambda chapters, devices, seed, quick, stop=None:
                        (warmed if warmed is not None else []).append(list(devices)))
    grader = Grader(device="cpu")
    grader.devices = ["cpu", "cuda"]
    root = make_class(tmp_path / "class", names)
    out = tmp_path / "grades.csv"
    # (in this process: the simulated grading is a monkeypatch, which batch's worker processes lack)
    results = batch.grade_class(root, grader, jobs=1, csv_path=out, chapters=["01_intuition"], progress=False,
                                in_process=True)
    statuses = [r["Status"] for r in csv.DictReader(out.open()) if r["Status"] in ("ok", "error")]
    return {name: (r.score, r.error, statuses) for name, r in results.items()}


def test_the_hog_leaves_the_honest_students_scores_as_without_it(tmp_path, monkeypatch, gpu):
    leftovers: list = []
    try:
        without = run_batch(tmp_path / "a", monkeypatch, gpu, ["b-alice", "c-bob", "d-carol"], leftovers)
        assert all(score == 5.0 and not error for score, error, _ in without.values())
        warmed: list = []
        with_hog = run_batch(tmp_path / "b", monkeypatch, gpu, ["a-hog", "b-alice", "c-bob", "d-carol"],
                             leftovers, warmed)
        assert leftovers, with_hog  # the hog did leave a process holding the GPU
        for name in ("b-alice", "c-bob", "d-carol"):
            assert with_hog[name][:2] == without[name][:2], (name, with_hog[name][:2])
        assert warmed and warmed[0] == ["cuda"]  # the grader's CUDA references before any student
        assert not (holders(gpu) & set(leftovers))  # gone, and its memory back
    finally:
        for pid in leftovers:
            procs.send(pid, signal.SIGKILL)


def test_a_gpu_held_by_someone_else_all_along_is_an_error_not_a_silent_loss(tmp_path, monkeypatch, gpu):
    neighbour = hold(gpu, free_uid())  # not a student of this batch: nothing the grader may kill
    leftovers: list = []
    try:
        got = run_batch(tmp_path, monkeypatch, gpu, ["b-alice", "c-bob"], leftovers)
        for name, (score, error, rows) in got.items():
            assert error and "GPU" in error, (name, score, error)
        statuses = next(iter(got.values()))[2]
        assert statuses == ["error", "error"], statuses
    finally:
        procs.send(neighbour, signal.SIGKILL)


def test_release_waits_for_the_driver_to_give_the_memory_back(gpu):
    from autograder.sandbox import gpu_share

    uid = free_uid()
    pid = hold(gpu, uid)
    assert pid in holders(gpu)
    t0 = time.monotonic()
    assert gpu_share.release(uid)
    assert pid not in holders(gpu) and not procs.pids_of_uid(uid)
    assert time.monotonic() - t0 >= LAG * 0.5  # it waited for the stand-in driver's lag


def test_each_child_bounds_its_cuda_memory_before_student_code(monkeypatch):
    """The fraction is queued for CUDA's first use (a chapter without CUDA does not start it);
    a child with the GPU hidden (the memory case's) sets nothing."""
    from autograder.runtime import prepare as worker

    queued, applied = [], []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_lazy_call", lambda fn, **kw: queued.append(fn))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device=None: applied.append(f))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    worker.cuda_fraction(0.225)
    assert len(queued) == 1 and not applied
    queued[0]()
    assert applied == [0.225]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    queued.clear()
    worker.cuda_fraction(0.225)
    assert not queued


def test_the_batch_gives_each_worker_a_share_of_the_gpu():
    from autograder.sandbox.gpu_share import fraction
    from autograder.sandbox.limits import Limits
    from autograder.sandbox.policy import sandbox_policy

    assert fraction(1) == 0.9 and fraction(4) == 0.225
    config = sandbox_policy("bubblewrap", Limits(gpu_share=0.225), []).child_config("t")
    assert config["cuda_fraction"] == 0.225


def test_the_gpu_hog_check_runs_without_a_gpu():
    """`tools/gpu_hog_check.py` (run by tools/gpu_check.sh on a GPU machine): its CPU dry run
    grades the same three batches, and the honest students' scores are compared."""
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(repo / "tools" / "gpu_hog_check.py"), "--device", "cpu"],
                       capture_output=True, text=True, timeout=600, cwd=repo)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert sum("b_honest 18.0 (ok)" in line for line in lines) == 3, r.stdout
    assert "a_hog" in r.stdout and lines[-1] == "gpu_hog_check: PASSED", r.stdout

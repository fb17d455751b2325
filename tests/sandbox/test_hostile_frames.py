"""A student whose graded function writes a hostile frame straight to the results pipe (its fd
is in the child's sys.argv, and the grader's source is public), graded in a class beside an
honest student: that case is a crash of its own, the honest student keeps full marks, nothing
is an internal grader error, and the grader's processes stay small."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.shared.calls import Call
from autograder.sandbox.limits import Limits
from session_helpers import lone_session

REPO = Path(__file__).resolve().parents[2]

# A 48 MiB payload whose header names it 200 times: before, one copy per entry (the grader
# went from 240 MiB to 2.2 GB with 40 entries and was OOM-killed in a 3 GiB container).
AMPLIFIER = '''import json, os, struct, sys

def attention_pool(query, keys, values):
    size = 48 << 20
    entry = {"__tensor__": ["uint8", [size], 0, size]}
    header = json.dumps({"kind": "CallDone", "id": 1, "outcome": {"outputs": [entry] * 200}}).encode()
    frame = memoryview(b"AGW1" + struct.pack(">Q", len(header)) + header + struct.pack(">Q", size) + bytes(size))
    results = int(sys.argv[2])  # the results pipe (see autograder/runtime/child.py)
    while frame:
        frame = frame[os.write(results, frame):]
    return values.mean(-2)
'''


# Frames a cell or a graded call writes to the results pipe, each a header (JSON text) and a
# payload. Before: the deep one raised RecursionError, the huge number OverflowError and the
# unhashable kind TypeError out of the session (from the cells: an internal grader error for the
# whole chapter; from a call: "the grader could not run this test"); the reused range was
# decoded into 50 tensors.
HOSTILE = {
    "deep": ("[" * 200_000 + "]" * 200_000, b""),
    "wide": ("[" + "0," * 300_000 + "0]", b""),
    "huge_number": ('{"kind": "CellDone", "cell": 2, "status": "ok", "error": null, "seconds": 1%s}'
                    % ("0" * 400), b""),
    "huge_seconds": ('{"kind": "CallDone", "id": 1, "outcome": {"seconds": 1%s}}' % ("0" * 400), b""),
    "unhashable_kind": ('{"kind": [], "id": 1}', b""),
    "reused_range": ('{"kind": "CallDone", "id": 1, "outcome": {"outputs": [%s]}}'
                     % ", ".join(['{"__tensor__": ["float64", [4], 0, 32]}'] * 50), bytes(32)),
    "not_utf8": ('"\udcff"', b""),
    # For the one-pass decoder (stop 39): a tensor entry beside other keys is a plain dict, so
    # the payload it names is left unread; an escaped key is still a tensor entry, so the
    # reused range is still refused; a frame that is one tensor is no message.
    "entry_beside_other_keys": (('{"kind": "CallDone", "id": 1, "outcome": {"outputs": '
                                 '[{"__tensor__": ["float64", [4], 0, 32], "x": 1}]}}'), bytes(32)),
    "escaped_reused_range": ('{"kind": "CallDone", "id": 1, "outcome": {"outputs": [%s]}}'
                             % ", ".join(['{"\\u005f_tensor__": ["float64", [4], 0, 32]}'] * 50), bytes(32)),
    "one_tensor": ('{"__tensor__": ["float64", [4], 0, 32]}', bytes(32)),
}
WRITER = '''import os, struct, sys
HOSTILE = %r

def send(name):
    header, payload = HOSTILE[name]
    header = header.encode("utf-8", "surrogateescape")
    os.write(int(sys.argv[2]), b"AGW1" + struct.pack(">Q", len(header)) + header + struct.pack(">Q", len(payload)) + payload)

def f(x):
    return x * 2
''' % HOSTILE


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.parametrize("mode", [pytest.param("bubblewrap", marks=pytest.mark.needs_bwrap), "none"])
def test_a_hostile_frame_is_a_crash_of_what_sent_it(name, mode):
    """Written while the cells run, it is a crash of that cell (the next cells still run);
    written by a graded call, a crash of that call (the next call still works). Never an
    exception out of the session."""
    limits = Limits(cell_timeout=5.0, call_timeout=5.0, grace=1.0, notebook_timeout=30.0)
    cells = [WRITER, f"send({name!r})", "y = 1"]
    with lone_session(cells, limits, sandbox=mode) as session:
        report = session.start()
        statuses = [c.status for c in report.cells]
        assert statuses == ["ok", "crash", "ok"], report.cells
        assert "sent the grader malformed data" in report.cells[1].message
    with lone_session([WRITER], limits, sandbox=mode) as session:
        session.start()
        call = lambda target, *args: session.run(Call(chapter="test", exercise=target, case="hostile",
                                                     target=target, args=list(args)))
        out = call("send", name)
        assert out.error["type"] == "Crash" and "malformed data" in out.error["message"], out.error
        assert call("f", torch.ones(2)).outputs[0].tolist() == [2.0, 2.0]


def _student(folder: Path, extra: list[str]) -> None:
    nb = nbformat.read(REPO / "solutions" / "01_intuition.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(src) for src in extra]
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "01_intuition.ipynb")


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, parent in parents.items() if parent == p]
    return out


def _grader_peak_mib(pid: int) -> dict[int, int]:
    """pid -> peak RSS (VmHWM, MiB) of the grader's own processes: the command, its forkserver
    and batch workers; not the sandboxes (bwrap and what runs in its PID namespaces)."""
    peaks = {}
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue
        if status.get("Name", "").strip() == "bwrap" or len(status.get("NSpid", "").split()) != 1:
            continue
        if "VmHWM" in status:
            peaks[p] = int(status["VmHWM"].split()[0]) >> 10
    return peaks


@pytest.mark.needs_bwrap
def test_an_amplified_frame_is_a_crash_of_its_case_in_a_batch(tmp_path):
    klass = tmp_path / "class"
    _student(klass / "honest", [])
    _student(klass / "mallory", [AMPLIFIER])
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "batch", str(klass), "--jobs", "2",
                             "--no-progress", "--device", "cpu", "--chapters", "01",
                             "--csv", str(tmp_path / "grades.csv"), "--out", str(tmp_path / "reports")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    peaks: dict[int, int] = {}
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        for p, mib in _grader_peak_mib(proc.pid).items():
            peaks[p] = max(peaks.get(p, 0), mib)
        time.sleep(0.1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len(peaks) >= 3, peaks  # the command, its forkserver, a worker at least were measured
    assert max(peaks.values()) < 1024, peaks

    with open(tmp_path / "grades.csv", newline="", encoding="utf-8") as f:
        rows = {r["ID"]: r for r in csv.DictReader(f) if r["ID"]}
    assert rows["honest"]["Total"] == "13.0" and rows["honest"]["Status"] == "ok", rows["honest"]
    assert rows["mallory"]["Total"] == "8.0" and rows["mallory"]["Status"] == "ok", rows["mallory"]
    assert rows["mallory"]["01_intuition: attention_pool"] == "0.0"

    report = json.loads((tmp_path / "reports" / "mallory" / "results.json").read_text())
    pool = next(t for t in report["tests"] if t["name"] == "01_intuition / attention_pool (cpu)")
    assert "sent the grader malformed data (tensor ranges overlap)" in pool["output"], pool["output"]
    everything = (tmp_path / "grades.csv").read_text() + err + out + "".join(
        p.read_text() for p in (tmp_path / "reports").rglob("*") if p.is_file())
    assert "grader error" not in everything and "Traceback" not in everything

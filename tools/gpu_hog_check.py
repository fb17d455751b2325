"""Issue 26's GPU hog, on a real GPU: can one student take the GPU from the others?

A chapter 2 notebook whose first cell fills the GPU and leaves a process of its own session
filling it too is graded in a batch with three honest copies of the chapter 2 solution, with
`--jobs 4` and with `--jobs 1` (the hog first); the honest students must score what they score
in a batch without the hog, and no process may hold the GPU afterwards. Run by
`tools/gpu_check.sh`; `--device cpu` runs the same batches without a GPU (the hog does nothing
there), to check the script itself. Exit status 0 when the honest scores are unchanged.
"""
from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
CHAPTER = "02_scaled_dot_product_attention"
HOG = r'''
import subprocess, sys, torch
FILL = """
import time, torch
keep = []
try:
    while True:
        keep.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
except Exception:
    pass
time.sleep(900)
"""
if torch.cuda.is_available():
    subprocess.Popen([sys.executable, "-c", FILL], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    keep = []
    try:
        while True:
            keep.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    except Exception:
        print("hog: the GPU is full:", len(keep), "GiB")
'''
HONEST = ["b_honest", "c_honest", "d_honest"]


def make_class(root: Path, with_hog: bool) -> Path:
    solution = nbformat.read(REPO / "solutions" / f"{CHAPTER}.ipynb", as_version=4)
    for name in (["a_hog"] if with_hog else []) + HONEST:
        nb = nbformat.from_dict(solution)
        if name == "a_hog":
            nb.cells = [nbformat.v4.new_code_cell(HOG)] + list(nb.cells)
        (root / name).mkdir(parents=True)
        nbformat.write(nb, root / name / f"{CHAPTER}.ipynb")
    return root


def gpu_processes() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "(no nvidia-smi)"
    r = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                       capture_output=True, text=True)
    if r.returncode:  # (an answer it could not give is no proof the GPU is free: a failure)
        return f"(nvidia-smi failed, exit {r.returncode}: {(r.stderr or r.stdout).strip()[:200]})"
    return r.stdout.strip() or "none"


def batch(class_dir: Path, jobs: int, device: str, out: Path, seed: str) -> tuple[dict[str, str], str]:
    """name -> "Total (Status)" of one `batch` run, printed with its time; and the processes
    that hold GPU memory once it is done."""
    grades = out / f"{class_dir.name}-jobs{jobs}.csv"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "autograder", "batch", str(class_dir), "--jobs", str(jobs),
                        "--device", device, "--seed", seed, "--no-progress", "--csv", str(grades)],
                       capture_output=True, text=True, cwd=REPO)
    seconds = time.monotonic() - t0
    if r.returncode != 0 or not grades.exists():
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit(f"gpu_hog_check: batch {class_dir.name} --jobs {jobs} exited {r.returncode}")
    with open(grades, newline="") as f:
        rows = {row["Student"]: f"{row['Total']} ({row['Status']})" for row in csv.DictReader(f)
                if row["Student"] and not row["Student"].startswith(" ")}
    left = gpu_processes()
    print(f"{class_dir.name:6s} --jobs {jobs}: {seconds:5.1f} s  " +
          ", ".join(f"{k} {v}" for k, v in sorted(rows.items())) + f"; GPU processes after: {left}")
    return rows, left


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--seed", default="20261126", help="the course seed for these batches")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-hog-") as tmp:
        tmp = Path(tmp)
        plain, _ = batch(make_class(tmp / "plain", False), 4, args.device, tmp, args.seed)
        hog = make_class(tmp / "hog", True)
        runs = [batch(hog, 4, args.device, tmp, args.seed), batch(hog, 1, args.device, tmp, args.seed)]
    failures = [f"{name} scored {run.get(name)} beside the hog, {plain[name]} without it"
                for run, _ in runs for name in HONEST if run.get(name) != plain[name]]
    failures += [f"processes still hold the GPU after a batch: {left}"
                 for _, left in runs if left not in ("none", "(no nvidia-smi)")]
    for failure in failures:
        print("gpu_hog_check:", failure)
    print("gpu_hog_check:", "FAILED" if failures else "PASSED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

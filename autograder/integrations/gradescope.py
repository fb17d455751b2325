"""Gradescope: build the autograder zip, and the entry point its run_autograder calls.

Gradescope unpacks the zip into /autograder/source, runs setup.sh once when building the image,
then for each submission runs /autograder/run_autograder with the student's files in
/autograder/submission, and reads /autograder/results/results.json. The root is configurable
(AUTOGRADER_ROOT) so the whole flow can be tested in a simulated tree.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

from ..references.solutions import REPO_DIR

SETUP_SH = """#!/usr/bin/env bash
# Gradescope image setup: Debian/Ubuntu packages, then torch (CPU build), then the grader's
# dependencies as pyproject.toml pins them. The grader itself is NOT installed: it runs from
# /autograder/source, which the sandbox never shows to a student's code, while site-packages
# (which it does show, read-only) holds nothing of the grader's.
set -euo pipefail
apt-get update -qq && apt-get install -y -qq python3 python3-pip python3-venv bubblewrap >/dev/null
python3 -m venv /opt/grader-venv
/opt/grader-venv/bin/pip install -q "__TORCH__" --index-url https://download.pytorch.org/whl/cpu
/opt/grader-venv/bin/pip install -q __DEPENDENCIES__
"""


def torch_requirement() -> str:
    """The torch pin of pyproject.toml ("torch==X.Y.Z"): its one place."""
    return next(d for d in grader_dependencies() if d.startswith("torch=="))


def grader_dependencies() -> list[str]:
    """What the grader needs, as pyproject.toml pins it (torch included)."""
    import tomllib

    return list(tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]["dependencies"])

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Grade /autograder/submission and always write /autograder/results/results.json.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PY="${AUTOGRADER_PYTHON:-/opt/grader-venv/bin/python}"
[ -x "$PY" ] || PY=python3
export AUTOGRADER_SOLUTIONS="$ROOT/source/solutions"
export AUTOGRADER_CACHE_DIR="$ROOT/source/reference-cache"
export AUTOGRADER_HIDE="$ROOT/results"
# The course's secret input seed (built into this zip by gradescope-zip; never the public default).
AUTOGRADER_SEED="$(cat "$ROOT/source/course-seed")"
export AUTOGRADER_SEED
# Where there are no namespaces (Docker's default capabilities), the grader runs each student as
# a uid of its own: the grader, the solutions and the results must be unreadable to it.
mkdir -p "$ROOT/results"
chmod -R go-rwx "$ROOT/source" "$ROOT/results" 2>/dev/null || true
export PYTHONPATH="$ROOT/source${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT/source"
exec "$PY" -m autograder.integrations.gradescope "$ROOT" __CHAPTERS__ __OPTIONS__
"""

PACKAGE_FILES = ("pyproject.toml",)


CACHE_FOLDER = "reference-cache"


def build_zip(output, chapters: list[str] | None = None, seed: int | None = None,
              hide_answers: bool = False, settings=None) -> Path:
    """Write the Gradescope autograder zip: setup.sh, run_autograder, the grader, the solutions,
    and the reference outcomes of these chapters (`reference_store`), computed here once
    instead of in every submission's fresh container (used there when its torch is the same
    version; otherwise computed there as usual). The assignment grades `chapters` (every
    chapter where None), a chapter not handed in at zero; with `hide_answers`, the written
    answers' results are shown when the grades are published (`report.gradescope`).
    settings: the command line's (`settings.Settings`; default `settings.current()`)."""
    from ..cases.inputs import PublicSeed, course_seed, new_seed
    from ..settings import current

    settings = settings or current()
    try:  # (the course's seed where the instructor gives one, else one made for this zip)
        seed = course_seed(seed, settings)
    except PublicSeed:
        seed = new_seed()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as z:
        def add_text(name, text, mode=0o755):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            z.writestr(info, text)

        others = " ".join(f'"{d}"' for d in grader_dependencies() if not d.startswith("torch=="))
        add_text("setup.sh", SETUP_SH.replace("__TORCH__", torch_requirement()).replace("__DEPENDENCIES__", others))
        add_text("run_autograder", RUN_AUTOGRADER.replace("__CHAPTERS__", ",".join(chapters or ["all"]))
                 .replace("__OPTIONS__", "--hide-answers" if hide_answers else ""))
        add_text("course-seed", f"{seed}\n", mode=0o600)
        for f in sorted((REPO_DIR / "autograder").rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                z.write(f, f.relative_to(REPO_DIR).as_posix())
        for f in sorted(settings.solutions.glob("*.ipynb")):
            z.write(f, f"solutions/{f.name}")
        for name in PACKAGE_FILES:
            z.write(REPO_DIR / name, name)
        name, data = _reference_outcomes(chapters, seed)
        z.writestr(f"{CACHE_FOLDER}/{name}", data)
    return output


def _reference_outcomes(chapters: list[str] | None, seed: int) -> tuple[str, bytes]:
    """The reference-outcome file that `run` will look for, and its bytes."""
    from ..shared import wire
    from ..shared.contract import CHAPTERS
    from ..references.cache import ReferenceCache
    from ..grading.variants import device_plan
    from ..references.store import ReferenceStore

    references = ReferenceCache()
    references.warm(chapters or list(CHAPTERS), device_plan("cpu"), seed, False)
    name = ReferenceStore(seed, False, Path(CACHE_FOLDER)).path.name
    return name, wire.encode(references.export(seed, False))


def copy_without_links(src: Path, dst: Path) -> list[str]:
    """Copy the submission folder: regular files by content, each opened without following a
    link or blocking; a symbolic link copied as the link itself (the grader then refuses it,
    saying why), never what it points to; anything else (a pipe, a device) left out, with a note."""
    from ..source.notebook import read_submission_file

    notes: list[str] = []
    dst.mkdir(mode=0o700)
    for folder, dirs, files in os.walk(src):  # (os.walk does not enter linked folders)
        here = dst / os.path.relpath(folder, src)
        for name in dirs + files:
            path, target = Path(folder) / name, here / name
            try:
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode):
                    os.symlink(os.readlink(path), target)
                elif stat.S_ISDIR(mode):
                    target.mkdir(mode=0o700)
                elif stat.S_ISREG(mode):
                    target.write_bytes(read_submission_file(path, 1 << 30))
                else:
                    notes.append(f"{path.relative_to(src)}: not a regular file; left out.")
            except (OSError, ValueError) as e:
                notes.append(f"{path.relative_to(src)}: could not be read ({e}); left out.")
    return notes


def run(root, chapters: list[str] | None = None, hide_answers: bool = False, settings=None) -> dict:
    """Grade <root>/submission into <root>/results/results.json; always writes a results file.
    The submission is copied without following links (`copy_without_links`), then placed as
    `import` places a student's files (zips unpacked, each chapter's newest notebook under its
    chapter's name: `lms_import.place_submission`); every chapter of the assignment
    (`chapters`, else all) is graded, one not handed in at zero. The instructor's notes
    (sandbox, flags) go to stdout, which Gradescope shows instructors only. settings: the
    runner's (`settings.Settings`, read once from the environment run_autograder sets; default
    `settings.Settings.from_env()`)."""
    from ..settings import Settings, installed

    from ..shared.contract import CHAPTERS
    from ..references.cache import REFERENCES
    from ..grading.grader import Grader
    from ..lms.placing import place_submission
    from ..references.store import persisted
    from ..report import gradescope

    root = Path(root)
    results_path = root / "results" / "results.json"
    results_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        settings = settings or Settings.from_env()
        # (the seed: the zip's own course-seed, which run_autograder exports)
        grader = Grader(settings=settings)
        with installed(settings), tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
            skipped = copy_without_links(root / "submission", Path(tmp) / "raw")
            placed, unplaced = place_submission(Path(tmp) / "raw", Path(tmp) / "submission",
                                                settings.max_student_zip_bytes)
            with persisted(REFERENCES, grader.seed, grader.quick, cuda="cuda" in grader.devices):
                result = grader.grade_path(Path(tmp) / "submission", chapters=chapters or list(CHAPTERS))
        result.path = "submission"
        result.notes = skipped + _placing_notes(placed, unplaced) + [
            n for n in result.notes if "not a chapter notebook" not in n]  # (placing said which and why)
        data = gradescope.results_json(result, hide_answers)
        print(gradescope.instructor_output(result))
    except Exception:  # the results file is written whatever happens
        data = {"score": 0.0, "execution_time": round(time.perf_counter() - start, 2),
                "output": "The autograder failed on this submission; please tell your instructor.\n"
                          + traceback.format_exc(limit=3),
                "visibility": "visible", "tests": []}
    results_path.write_text(json.dumps(data, indent=2))
    return data


def _placing_notes(placed, unplaced) -> list[str]:
    """What placing the submission did that the student should know: zips unpacked, a chapter
    handed in twice, files not graded."""
    zips = sorted({p.source[:p.source.lower().index(".zip/") + 4] for p in placed.placed.values()
                   if ".zip/" in p.source.lower()})
    return ([f"unpacked {z}" for z in zips] + [c.describe().strip() for c in placed.choices]
            + [f"{p.chapter}: {n}" for p in placed.placed.values() for n in p.notes]
            + [f"not graded: {u.source} ({u.reason})" for u in unplaced])


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("AUTOGRADER_ROOT", "/autograder")
    chosen = [c for c in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if c and c != "all"]
    out = run(root, chosen, hide_answers="--hide-answers" in sys.argv[3:])
    print(f"score {out['score']} written to {Path(root) / 'results' / 'results.json'}")

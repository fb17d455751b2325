#!/usr/bin/env python
"""Generate the exercise notebooks from the solution notebooks, with nbgrader's own machinery.

    python tools/generate_exercises.py           # write exercises/NN_name.ipynb
    python tools/generate_exercises.py --check   # exit 1, listing differences, if the committed
                                                 # exercises differ from freshly generated ones

The solution notebooks are the only hand-edited exercise code. For each `solutions/NN_name.ipynb`
this runs nbgrader's `generate_assignment` preprocessors that need no course database
(ClearSolutions with its default stub `raise NotImplementedError()`, or `name = ...` in a
"predict the output" answer cell, grade id `predict_*`; ClearHiddenTests,
ClearMarkScheme, ClearOutput, LockCells, ComputeChecksums, CheckCellMetadata), then tags every
self-check cell (an nbgrader grade cell) `raises-exception`, since it fails on the stubs.

Before that, every BEGIN/END marker pair is checked: nbgrader rejects a BEGIN without an END,
but silently ignores an END without a BEGIN, so both are checked here.

The output is deterministic: nbformat's sorted-key JSON, no outputs, no execution counts, the
solutions' cell ids.
"""
from __future__ import annotations

import argparse
import copy
import difflib
import re
import sys
from pathlib import Path

import nbformat
from nbconvert.preprocessors import Preprocessor
from nbgrader import utils as nbgrader_utils
from nbgrader.preprocessors import (
    CheckCellMetadata,
    ClearHiddenTests,
    ClearMarkScheme,
    ClearOutput,
    ComputeChecksums,
    LockCells,
)

# (the answer cells' stub, shared with the nbgrader course's generate_assignment)
from autograder.integrations.answer_stubs import ClearSolutionsAndAnswers, answer_stub  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
RAISES_TAG = "raises-exception"

# (begin, end) delimiters of nbgrader's regions, as ClearSolutions / ClearHiddenTests /
# ClearMarkScheme match them (a substring of the line).
MARKERS = (
    ("BEGIN SOLUTION", "END SOLUTION"),
    ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"),
    ("BEGIN MARK SCHEME", "END MARK SCHEME"),
)


class MarkerError(ValueError):
    """An unmatched, nested or misplaced BEGIN/END marker in a solution notebook."""


def marker_problems(nb, name: str = "notebook") -> list[str]:
    """Every unmatched or nested BEGIN/END marker, and every region outside a cell that nbgrader
    would accept it in, as 'name, cell N (id), line L: problem' strings."""
    problems = []
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index} ({cell.get('id', '?')})"
        lines = cell.source.split("\n")
        for begin, end in MARKERS:
            open_line = None
            for lineno, line in enumerate(lines, 1):
                if begin in line:
                    if open_line is not None:
                        problems.append(f"{where}, line {lineno}: '{begin}' inside the region opened on "
                                        f"line {open_line}")
                    open_line = lineno
                elif end in line:
                    if open_line is None:
                        problems.append(f"{where}, line {lineno}: '{end}' without a '{begin}'")
                    open_line = None
            if open_line is not None:
                problems.append(f"{where}, line {open_line}: '{begin}' without an '{end}'")
        has_solution = any(MARKERS[0][0] in line or MARKERS[0][1] in line for line in lines)
        if has_solution and not nbgrader_utils.is_solution(cell):
            problems.append(f"{where}: solution markers in a cell that is not an nbgrader solution cell")
    return problems


class TagSelfChecks(Preprocessor):
    """Tag the self-check cells (nbgrader grade cells that are not solution cells)
    `raises-exception`: they fail while the exercises are stubs, and the book and the notebook
    tests expect exactly those cells to fail."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and nbgrader_utils.is_grade(cell) and not nbgrader_utils.is_solution(cell):
            tags = list(cell.metadata.get("tags", []))
            if RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
            cell.metadata["tags"] = tags
        return cell, resources


def _preprocessors() -> list:
    # The order of nbgrader's GenerateAssignment converter, less the database-backed steps.
    return [
        ClearSolutionsAndAnswers(),
        ClearOutput(),
        LockCells(),
        ComputeChecksums(),
        ClearHiddenTests(),
        ClearMarkScheme(),
        CheckCellMetadata(),
        TagSelfChecks(),
    ]


def generate(solution: Path):
    """The exercise notebook for one solution notebook (a NotebookNode)."""
    nb = nbformat.read(solution, as_version=4)
    problems = marker_problems(nb, solution.name)
    if problems:
        raise MarkerError("unmatched or misplaced markers:\n  " + "\n  ".join(problems))
    nb = copy.deepcopy(nb)
    resources: dict = {}
    for pre in _preprocessors():
        nb, resources = pre.preprocess(nb, resources)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.execution_count = None
            cell.outputs = []
    leftover = [i for i, c in enumerate(nb.cells) if re.search(r"(BEGIN|END) (SOLUTION|HIDDEN TESTS|MARK SCHEME)", c.source)]
    if leftover:
        raise MarkerError(f"{solution.name}: markers left in cells {leftover} after clearing")
    nbformat.validate(nb)
    return nb


def render(nb) -> str:
    """Stable text of a notebook: nbformat's JSON (sorted keys, indent 1) and a final newline."""
    return nbformat.writes(nb) + "\n"


def solution_notebooks(solutions: Path = SOLUTIONS) -> list[Path]:
    return sorted(p for p in solutions.glob("[0-9][0-9]_*.ipynb"))


def generate_all(solutions: Path = SOLUTIONS, exercises: Path = EXERCISES) -> list[Path]:
    """Write exercises/NN_name.ipynb for every solution notebook; return the paths written."""
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for sol in solution_notebooks(solutions):
        target = exercises / sol.name
        target.write_text(render(generate(sol)), encoding="utf-8")
        written.append(target)
    return written


def check(solutions: Path = SOLUTIONS, exercises: Path = EXERCISES, context: int = 2) -> list[str]:
    """Differences between the committed exercises and freshly generated ones (empty: in sync).

    Each entry names the file and shows a short unified diff; a missing exercise, an exercise
    without a solution, and a marker problem are differences too.
    """
    differences = []
    expected_names = set()
    for sol in solution_notebooks(solutions):
        expected_names.add(sol.name)
        target = exercises / sol.name
        try:
            fresh = render(generate(sol))
        except (MarkerError, RuntimeError) as e:  # RuntimeError: nbgrader's own marker errors
            differences.append(f"{sol.name}: cannot generate: {e}")
            continue
        if not target.exists():
            differences.append(f"{target.relative_to(exercises.parent)}: missing (run tools/generate_exercises.py)")
            continue
        committed = target.read_text(encoding="utf-8")
        if committed != fresh:
            diff = list(difflib.unified_diff(committed.splitlines(), fresh.splitlines(),
                                             f"committed/{sol.name}", f"generated/{sol.name}",
                                             n=context, lineterm=""))
            shown = diff[:40] + ([f"... ({len(diff) - 40} more diff lines)"] if len(diff) > 40 else [])
            differences.append(f"{target.relative_to(exercises.parent)}: differs from the generated "
                               "version (run tools/generate_exercises.py)\n" + "\n".join(shown))
    for extra in sorted(exercises.glob("*.ipynb")):
        if extra.name not in expected_names:
            differences.append(f"{extra.relative_to(exercises.parent)}: no solution notebook of that name")
    return differences


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if the committed exercises differ from generated ones")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS)
    parser.add_argument("--exercises", type=Path, default=EXERCISES)
    args = parser.parse_args(argv)
    if args.check:
        differences = check(args.solutions, args.exercises)
        for d in differences:
            print(d, file=sys.stderr)
        if differences:
            print(f"{len(differences)} exercise notebook(s) out of sync with the solutions.", file=sys.stderr)
            return 1
        print(f"exercises in sync with {len(solution_notebooks(args.solutions))} solution notebooks.")
        return 0
    try:
        written = generate_all(args.solutions, args.exercises)
    except (MarkerError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

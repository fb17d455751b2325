"""The committed notebooks: clean, conventional, in sync, and runnable.

- solution and exercise notebooks carry no outputs and no execution counts;
- every graded name of the contract has its solution cell and its self-check cell, with the
  nbgrader metadata and points of `autograder/shared/contract.py`;
- BEGIN/END markers are matched, and the exercises are exactly what
  `tools/generate_exercises.py` makes from the solutions;
- the solution notebooks run top to bottom without error, and the exercise notebooks run with
  only their `raises-exception` cells (the self-checks of the stubs) failing.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.shared.contract import CHAPTERS, CHAPTER_IDS

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
IMPORTS = "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F"


def _load_tool():
    spec = importlib.util.spec_from_file_location("generate_exercises", REPO / "tools" / "generate_exercises.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("generate_exercises", module)
    spec.loader.exec_module(module)
    return module


gen_tool = _load_tool()


def _selfcheck_missing() -> str | None:
    """Why the self-check cells cannot run yet (None when they can)."""
    try:
        from autograder import selfcheck
    except Exception as e:  # noqa: BLE001 - any import problem means "not ready"
        return f"autograder.selfcheck cannot be imported yet ({type(e).__name__}: {e})"
    data = getattr(selfcheck, "DATA", None)
    if data is not None and not Path(data).exists():
        return (f"the self-check fixtures {Path(data).relative_to(REPO) if Path(data).is_relative_to(REPO) else data} "
                "do not exist yet (python -m autograder selfcheck-data)")
    return None


SELFCHECK_MISSING = _selfcheck_missing()


def notebooks(folder: Path) -> list[Path]:
    return [folder / f"{c}.ipynb" for c in CHAPTER_IDS]


ALL_NOTEBOOKS = notebooks(SOLUTIONS) + notebooks(EXERCISES)


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


# ------------------------------------------------------------------------ files and metadata
def test_every_chapter_has_both_notebooks_and_nothing_else():
    for folder in (SOLUTIONS, EXERCISES):
        assert sorted(p.name for p in folder.glob("*.ipynb")) == sorted(f"{c}.ipynb" for c in CHAPTER_IDS), folder


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=_id)
def test_no_outputs_or_execution_counts(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{_id(path)}: cells {dirty} carry outputs or execution counts (clear them before committing)"
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert all("outputs" not in c or c["outputs"] == [] for c in raw["cells"])
    ids = [c.get("id") for c in nb.cells]
    assert len(set(ids)) == len(ids), f"{_id(path)}: duplicate cell ids"


@pytest.mark.parametrize("chapter", CHAPTER_IDS)
def test_solution_cell_conventions(chapter):
    """First code cell = the imports; each graded name: a markdown cell, its solution cell
    (grade_id = the name), then its self-check cell (grade_id check_<name>, the contract's points)."""
    nb = nbformat.read(SOLUTIONS / f"{chapter}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source == IMPORTS and "nbgrader" not in code[0].metadata
    by_id = {c.metadata["nbgrader"]["grade_id"]: (i, c) for i, c in enumerate(nb.cells) if "nbgrader" in c.metadata}
    expected_ids = set()
    for ex in CHAPTERS[chapter].exercises:
        expected_ids |= {ex.name, f"check_{ex.name}"}
        i, sol = by_id[ex.name]
        meta = sol.metadata["nbgrader"]
        assert meta == {"solution": True, "grade": False, "locked": False, "grade_id": ex.name, "schema_version": 3}
        assert sol.source.count("### BEGIN SOLUTION") >= 1
        assert nb.cells[i - 1].cell_type == "markdown", f"{ex.name}: no description cell before the solution"
        j, chk = by_id[f"check_{ex.name}"]
        assert j == i + 1, f"{ex.name}: the self-check cell must follow the solution cell"
        assert chk.metadata["nbgrader"] == {"grade": True, "solution": False, "locked": True, "points": ex.points,
                                            "grade_id": f"check_{ex.name}", "schema_version": 3}
        assert chk.source == (f'from autograder.selfcheck import check\n'
                              f'check("{chapter}", "{ex.name}", {ex.target})')
    assert set(by_id) == expected_ids


# ------------------------------------------------------------------- markers and generation
@pytest.mark.parametrize("path", notebooks(SOLUTIONS), ids=_id)
def test_markers_matched(path):
    nb = nbformat.read(path, as_version=4)
    assert gen_tool.marker_problems(nb, path.name) == []


def test_exercises_in_sync_with_solutions():
    differences = gen_tool.check(SOLUTIONS, EXERCISES)
    assert not differences, "\n\n".join(differences)


def test_exercises_have_stubs_and_tags():
    for chapter in CHAPTER_IDS:
        nb = nbformat.read(EXERCISES / f"{chapter}.ipynb", as_version=4)
        text = "\n".join(c.source for c in nb.cells)
        assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            tags = cell.metadata.get("tags", [])
            if meta.get("grade") and not meta.get("solution"):
                assert "raises-exception" in tags and meta.get("checksum")
            else:
                assert "raises-exception" not in tags
            if meta.get("solution") and meta.get("grade_id", "").startswith("predict_"):
                # a "predict the output" answer: `name = ...`, so the notebook runs on
                assert f'{meta["grade_id"]} = ...' in cell.source and "raise" not in cell.source
            elif meta.get("solution"):
                assert "raise NotImplementedError()" in cell.source


def _notebook(*sources: str, solution: bool = True):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                            "display_name": "Python 3"}})
    for i, src in enumerate(sources):
        cell = nbformat.v4.new_code_cell(src)
        cell.id = f"c{i}"
        if solution:
            cell.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False,
                                         "grade_id": f"g{i}", "schema_version": 3}
        nb.cells.append(cell)
    return nb


@pytest.mark.parametrize("source,problem", [
    ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", "without an 'END SOLUTION'"),
    ("def f():\n    return 1\n    ### END SOLUTION\n", "without a 'BEGIN SOLUTION'"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "inside the region"),
    ("x = 1\n### BEGIN HIDDEN TESTS\nassert x\n", "without an 'END HIDDEN TESTS'"),
])
def test_unmatched_markers_are_reported(tmp_path, source, problem):
    nb = _notebook("x = 0\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION", source)
    problems = gen_tool.marker_problems(nb, "bad.ipynb")
    assert len(problems) == 1 and problem in problems[0] and "cell 1" in problems[0]
    path = tmp_path / "01_bad.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(gen_tool.MarkerError):
        gen_tool.generate(path)


def test_markers_outside_solution_cells_are_reported():
    nb = _notebook("x = 0\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION", solution=False)
    assert "not an nbgrader solution cell" in gen_tool.marker_problems(nb)[0]


def test_check_reports_differences_and_cli_exit_code(tmp_path, capsys):
    exercises = tmp_path / "exercises"
    shutil.copytree(EXERCISES, exercises)
    assert gen_tool.main(["--check", "--exercises", str(exercises)]) == 0
    edited = exercises / "05_masks.ipynb"
    edited.write_text(edited.read_text().replace("raise NotImplementedError()", "return None", 1))
    (exercises / "01_intuition.ipynb").unlink()
    (exercises / "99_extra.ipynb").write_text("{}")
    differences = gen_tool.check(SOLUTIONS, exercises)
    assert len(differences) == 3
    assert any(d.startswith("exercises/05_masks.ipynb: differs") and "+" in d for d in differences)
    assert any("01_intuition.ipynb: missing" in d for d in differences)
    assert any("99_extra.ipynb: no solution" in d for d in differences)
    assert gen_tool.main(["--check", "--exercises", str(exercises)]) == 1
    assert "out of sync" in capsys.readouterr().err


def test_generation_is_deterministic(tmp_path):
    out1, out2 = tmp_path / "a", tmp_path / "b"
    gen_tool.generate_all(SOLUTIONS, out1)
    gen_tool.generate_all(SOLUTIONS, out2)
    for p in out1.iterdir():
        assert p.read_bytes() == (out2 / p.name).read_bytes()


# ------------------------------------------------------------------------------- execution
def _execute(path: Path, monkeypatch):
    """Run a notebook top to bottom in a python3 kernel whose cwd is the notebook's folder;
    cells tagged raises-exception may fail (nbclient's default), any other failure raises."""
    from nbclient import NotebookClient

    # The kernel must import the autograder package even where it is not pip-installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def _errors(nb) -> dict:
    return {i: out for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for out in c.get("outputs", []) if out.output_type == "error"}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("chapter", CHAPTER_IDS)
def test_solution_notebook_runs(chapter, monkeypatch):
    assert SELFCHECK_MISSING is None, SELFCHECK_MISSING
    nb = _execute(SOLUTIONS / f"{chapter}.ipynb", monkeypatch)
    assert not _errors(nb)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("chapter", CHAPTER_IDS)
def test_exercise_notebook_runs_with_only_self_checks_failing(chapter, monkeypatch):
    nb = _execute(EXERCISES / f"{chapter}.ipynb", monkeypatch)
    errors = _errors(nb)
    tagged = {i for i, c in enumerate(nb.cells) if "raises-exception" in c.metadata.get("tags", [])}
    assert set(errors) <= tagged  # nbclient would have raised otherwise; belt and braces
    assert set(errors) == tagged, "every self-check should fail on the stubs"
    for out in errors.values():
        assert out.ename == "SelfCheckFailed", f"{out.ename}: {out.evalue}"
        assert "not implemented" in out.evalue or "NotImplementedError" in out.evalue, out.evalue

"""The reference implementations, taken from the solution notebooks (the single source).

A solution notebook's code cells run in a fresh namespace, except nbgrader grade cells (the
self-check cells) and cells tagged `demo`. The book and the grader import references from here
rather than restating them.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .. import settings as _settings

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = _settings.REPO_DIR


def solutions_dir() -> Path:
    """Where the solution notebooks are (`settings.Settings.solutions`: $AUTOGRADER_SOLUTIONS,
    else <repo>/solutions), as the entry point read it."""
    return _settings.current().solutions


def reference_cells(nb) -> list[str]:
    """The source of the cells that define a chapter's reference implementation.

    nb: a version-4 notebook, as an nbformat node or as the plain dict of its JSON (the grader
    reads the JSON itself: importing nbformat costs more than a second)."""
    sources = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        meta = cell.get("metadata", {})
        if meta.get("nbgrader", {}).get("grade") or "demo" in meta.get("tags", []):
            continue
        source = cell["source"]
        sources.append(source if isinstance(source, str) else "".join(source))
    return sources


@lru_cache(maxsize=None)
def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    if nb.get("nbformat") != 4:
        raise ValueError(f"{path}: a solution notebook must be nbformat 4")
    namespace: dict = {"__name__": f"reference_{Path(path).stem}"}
    for i, source in enumerate(reference_cells(nb)):
        exec(compile(source, f"<reference {Path(path).name} cell {i}>", "exec"), namespace)
    return namespace


def load_reference(chapter: str) -> dict:
    """The namespace of a chapter's solution notebook, e.g. load_reference("02_scaled_dot_product_attention")."""
    path = solutions_dir() / f"{chapter}.ipynb"
    if not path.exists():
        raise FileNotFoundError(f"reference solutions not found: {path} (set AUTOGRADER_SOLUTIONS)")
    return _load(str(path))

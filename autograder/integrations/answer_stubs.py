"""The released form of a "predict the output" answer cell: `name = ...`, not nbgrader's
`raise NotImplementedError()` (a top-level raise would stop the notebook there). Shared by
tools/generate_exercises.py (the exercises/ notebooks) and the nbgrader course's
generate_assignment (`integrations.nbgrader`), so both release the same cells."""
from __future__ import annotations

import re

from nbgrader.preprocessors import ClearSolutions

from ..shared.contract import CHAPTERS

# The grade ids of the answer cells: the names of the contract's written answers (`Exercise.task`).
ANSWER_IDS = frozenset(ex.name for ch in CHAPTERS.values() for ex in ch.exercises if ex.task.value)


def answer_stub(cell) -> str | None:
    """The stub of a "predict the output" cell: `name = ...` for each name its solution assigns
    (so the exercise notebook runs, and the self-check says "not answered yet"); None for other cells."""
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
    if cell.cell_type != "code" or grade_id not in ANSWER_IDS:
        return None
    names = re.findall(r"^(\w+)\s*=", cell.source, flags=re.M)
    return "\n".join(f"{name} = ...  # YOUR ANSWER HERE" for name in dict.fromkeys(names)) or None


class ClearSolutionsAndAnswers(ClearSolutions):
    """nbgrader's ClearSolutions, with `name = ...` rather than `raise NotImplementedError()` as the
    stub of an answer cell."""

    def preprocess_cell(self, cell, resources, index):
        stub = answer_stub(cell)
        if stub is None:
            return super().preprocess_cell(cell, resources, index)
        saved = dict(self.code_stub)
        self.code_stub = {**saved, "python": stub}
        try:
            return super().preprocess_cell(cell, resources, index)
        finally:
            self.code_stub = saved

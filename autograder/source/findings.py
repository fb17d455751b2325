"""Static checks of a submission's source: forbidden built-ins and in-place changes of inputs.

Two graded properties are also measured at run time inside the student's process (runtime/execute.py:
the recorder of forbidden ops, the comparison of inputs before and
after a call), which the student controls: emptying the forbidden-op table or disabling the
comparison there changes what that process reports. The grader has the notebook's source, so it
checks the same properties here, in its own process, where the student cannot reach.

Pure and cheap (a few milliseconds per notebook): nothing is executed, imported or written.
Every public function never raises; on input it cannot make sense of it reports nothing.

The parse is `submission.py` (its symbol table `symbols.py`); the two analyses are
`forbidden.py` and `in_place.py`."""
from __future__ import annotations

from dataclasses import dataclass

from ..shared.contract import Chapter
from .symbols import Notebook
from .submission import ParsedSubmission
from .forbidden import ForbiddenScope, forbidden_names
from .in_place import inplace_findings


@dataclass(frozen=True)
class ExerciseFindings:
    """What the static check found for one exercise (falsy when nothing)."""

    forbidden: tuple = ()  # ForbiddenUse, sorted by cell and line
    inplace: tuple = ()    # InPlaceChange, sorted by cell and line

    def __bool__(self) -> bool:
        return bool(self.forbidden or self.inplace)

    @property
    def forbidden_names(self) -> frozenset:
        return frozenset(f.name for f in self.forbidden)

    @property
    def modified_params(self) -> frozenset:
        return frozenset(c.param for c in self.inplace)

    def describe(self) -> list[str]:
        """One line of text per finding, forbidden uses first."""
        return [f.describe() for f in self.forbidden] + [c.describe() for c in self.inplace]


EMPTY = ExerciseFindings()


def findings(cells, chapter: Chapter, tensor_params: dict | None = None) -> dict[str, ExerciseFindings]:
    """exercise name -> ExerciseFindings, for every exercise of `chapter`.

    cells: the notebook's `submission.ParsedSubmission`, or its code cells as they run (as
        `notebook.notebook_cells` gives them).
    tensor_params: exercise -> method (None for a function / a module's forward) -> the
        parameters that receive tensors (`tensor_params_from_cases`); exercises it leaves out
        get no in-place check.
    Never raises: an exercise whose check fails internally gets no findings.
    """
    out: dict = {}
    try:
        exercises = list(chapter.exercises)
    except Exception:
        return out
    try:
        nb = ParsedSubmission.of(cells).symbols
    except Exception:
        nb = Notebook((), ())
    if not isinstance(tensor_params, dict):
        tensor_params = {}
    for ex in exercises:
        try:
            out[ex.name] = _exercise(nb, ex, tensor_params.get(ex.name) or {})
        except Exception:
            out[ex.name] = EMPTY
    return out


def _exercise(nb: Notebook, ex, tensor_params: dict) -> ExerciseFindings:
    if not ex.task.code_checked:  # (a written answer: a value, no code)
        return EMPTY
    forbidden: list = []
    names = forbidden_names(ex.forbidden) if ex.forbidden else frozenset()
    if names:
        scope = ForbiddenScope(nb, names)
        try:
            scope.start(ex.target, ex.kind, ex.name if ex.kind == "method" else None)
            forbidden = scope.run()
        except Exception:  # RecursionError included: keep what was certain so far
            forbidden = sorted(scope.found.values(), key=lambda f: (f.cell, f.line, f.name))
    inplace: list = []
    is_class = ex.kind in ("module", "method")
    try:
        methods = sorted(tensor_params.items(), key=lambda kv: kv[0] or "")
    except Exception:  # not a dict of method -> names: no in-place check
        methods = []
    for method, params in methods:
        try:
            if params and (method is None or isinstance(method, str)):
                inplace.extend(inplace_findings(nb, ex.target, is_class, method,
                                                 {p for p in params if isinstance(p, str)}))
        except Exception:
            continue
    inplace.sort(key=lambda c: (c.cell, c.line, c.param))
    return ExerciseFindings(tuple(forbidden), tuple(inplace))

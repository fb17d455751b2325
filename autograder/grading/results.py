"""What grading produces: plain dataclasses that every report (text, JSON, HTML, CSV) reads."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..sandbox.modes import SandboxMode


@dataclass
class CaseResult:
    case: str
    device: str          # "cpu", "cuda", "fake-cuda" (device_check), "meta"
    dtype: str
    passed: bool
    aspect: str = ""     # first failing aspect (see compare.Mismatch)
    message: str = ""
    hint: str | None = None
    note: str = ""       # on a pass: what was allowed (e.g. compare.FLOAT32_NOTE)
    not_implemented: bool = False  # the code is still the exercise stub
    figure: dict | None = None  # {"expected": [[...]], "submitted": [[...]]} attention weights, for HTML
    used: list = field(default_factory=list)  # the exercises it builds on that this case's code called


@dataclass
class TestResult:
    """One graded test: an exercise on one device (the unit Gradescope shows)."""

    chapter: str
    exercise: str
    device: str
    score: float
    max_score: float
    cases: list = field(default_factory=list)
    note: str = ""       # a message that applies to the whole test (missing name, forbidden op)

    @property
    def passed(self) -> int:
        return sum(c.passed for c in self.cases)

    @property
    def exact_score(self) -> float:
        """The score at full precision. Grading stores `score` rounded to 4 decimals (what the
        reports show: 2 of 3 cases of 1 point is 0.6667); sums (chapter, student, gradebook)
        use this instead, so rounding happens once, after summing. A score set otherwise (a
        forbidden API's zero) is kept as it is."""
        n = len(self.cases)
        if n and self.max_score:
            exact = self.max_score * (self.passed / n)  # (all passed: exactly max_score)
            if round(exact, 4) == self.score:
                return exact
        return float(self.score)

    @property
    def first_failure(self) -> CaseResult | None:
        return next((c for c in self.cases if not c.passed), None)

    def hints(self) -> list[tuple[str, int]]:
        """The distinct hints of the failing cases, with how many cases give each, the most
        shared first (first seen on a tie). The first failing case may combine two mistakes that
        no single hint names, while later cases name each one."""
        return Counter(c.hint for c in self.cases if not c.passed and c.hint).most_common()

    def hint_lines(self, at_most: int = 3) -> list[str]:
        """"hint (4 of 6 failing cases): ..." lines for the reports."""
        failing = len(self.cases) - self.passed
        return [f"hint ({n} of {failing} failing cases): {h}" if failing > 1 else f"hint: {h}"
                for h, n in self.hints()[:at_most]]


@dataclass
class ChapterResult:
    chapter: str
    notebook: str | None
    tests: list = field(default_factory=list)
    notes: list = field(default_factory=list)    # notebook-level messages (cell errors, sandbox mode)
    output: str = ""                             # the notebook's captured output (capped)
    seconds: float = 0.0
    sandbox: SandboxMode | None = None           # how the notebook ran (None: it did not run)
    error: str | None = None                     # why its grading could not finish (a grader fault)
    not_graded: str | None = None                # why the notebook could not be read (the student's)
    # The notebook's `source.submission.ParsedSubmission` while its grading is in memory (set
    # by `Grader.grade_notebook`, dropped by `Grader.assemble`); not a field: never saved or copied.
    source = None
    # What the class report reads of its code (`batch.workers.source_flags`), kept by the batch
    # in place of `source` once the chapter is graded; not a field either.
    flags = None

    @property
    def score(self) -> float:
        return sum(t.exact_score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)


@dataclass
class SubmissionResult:
    path: str
    chapters: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    sandbox: SandboxMode | None = None           # the weakest mode any chapter ran in

    @property
    def error(self) -> str | None:
        """Why grading could not finish for this student (None: it did): the score is then not
        a grade, and class grading says `error`, never a silent zero."""
        return next((c.error for c in self.chapters if c.error), None)

    @property
    def score(self) -> float:
        return sum(c.score for c in self.chapters)

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.chapters)

    def to_plain(self) -> dict:
        d = _plain(self)
        d["score"], d["max_score"] = self.score, self.max_score
        return d

    @classmethod
    def from_plain(cls, d: dict) -> "SubmissionResult":
        """The inverse of `to_plain` (after a JSON round trip): what `batch --out` keeps of each
        student for the class report. Unknown keys are ignored; the sandbox stays a string."""
        chapters = []
        for ch in d.get("chapters", []):
            tests = [_make(TestResult, {**t, "cases": [_make(CaseResult, c) for c in t.get("cases", [])]})
                     for t in ch.get("tests", [])]
            chapters.append(_make(ChapterResult, {**ch, "tests": tests}))
        return _make(cls, {**d, "chapters": chapters})


_LEAVES = frozenset((str, int, float, bool, type(None)))


def _plain(value):
    """`dataclasses.asdict`'s result (new dicts and lists all the way down) without its
    `copy.deepcopy` of every leaf: a result's leaves are str, numbers, None and SandboxMode,
    which need no copy. A solution student's result took 7.5 ms in `asdict` (2.4 ms here),
    each time batch wrote it to its journal and a worker to its spool."""
    if type(value) in _LEAVES:
        return value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return type(value)(v if type(v) in _LEAVES else _plain(v) for v in value)
    if isinstance(value, dict):
        return {k: v if type(v) in _LEAVES else _plain(v) for k, v in value.items()}
    return value


def _make(kind, d: dict):
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in d.items() if k in names})

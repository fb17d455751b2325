"""What running a student's notebook gave, as `StudentSession.start()` reports it: a `NotebookRun`
with one `CellRun` per code cell, and the `CellRecorder` that fills them in as the cells run
(in one child, or in several when a cell hangs or crashes one)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .channel import Budget, Capture, Channel

# A cell's status: "ok", "error", "timeout", "crash" (the child died in it), "skipped" (it ran
# in an earlier child and hung there), "not run" (the notebook's time budget ran out first).
CELL_STATUSES = ("ok", "error", "timeout", "crash", "skipped", "not run")


@dataclass
class CellRun:
    """One code cell's run. `error` is the child's error as `trust.plain_error` checked it
    ({"type", "message", "where"}), or the grader's own for a timeout or a crash."""

    cell: int                # 1-based, counting code cells only
    status: str              # one of CELL_STATUSES
    error: dict | None = None
    seconds: float = 0.0
    output: str = ""         # what the cell printed (capped)

    @property
    def message(self) -> str:
        """The error in one line ("" when the cell ran without one)."""
        err = self.error
        if self.status == "not run":
            return "not run: the notebook's time budget ran out before this cell"
        if not err:
            return ""
        where = f" ({err['where'].splitlines()[-1]})" if err.get("where") and \
            err["where"] != f"<cell {self.cell}>" else ""
        if err.get("type") in ("Timeout", "Crash"):
            return err.get("message", "") + where
        return f"{err.get('type')}: {err.get('message', '')}{where}"


@dataclass
class NotebookRun:
    """The notebook's cells run once, at the start of a session."""

    sandbox: str             # a `SandboxMode`
    sandbox_note: str        # "" with bubblewrap, else what the mode used means
    error: str | None        # why the notebook could not run at all, or None
    cells: list[CellRun] = field(default_factory=list)
    defined: list[str] = field(default_factory=list)  # top-level names at the end, none "_"-led
    startup_seconds: float | None = None  # the first child's start-up (Python + torch import)
    seconds: float = 0.0

    @property
    def output(self) -> str:
        """Every cell's output, "[cell n]"-headed (each capped)."""
        return "".join(f"[cell {c.cell}]\n{c.output.rstrip()}\n" for c in self.cells if c.output.strip())


class CellRecorder:
    """Each cell's first run: its status (kept from the first child that got to it) and its
    output, all cells sharing one output budget."""

    def __init__(self, count: int, budget: Budget):
        self.count, self.budget = count, budget
        self.runs: dict[int, CellRun] = {}
        self.captures: dict[int, Capture] = {}

    def listen(self, channel: Channel) -> None:
        """Capture, in `channel`'s child, the output of the cells not recorded yet."""
        for n in range(1, self.count + 1):
            if n not in self.runs:
                self.captures[n] = channel.captures[n] = Capture(self.budget)

    def record(self, run: CellRun) -> None:
        self.runs.setdefault(run.cell, run)

    def cells(self) -> list[CellRun]:
        """Every cell, in order, with its output ("not run" where no child got to it)."""
        cells = []
        for n in range(1, self.count + 1):
            run = self.runs.get(n) or CellRun(n, "not run")
            run.output = self.captures[n].text() if n in self.captures else ""
            cells.append(run)
        return cells

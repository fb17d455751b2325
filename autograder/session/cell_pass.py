"""One pass of a notebook's cells through the session's current child: `run_cells`. A cell that
hangs or crashes the child ends the pass; it is skipped from then on, and the caller (the
session's one restart loop) starts a fresh child for the next pass."""
from __future__ import annotations

import time

from ..shared import protocol
from ..sandbox.limits import Limits
from .channel import Lost, LostKind
from .child_slot import ChildSlot
from .notebook_run import CellRecorder, CellRun
from .trust import plain_error

# What a child may say of a cell (anything else is an "error"); "crash" is the grader's to say.
CHILD_STATUSES = ("ok", "error", "timeout", "skipped", "not run")


def run_cells(slot: ChildSlot, cells: list[str], skip: set[int], limits: Limits,
              recorder: CellRecorder | None, end: float) -> list[str] | None:
    """Run the notebook in `slot`'s child, cells in `skip` left out, until `end`: the names the
    notebook defined, or None after the child hung, died or sent garbage (the culprit cell is
    added to `skip`). `recorder` keeps each cell's first run (None: a re-run, not reported)."""
    channel = slot.channel
    if recorder is not None:
        recorder.listen(channel)
    left = max(0.0, end - time.monotonic())
    if not channel.send(protocol.RunCells(cells, sorted(skip), limits.cell_timeout, left),
                        time.monotonic() + limits.send_timeout):
        slot.kill()  # died before it could read the cells: no cell is to blame
        return None
    expected = 1
    while True:
        running = expected if expected <= len(cells) else None
        per_cell = min(limits.cell_timeout, max(0.0, end - time.monotonic()))
        event = channel.receive(time.monotonic() + per_cell + limits.grace)
        match event:
            case protocol.CellDone(cell=number) if number == expected:
                if recorder is not None:
                    status = event.status if event.status in CHILD_STATUSES else "error"
                    recorder.record(CellRun(number, status, plain_error(event.error), float(event.seconds)))
                if event.status == "timeout":
                    skip.add(expected)  # a cell that hung costs its time only once
                expected += 1
            case protocol.CellsDone(defined=names) if running is None:
                # The child wrote every cell's output before this message, but the poll may
                # have woken for the result pipe alone: read the output before it is reported.
                channel.drain_output(limits.drain_cap)
                return sorted({n for n in names if isinstance(n, str)})
            case Lost():
                _blame(slot, cells, skip, limits, recorder, running, event)
                return None
            case _:
                lost = Lost(LostKind.MALFORMED, f"unexpected message {type(event).__name__}")
                _blame(slot, cells, skip, limits, recorder, running, lost)
                return None


def _blame(slot: ChildSlot, cells: list[str], skip: set[int], limits: Limits,
           recorder: CellRecorder | None, running: int | None, event: Lost) -> None:
    """The child hung, died or sent garbage while running cell `running` (None: after the last
    cell): kill it and skip the culprit, unless the sandbox died while shared (no one to blame)."""
    timed_out = event.kind == LostKind.TIMEOUT
    if event.kind == LostKind.MALFORMED:
        slot.kill()
        message = "sent the grader malformed data (" + event.why[:200] + ")"
    elif timed_out:
        slot.kill()
        message = (f"ran longer than {limits.cell_timeout:g} s and could not be "
                   "interrupted, so the grader stopped it")
    else:
        child = slot.child
        if child is not None:
            child.wait(limits.exit_wait)
        slot.kill()
        if slot.died_shared():
            return  # no cell to blame: the cells run again, in a sandbox of their own
        message = "crashed the grading process: it " + (child.exit_description() if child else "ended")
    culprit = running if running is not None else max(
        [n for n in range(1, len(cells) + 1) if n not in skip] or [0])
    if not culprit:
        return
    skip.add(culprit)
    if recorder is not None:
        recorder.record(CellRun(culprit, "timeout" if timed_out else "crash", {
            "type": "Timeout" if timed_out else "Crash",
            "message": f"this cell {message}. The cells after it ran in a fresh process without it.",
            "where": f"<cell {culprit}>"}))

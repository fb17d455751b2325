"""The grader's side of running one student's notebook: `StudentSession`.

    choice = resolve_sandbox("auto")
    pool = student_pool(choice)             # the student's sandboxes: made and closed by the caller
    with StudentSession(ParsedSubmission.read(path), sandbox=choice, sandboxes=pool) as session:
        run = session.start()               # runs the cells: a NotebookRun, one CellRun per cell
        outcome = session.run(call)         # one graded Call -> Outcome, never raises
    pool.close()                            # (None unless bubblewrap)

The notebook runs in a child process (see `autograder.sandbox` for the three sandbox modes);
only plain data comes back (`autograder.shared.protocol` messages in `autograder.shared.wire` frames, read
by `autograder.session.channel` and checked field by field by `autograder.session.trust`), and comparing
and scoring happen in this process alone.

The parts: `child_slot` (the one child at a time), `channel` (its pipes: send, receive),
`cell_pass` (one pass of the cells), `notebook_run` (the report), `call_outcome` (what of a
call's answer is believed), `time_budget` (the student's budget, and its sentinel); here, the
one restart loop that ties them together.

Failure handling, all of it local to what failed:
- a cell that raises (SystemExit included) is reported and the next cell runs;
- a cell that overruns `cell_timeout` is interrupted inside the child, and the next cell runs
  (if the notebook has to run again in a fresh child, cells that timed out are skipped);
  one that cannot be interrupted (it swallows the interrupt, ignores SIGALRM or blocks in C) is
  killed with the child `grace` seconds later, and a fresh child re-runs the notebook *without*
  that cell; a cell that crashes the child (os._exit, segfault, a limit) is skipped the same way;
- a call that overruns gives `Outcome.failure("Timeout", ...)`, a call that kills the child
  gives `Outcome.failure("Crash", ...)`; the next call gets a fresh child (the notebook re-run
  without the cells that hung or crashed before), so one bad function costs one exercise.
"""
from __future__ import annotations

import threading
import time

from .. import settings as _settings
from ..shared import protocol
from ..shared.calls import Call, Outcome
from ..source.submission import ParsedSubmission
from ..sandbox.limits import Limits
from ..sandbox.modes import SandboxMode, resolve_sandbox
from ..sandbox.policy import hidden_paths
from ..sandbox.pool import SandboxPool
from . import call_frames
from .call_outcome import believed
from .cell_pass import run_cells
from .channel import Budget, Capture, Lost, LostKind
from .child_slot import ChildSlot
from .notebook_run import CellRecorder, NotebookRun
from .time_budget import BUDGET_SPENT, Spent, budget_message

__all__ = ["StudentSession", "Limits", "budget_message"]


class StudentSession:
    """One student's notebook, running in a sandboxed child process. Thread-safe per instance.

    Args:
        cells: the notebook's code cells, in order (see `autograder.source.notebook.notebook_cells`),
            or its `ParsedSubmission`.
        limits: time, memory and size limits; default the entry point's (`settings.current().limits`).
        sandbox: a `SandboxChoice` made at the entry point, or "auto", "bubblewrap", "container"
            or "none" to decide here (`resolve_sandbox`; forcing a mode that cannot work here
            raises SandboxUnavailable).
        hide: more paths the student's code must not see (results files, hidden test data), in
            the container and fallback modes; under bubblewrap the pool's own (`student_pool`).
        sandboxes: the student's `SandboxPool`, required in bubblewrap mode, used in the container
            mode where given, ignored in the fallback: made and closed by whoever grades the
            student (`sandbox.pool.student_pool`),
            shared by that student's chapters only, never made here. Its children are forked from
            a warm worker that has imported torch once, so a restart costs a fork, not an import.
        memory_capped: every child's RLIMIT_DATA is `limits.memory_case` above its start.
        mapped_heap: with memory_capped, glibc maps each large block of its own and unmaps it when
            freed (`runtime.prepare.map_large_blocks`): slower, but a freed block's hole cannot
            pin the heap (`autograder.session.memory_case`).
        preimport: with memory_capped, libraries imported before the cap is measured
            (`runtime.prepare.preimport`: those of a fixed list that the cells import).
        deadline: time.monotonic() at which the student's budget runs out.
    """

    def __init__(self, cells: list[str], limits: Limits | None = None, sandbox: str = "auto",
                 hide=(), sandboxes: SandboxPool | None = None, memory_capped: bool = False,
                 deadline: float | None = None, mapped_heap: bool = False, preimport: tuple = ()):
        self.source = ParsedSubmission.of(cells)  # (its parse, made where the trust checks need it)
        self.cells = list(self.source.cells)
        self.limits = limits or _settings.current().limits
        self.deadline = deadline
        choice = resolve_sandbox(sandbox)
        self.mode, self.note = choice.mode, choice.note
        if sandboxes is not None and sandboxes.mode != self.mode:
            sandboxes = None  # (a container session without one starts a process per child)
        if self.mode == SandboxMode.BUBBLEWRAP and sandboxes is None:
            raise ValueError("a bubblewrap session needs the student's SandboxPool, made by whoever "
                             "grades the student (sandbox.pool.student_pool)")
        self._slot = ChildSlot(self.mode, self.limits, sandboxes, hidden_paths(hide),
                               self.limits.memory_case if memory_capped else 0, memory_capped and mapped_heap,
                               preimport if memory_capped else ())
        self._lock = threading.RLock()
        self._skip: set[int] = set()  # cells that hung or crashed a child: left out from then on
        self._report: NotebookRun | None = None
        self._closed = False
        self._call_id = 0
        self._defined: list[str] = []
        self.last_output = ""   # what the last call printed (capped)

    children = property(lambda self: self._slot.children, doc="how many child processes were started")
    startup_seconds = property(lambda self: self._slot.startup_seconds,
                               doc="each child's start-up (Python + torch import)")
    box = property(lambda self: self._slot.box, doc="the warm sandbox in use (bubblewrap), or None")

    def __enter__(self) -> "StudentSession":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- public API -----------------------------------------------------------------------
    def start(self) -> NotebookRun:
        """Run the notebook's cells (once; later calls return the same `NotebookRun`)."""
        with self._lock:
            if self._report is not None:
                return self._report
            t0 = time.monotonic()
            recorder = CellRecorder(len(self.cells), Budget(self.limits.output_cap))
            error = self._run_notebook(recorder)
            if error:
                self._slot.kill()
            startup = self.startup_seconds
            self._report = NotebookRun(self.mode, self.note, error, recorder.cells(), list(self._defined),
                                       startup[0] if startup else None, time.monotonic() - t0)
            return self._report

    def run(self, call: Call, timeout: float | None = None) -> Outcome:
        """Run one Call in the child. Never raises: a hang, a crash or malformed data from the
        child becomes an Outcome with error type "Timeout" or "Crash"."""
        with self._lock:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return Outcome.failure("Timeout", budget_message(self.limits))
                timeout = min(timeout if timeout is not None else self.limits.call_timeout, left)
            try:
                return self._run(call, timeout)
            except Exception as e:  # a bug here must not stop the grading of the others
                self._slot.kill()
                return Outcome.failure("Crash", f"the grader could not run this test "
                                       f"({type(e).__name__}: {e})")

    def close(self) -> None:
        """Kill the child and every process it started; remove the session's files."""
        with self._lock:
            self._closed = True
            self._slot.close()

    # -- internals ------------------------------------------------------------------------
    def _run_notebook(self, recorder: CellRecorder | None = None) -> str | Spent | None:
        """The one restart loop: the notebook's cells in a fresh child, again without the cell
        that hung or crashed the last one, until a pass ends. None, or why not: a reason, or
        BUDGET_SPENT. The first pass (`start`, with a `recorder`) runs whatever budget is
        left, so cells it cannot reach are reported "not run"; a re-run for a call stops."""
        used = 0.0  # the notebook's time counts cells only, not the children's start-up
        for _attempt in range(len(self.cells) + 2):
            if recorder is None and self.deadline is not None and time.monotonic() >= self.deadline:
                return BUDGET_SPENT
            error = self._slot.spawn()
            if error:
                return error
            began = time.monotonic()
            end = began + max(0.0, self.limits.notebook_timeout - used)
            names = run_cells(self._slot, self.cells, self._skip, self.limits, recorder,
                              end if self.deadline is None else min(end, self.deadline))
            used += time.monotonic() - began
            if names is not None:
                self._defined = names
                return None
        return "the notebook crashed the grading process too many times"

    def _run(self, call: Call, timeout: float | None, again: bool = False) -> Outcome:
        if self._closed:
            return Outcome.failure("Crash", "the session is closed")
        report = self.start()
        if report.error:
            return Outcome.failure("Crash", f"the notebook could not be run: {report.error}")
        error = None if self._slot.alive() else self._run_notebook()
        if error is BUDGET_SPENT:
            return Outcome.failure("Timeout", budget_message(self.limits))
        if error:
            return Outcome.failure("Crash", f"the notebook could not be run again after a crash: "
                                   f"{error}")
        timeout = float(timeout if timeout is not None else self.limits.call_timeout)
        ch = self._slot.channel
        self._call_id += 1
        ch.calls += 1
        capture = ch.captures[len(self.cells) + ch.calls] = Capture(Budget(self.limits.output_cap))
        t0 = time.monotonic()
        deadline = t0 + timeout + self.limits.grace
        name = f"`{call.target}`" + (f".{call.method}" if call.method else "")
        if not ch.send(call_frames.run_call(self._call_id, call, timeout), deadline):
            event = Lost(LostKind.DEAD)
        else:
            event = ch.receive(deadline)
        match event:
            case protocol.CallDone(id=answered) if answered == self._call_id:
                outcome = believed(event, call, self.source, name)
                if outcome is None:
                    self._slot.kill()
                    outcome = Outcome.failure("Crash", f"{name} sent the grader malformed data; "
                                              "the grading process was restarted")
            case Lost(kind=LostKind.TIMEOUT):
                self._slot.kill()
                outcome = Outcome.failure(
                    "Timeout", f"{name} took longer than {timeout:g} s and could not be "
                    "interrupted, so the grader stopped it (an infinite loop?)")
            case Lost(kind=LostKind.DEAD):
                child = self._slot.child
                if child is not None:
                    child.wait(self.limits.exit_wait)  # its own exit status, not the SIGKILL of the clean-up below
                self._slot.kill()
                if not again and self._slot.died_shared():
                    return self._run(call, timeout, again=True)
                outcome = Outcome.failure(
                    "Crash", f"{name} crashed the grading process: it "
                    f"{child.exit_description() if child else 'ended'}. The next test starts a "
                    "fresh process.")
            case _:
                why = event.why if isinstance(event, Lost) else "an unexpected message"
                self._slot.kill()
                outcome = Outcome.failure("Crash", f"{name} sent the grader malformed data ({why[:200]})")
        if outcome.seconds == 0.0 and outcome.error and outcome.error.get("type") in ("Timeout", "Crash"):
            outcome.seconds = time.monotonic() - t0
        self._slot.channel.drain_output(self.limits.drain_cap)
        self.last_output = capture.text()
        return outcome

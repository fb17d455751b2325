"""The grader's side of running one student's notebook: `StudentSession`.

    with StudentSession(notebook_cells(path)) as session:
        report = session.start()            # runs the cells; per-cell status and output
        outcome = session.run(call)         # one graded Call -> Outcome, never raises

The notebook runs in a child process (see `autograder.sandbox` for the three sandbox modes);
only plain data comes back (`autograder.shared.protocol` messages in `autograder.shared.wire` frames, read
by `autograder.session.channel` and checked field by field by `autograder.session.trust`), and comparing
and scoring happen in this process alone.

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

import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from enum import Enum

from ..shared import protocol
from ..shared import wire
from ..shared.calls import Call, ErrorKind, Outcome
from .channel import Budget, Capture, Channel, poll_wait
from .trust import expected_error_credible, plain_error, traceback_in_source, validated
from ..source.submission import ParsedSubmission
from ..sandbox.processes import Child
from ..sandbox.limits import Limits
from ..sandbox.warm import SandboxDied
from ..sandbox.modes import SandboxMode, resolve_sandbox
from ..sandbox.pool import SandboxPool
from ..sandbox.policy import hidden_paths

__all__ = ["StudentSession", "Limits"]


class LostKind(Enum):
    TIMEOUT = "timeout"      # no message before the deadline
    DEAD = "dead"            # the child's result pipe closed (it ended or was killed)
    MALFORMED = "malformed"  # what it sent is not a message of the chapter channel


@dataclass
class Lost:
    """What `_next_event` gives instead of a message when the child failed to send one."""

    kind: LostKind
    why: str = ""


class StudentSession:
    """One student's notebook, running in a sandboxed child process. Thread-safe per instance.

    Args:
        cells: the notebook's code cells, in order (see `autograder.source.notebook.notebook_cells`),
            or its `ParsedSubmission`.
        limits: time, memory and size limits; default `Limits.from_env()`.
        sandbox: a `SandboxChoice` made at the entry point, or "auto", "bubblewrap", "container"
            or "none" to decide here (`resolve_sandbox`; forcing a mode that cannot work here
            raises SandboxUnavailable).
        hide: more paths the student's code must not see (results files, hidden test data).
        sandboxes: the student's `SandboxPool` (bubblewrap mode), shared by that student's
            chapters only; by default the session starts its own. Its children are forked from
            a warm worker that has imported torch once, so a restart costs a fork, not an import.
    """

    def __init__(self, cells: list[str], limits: Limits | None = None, sandbox: str = "auto",
                 hide=(), sandboxes: SandboxPool | None = None, memory_capped: bool = False,
                 deadline: float | None = None):
        self.source = ParsedSubmission.of(cells)  # (its parse, made where the trust checks need it)
        self.cells = list(self.source.cells)
        self.limits = limits or Limits.from_env()
        # memory cases: every child's RLIMIT_DATA is limits.memory_case above its start
        self._headroom = self.limits.memory_case if memory_capped else 0
        self.deadline = deadline  # time.monotonic() at which the student's budget runs out
        choice = resolve_sandbox(sandbox)
        self.mode, self.note = choice.mode, choice.note
        self._hidden = hidden_paths(hide)
        self._pool, self._own_pool, self._box = None, False, None
        if self.mode == SandboxMode.BUBBLEWRAP:
            self._own_pool = sandboxes is None
            self._pool = sandboxes or SandboxPool(self.limits, hide)
        self._lock = threading.RLock()
        self._child: Child | None = None
        self._channel: Channel | None = None
        self._skip: set[int] = set()
        self._report: dict | None = None
        self._start_error: str | None = None
        self._closed = False
        self._call_id = 0
        self._defined: list[str] = []
        self._workdir = tempfile.mkdtemp(prefix="autograder-session-")
        os.chmod(self._workdir, 0o700)
        self.last_output = ""   # what the last call printed (capped)
        self.children = 0       # how many child processes this session started
        self.startup_seconds: list[float] = []  # each child's start-up (Python + torch import)

    # -- context manager ------------------------------------------------------------------
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
    def start(self) -> dict:
        """Run the notebook's cells (once; later calls return the same report).

        Returns:
            {"sandbox": "bubblewrap"|"fallback",
             "sandbox_note": "" unless the fallback is used, else why and what it means,
             "error": None or why the notebook could not run at all,
             "cells": [{"cell": n (1-based, code cells only),
                        "status": "ok"|"error"|"timeout"|"crash"|"not run",
                        "error": None or {"type", "message", "where"},
                        "message": "" or the error in one line, "seconds": float,
                        "output": str (capped)}],
             "output": every cell's output, "[cell n]"-headed (capped),
             "defined": the notebook's top-level names at the end (none starting with "_"),
             "startup_seconds": float, "seconds": float}
        """
        with self._lock:
            if self._report is not None:
                return self._report
            t0 = time.monotonic()
            budget = Budget(self.limits.output_cap)
            report = {n: None for n in range(1, len(self.cells) + 1)}
            captures: dict[int, Capture] = {}
            error = None
            used = 0.0  # the time budget counts cells only, not the children's start-up
            for _attempt in range(len(self.cells) + 2):
                error = self._spawn()
                if error:
                    break
                began = time.monotonic()
                end = began + max(0.0, self.limits.notebook_timeout - used)
                result = self._run_cells(report, captures, budget,
                                         end if self.deadline is None else min(end, self.deadline))
                used += time.monotonic() - began
                if result == "done":
                    break
            else:
                error = "the notebook crashed the grading process too many times"
            if error:
                self._start_error = error
                self._kill()
            cells = []
            for n in range(1, len(self.cells) + 1):
                entry = report[n] or {"cell": n, "status": "not run", "error": None, "seconds": 0.0}
                entry["output"] = captures[n].text() if n in captures else ""
                entry["message"] = _cell_message(entry)
                cells.append(entry)
            output = "".join(f"[cell {c['cell']}]\n{c['output'].rstrip()}\n" for c in cells
                             if c["output"].strip())
            self._report = {
                "sandbox": self.mode, "sandbox_note": self.note, "error": error, "cells": cells,
                "defined": list(self._defined), "output": output,
                "startup_seconds": self.startup_seconds[0] if self.startup_seconds else None,
                "seconds": time.monotonic() - t0,
            }
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
                self._kill()
                return Outcome.failure("Crash", f"the grader could not run this test "
                                       f"({type(e).__name__}: {e})")

    def close(self) -> None:
        """Kill the child and every process it started; remove the session's files."""
        with self._lock:
            self._closed = True
            self._kill()
            if self._box is not None:
                self._pool.release(self._box)
                self._box = None
            if self._own_pool and self._pool is not None:
                self._pool.close()
            if self._workdir:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None

    # -- internals ------------------------------------------------------------------------
    def _spawn(self) -> str | None:
        """Start a child and wait until it is ready; None on success, else why not."""
        self._kill()
        last = ""
        for _ in range(2):  # one retry: a start-up failure is not the student's doing
            t0 = time.monotonic()
            try:
                child = self._launch(t0 + self.limits.startup_timeout)
            except OSError as e:
                last = f"the grading process could not be started ({e})"
                continue
            if isinstance(child, str):
                last = child
                continue
            channel = Channel(child, self.limits.result_cap)
            startup = Capture(Budget(4096))
            channel.captures[0] = startup
            self._child, self._channel = child, channel
            self.children += 1
            event = self._next_event(t0 + self.limits.startup_timeout)
            if isinstance(event, protocol.ChildReady):
                self.startup_seconds.append(time.monotonic() - t0)
                return None
            self._kill()
            channel.flush_output()
            detail = startup.text().strip().splitlines()[-3:]
            timed_out = isinstance(event, Lost) and event.kind == LostKind.TIMEOUT
            why = ("did not start within %g s" % self.limits.startup_timeout
                   if timed_out else child.exit_description())
            last = f"the grading process {why}" + (": " + " | ".join(detail) if detail else "")
        return last

    def _launch(self, deadline: float):
        """A new child (bubblewrap: forked from the student's warm sandbox; fallback: a new
        process), or why the sandbox could not start."""
        token = secrets.token_hex(16)
        if self._pool is None:
            return Child(self.mode, self.limits, self._hidden, self._workdir or "/", token, self._headroom)
        if self._box is not None and not self._box.alive():
            self._pool.release(self._box)  # killed by what the student did: start a new one
            self._box = None
        if self._box is None:
            self._box = self._pool.acquire()
        why = self._box.wait_ready(deadline)
        if why:
            self._pool.release(self._box)
            self._box = None
            return why
        try:
            return self._box.fork(token, self._headroom)
        except SandboxDied as e:
            self._pool.release(self._box)
            self._box = None
            return f"the grading process could not be started ({e})"

    def _kill(self) -> None:
        if self._child is not None:
            self._child.kill()
            if self._channel is not None:
                self._channel.drain_output(self.limits.drain_cap)
                self._channel.flush_output()
        self._child = None

    def _next_event(self, deadline: float):
        """The child's next message (a `protocol` dataclass), or a `Lost`."""
        ch = self._channel
        while True:
            try:
                message = ch.next_message()
            except (wire.WireError, ValueError) as e:  # ProtocolError is a ValueError
                return Lost(LostKind.MALFORMED, str(e))
            if message is not None:
                return message
            if ch.results_eof:
                ch.drain_output(self.limits.drain_cap)
                self._child.wait(self.limits.exit_wait)
                return Lost(LostKind.DEAD)
            if time.monotonic() >= deadline:
                return Lost(LostKind.TIMEOUT)
            ready = {fd for fd, _ in poll_wait(ch, deadline)}
            if self._child.out_fd in ready:
                ch.drain_output(self.limits.drain_cap)
            if self._child.res_fd in ready:
                try:
                    ch.read_results()
                except wire.WireError as e:
                    return Lost(LostKind.MALFORMED, str(e))

    def _send(self, message, deadline: float) -> bool:
        """Write one message to the child; False if it died or would not read in time."""
        view = memoryview(wire.encode(protocol.plain(message)))
        ch = self._channel
        while view:
            try:
                n = os.write(self._child.req_fd, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            except OSError:
                return False
            if time.monotonic() >= deadline:
                return False
            ready = {fd for fd, _ in poll_wait(ch, deadline, write=view)}
            if self._child.out_fd in ready:
                ch.drain_output(self.limits.drain_cap)
            if self._child.res_fd in ready:
                try:
                    ch.read_results()
                except wire.WireError:
                    return False
                if ch.results_eof:
                    return False
        return True

    def _run_cells(self, report: dict | None, captures: dict, budget: Budget | None,
                   end: float) -> str:
        """Run the notebook in the current child: "done", or "restart" after the child hung or
        died (the culprit cell is added to the skip set)."""
        limits = self.limits
        ch = self._channel
        numbers = list(range(1, len(self.cells) + 1))
        if report is not None:
            for n in numbers:
                if report[n] is None:
                    captures[n] = ch.captures[n] = Capture(budget)
        left = max(0.0, end - time.monotonic())
        if not self._send(protocol.RunCells(self.cells, sorted(self._skip), limits.cell_timeout, left),
                          time.monotonic() + limits.send_timeout):
            self._kill()  # died before it could read the cells: no cell is to blame
            return "restart"
        expected = 1
        while True:
            running = expected if expected <= len(self.cells) else None
            per_cell = min(limits.cell_timeout, max(0.0, end - time.monotonic()))
            event = self._next_event(time.monotonic() + per_cell + limits.grace)
            match event:
                case protocol.CellDone(cell=number) if number == expected:
                    if report is not None and report[expected] is None:
                        report[expected] = self._cell_entry(event, expected)
                    if event.status == "timeout":
                        self._skip.add(expected)  # a cell that hung costs its time only once
                    expected += 1
                case protocol.CellsDone(defined=names) if running is None:
                    self._defined = sorted({n for n in names if isinstance(n, str)})
                    return "done"
                case Lost():
                    return self._lost(report, running, event)
                case _:
                    return self._lost(report, running, Lost(
                        LostKind.MALFORMED, f"unexpected message {type(event).__name__}"))

    def _lost(self, report, running, event: Lost) -> str:
        """The child hung, died or sent garbage while running cell `running`."""
        timed_out = event.kind == LostKind.TIMEOUT
        if event.kind == LostKind.MALFORMED:
            self._kill()
            message = ("sent the grader malformed data (" + event.why[:200] + ")")
        elif timed_out:
            self._kill()
            message = (f"ran longer than {self.limits.cell_timeout:g} s and could not be "
                       "interrupted, so the grader stopped it")
        else:
            child = self._child
            if child is not None:
                child.wait(self.limits.exit_wait)
            self._kill()
            if self._sandbox_died_shared():
                return "restart"  # no cell to blame: the cells run again, in a sandbox of their own
            message = "crashed the grading process: it " + (
                child.exit_description() if child else "ended")
        culprit = running if running is not None else max(
            [n for n in range(1, len(self.cells) + 1) if n not in self._skip] or [0])
        if culprit:
            self._skip.add(culprit)
            if report is not None and report.get(culprit) is None:
                report[culprit] = {"cell": culprit,
                                   "status": "timeout" if timed_out else "crash",
                                   "error": {"type": "Timeout" if timed_out else "Crash",
                                             "message": f"this cell {message}. The cells after it "
                                             "ran in a fresh process without it.",
                                             "where": f"<cell {culprit}>"},
                                   "seconds": 0.0}
        return "restart"

    @staticmethod
    def _cell_entry(event: protocol.CellDone, number: int) -> dict:
        status = event.status
        if status not in ("ok", "error", "timeout", "skipped", "not run"):
            status = "error"
        return {"cell": number, "status": status, "error": plain_error(event.error),
                "seconds": float(event.seconds)}

    def _ensure_child(self) -> str | None:
        """A live child that has run the notebook (minus skipped cells); None or why not."""
        if self._child is not None and self._child.alive() and not self._channel.results_eof:
            return None
        used = 0.0
        for _attempt in range(len(self.cells) + 2):
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return budget_message(self.limits)
            error = self._spawn()
            if error:
                return error
            began = time.monotonic()
            end = began + max(0.0, self.limits.notebook_timeout - used)
            done = self._run_cells(None, {}, None, end if self.deadline is None else min(end, self.deadline))
            used += time.monotonic() - began
            if done == "done":
                return None
        return "the notebook crashed the grading process too many times"

    def _sandbox_died_shared(self) -> bool:
        """Whether the child died with its sandbox while another chapter was in it too: either
        may have killed it, so what was running is run again, once (see `SandboxPool`)."""
        return self._box is not None and self._box.died_shared and self._box.dead

    def _believed(self, event: protocol.CallDone, call: Call, name: str) -> Outcome:
        """What the child says a call returned, as far as the grader believes it: checked field
        by field (`validated`), its error's traceback against the notebook's source, and an
        expected error's kind only where the notebook's own raise says so."""
        outcome = validated(event.outcome)
        if outcome is None:
            self._kill()
            return Outcome.failure("Crash", f"{name} sent the grader malformed data; "
                                   "the grading process was restarted")
        if not traceback_in_source(outcome.error, self.cells):
            return Outcome.failure("Crash", f"{name} reported an error whose traceback does not "
                                   "match the notebook's code")
        if call.expect_error and outcome.error and ErrorKind.of(outcome.error) is None and \
                not expected_error_credible(outcome.error, call.expect_error, self.source, call.target):
            # the child's claim of the error is not believed: its kind is what the
            # notebook's own raise statement says, nothing more
            outcome.error["mro"] = [outcome.error.get("type", "")]
            if call.expect_error in outcome.error["mro"]:
                outcome.error["where"] = ""  # a claim without a raise in the notebook
        return outcome

    def _run(self, call: Call, timeout: float | None, again: bool = False) -> Outcome:
        if self._closed:
            return Outcome.failure("Crash", "the session is closed")
        if self._report is None:
            self.start()
        if self._start_error:
            return Outcome.failure("Crash", f"the notebook could not be run: {self._start_error}")
        error = self._ensure_child()
        if error:
            if error == budget_message(self.limits):
                return Outcome.failure("Timeout", error)
            return Outcome.failure("Crash", f"the notebook could not be run again after a crash: "
                                   f"{error}")
        timeout = float(timeout if timeout is not None else self.limits.call_timeout)
        ch = self._channel
        self._call_id += 1
        ch.calls += 1
        capture = ch.captures[len(self.cells) + ch.calls] = Capture(Budget(self.limits.output_cap))
        t0 = time.monotonic()
        deadline = t0 + timeout + self.limits.grace
        name = f"`{call.target}`" + (f".{call.method}" if call.method else "")
        if not self._send(protocol.RunCall(self._call_id, call.to_wire(), timeout), deadline):
            event = Lost(LostKind.DEAD)
        else:
            event = self._next_event(deadline)
        match event:
            case protocol.CallDone(id=answered) if answered == self._call_id:
                outcome = self._believed(event, call, name)
            case Lost(kind=LostKind.TIMEOUT):
                self._kill()
                outcome = Outcome.failure(
                    "Timeout", f"{name} took longer than {timeout:g} s and could not be "
                    "interrupted, so the grader stopped it (an infinite loop?)")
            case Lost(kind=LostKind.DEAD):
                child = self._child
                if child is not None:
                    child.wait(self.limits.exit_wait)  # its own exit status, not the SIGKILL of the clean-up below
                self._kill()
                if not again and self._sandbox_died_shared():
                    return self._run(call, timeout, again=True)
                outcome = Outcome.failure(
                    "Crash", f"{name} crashed the grading process: it "
                    f"{child.exit_description() if child else 'ended'}. The next test starts a "
                    "fresh process.")
            case _:
                why = event.why if isinstance(event, Lost) else "an unexpected message"
                self._kill()
                outcome = Outcome.failure("Crash", f"{name} sent the grader malformed data ({why[:200]})")
        if outcome.seconds == 0.0 and outcome.error and outcome.error.get("type") in ("Timeout", "Crash"):
            outcome.seconds = time.monotonic() - t0
        if self._channel is not None:
            self._channel.drain_output(self.limits.drain_cap)
        self.last_output = capture.text()
        return outcome


def budget_message(limits: Limits) -> str:
    return (f"not graded: this student's time budget ({limits.student_budget:g} s of grading for the whole "
            "submission, AUTOGRADER_STUDENT_BUDGET) ran out")


def _cell_message(entry: dict) -> str:
    err = entry.get("error")
    if entry["status"] == "not run":
        return "not run: the notebook's time budget ran out before this cell"
    if not err:
        return ""
    where = f" ({err['where'].splitlines()[-1]})" if err.get("where") and \
        err["where"] != f"<cell {entry['cell']}>" else ""
    if err.get("type") in ("Timeout", "Crash"):
        return err.get("message", "") + where
    return f"{err.get('type')}: {err.get('message', '')}{where}"

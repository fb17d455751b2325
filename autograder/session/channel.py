"""The grader's end of one child's pipes: messages sent and received, output split per cell and
per call, both capped.

`Channel.send` writes a `protocol` message; `Channel.receive` gives the child's next one, or a
`Lost` saying why none came. Output is split by the separator the child writes after each
cell and call."""
from __future__ import annotations

import os
import select
import time
from dataclasses import dataclass
from enum import Enum

from ..shared import protocol
from ..shared import wire
from ..sandbox.limits import Limits
from ..sandbox.processes import Child

# Caps on a child's frames (the student's process writes them: hostile input). Honest ones are
# small: over every chapter's solutions, at most 6.7 KB of header and 810 JSON values, 7 deep.
RESULT_HEADER = 16 << 20
RESULT_NODES = 1 << 18


class LostKind(Enum):
    TIMEOUT = "timeout"      # no message before the deadline
    DEAD = "dead"            # the child's result pipe closed (it ended or was killed)
    MALFORMED = "malformed"  # what it sent is not a message of the chapter channel


@dataclass
class Lost:
    """What `Channel.receive` gives instead of a message when the child failed to send one."""

    kind: LostKind
    why: str = ""


class Budget:
    def __init__(self, cap: int):
        self.left = cap


class Capture:
    """Output of one cell or call: the first bytes the budget allows, and a count of the rest."""

    def __init__(self, budget: Budget):
        self.budget, self.kept, self.dropped = budget, bytearray(), 0

    def add(self, data: bytes) -> None:
        room = max(0, min(len(data), self.budget.left))
        self.kept += data[:room]
        self.budget.left -= room
        self.dropped += len(data) - room

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... {self.dropped} more bytes of output not shown]"
        return text


class Channel:
    """The parent's view of one child: frames from the result pipe, output split by separator."""

    def __init__(self, child: Child, limits: Limits):
        self.child = child
        self.limits = limits
        self.result_cap = min(limits.result_cap, wire.MAX_PAYLOAD)
        self.results = wire.FrameReader(min(RESULT_HEADER, self.result_cap), self.result_cap, RESULT_NODES)
        self.results_eof = False
        self.output_eof = False
        self.separator = b"\0" + child.token.encode() + b"\0"
        self.pending = bytearray()  # output not yet attributed (may end in half a separator)
        self.segment = 0            # how many separators have been seen
        self.captures: dict[int, Capture] = {}
        self.calls = 0              # segments used by calls so far

    # -- output ---------------------------------------------------------------------------
    def _deliver(self, data: bytes) -> None:
        capture = self.captures.get(self.segment)
        if capture is not None and data:
            capture.add(data)

    def feed_output(self, data: bytes) -> None:
        self.pending += data
        while True:
            i = self.pending.find(self.separator)
            if i < 0:
                break
            self._deliver(bytes(self.pending[:i]))
            del self.pending[: i + len(self.separator)]
            self.segment += 1
        keep = len(self.separator) - 1
        if len(self.pending) > keep:
            self._deliver(bytes(self.pending[:-keep]))
            del self.pending[:-keep]

    def flush_output(self) -> None:
        self._deliver(bytes(self.pending))
        self.pending.clear()

    def drain_output(self, limit: int) -> None:
        got = 0
        while not self.output_eof and got < limit:
            data = _read(self.child.out_fd, 1 << 16)
            if data is None:
                return
            if not data:
                self.output_eof = True
                self.flush_output()
                return
            got += len(data)
            self.feed_output(data)

    # -- results --------------------------------------------------------------------------
    def read_results(self) -> None:
        while not self.results_eof:
            data = _read(self.child.res_fd, 1 << 20)
            if data is None:
                return
            if not data:
                self.results_eof = True
                return
            self.results.feed(data)
            if len(self.results.buf) > self.result_cap + (1 << 20):
                raise wire.WireError("the child sent more data than the result size limit")

    def next_message(self):
        """The child's next message (a `protocol` dataclass); None while none is complete.
        WireError or ProtocolError if what came is malformed, never another exception: the
        session makes either a crash of what the child was doing, not a grader error."""
        frame = self.results.pop()
        if frame is None:
            return None
        data = wire.decode(frame, self.results.max_nodes)
        try:
            return protocol.from_plain(data)
        except protocol.ProtocolError:
            raise
        except Exception as e:  # (a field the checks themselves trip on: {"kind": []})
            raise protocol.ProtocolError(f"not a message ({type(e).__name__})") from None


    # -- the one poll loop: sending and receiving ---------------------------------------------
    def send(self, message, deadline: float) -> bool:
        """Write one message (or its frame, bytes) to the child; False if it died or would not
        read in time."""
        view = memoryview(message if isinstance(message, bytes) else wire.encode(protocol.plain(message)))
        while view:
            try:
                view = view[os.write(self.child.req_fd, view):]
                continue
            except BlockingIOError:
                pass
            except OSError:
                return False
            if time.monotonic() >= deadline:
                return False
            read = self._take_in(deadline, writing=view)
            if isinstance(read, Lost) or (read and self.results_eof):
                return False
        return True

    def receive(self, deadline: float):
        """The child's next message (a `protocol` dataclass), or a `Lost`."""
        while True:
            try:
                message = self.next_message()
            except (wire.WireError, ValueError) as e:  # ProtocolError is a ValueError
                return Lost(LostKind.MALFORMED, str(e))
            if message is not None:
                return message
            if self.results_eof:
                self.drain_output(self.limits.drain_cap)
                self.child.wait(self.limits.exit_wait)
                return Lost(LostKind.DEAD)
            if time.monotonic() >= deadline:
                return Lost(LostKind.TIMEOUT)
            read = self._take_in(deadline)
            if isinstance(read, Lost):
                return read

    def _take_in(self, deadline: float, writing: memoryview | None = None) -> "bool | Lost":
        """Wait for the pipes (or the deadline) and take in what came: output into its capture,
        result bytes into the frame reader. Whether the result pipe was read; a Lost if what
        came there is malformed."""
        ready = {fd for fd, _ in poll_wait(self, deadline, write=writing)}
        if self.child.out_fd in ready:
            self.drain_output(self.limits.drain_cap)
        if self.child.res_fd not in ready:
            return False
        try:
            self.read_results()
        except wire.WireError as e:
            return Lost(LostKind.MALFORMED, str(e))
        return True


def _read(fd: int, size: int) -> bytes | None:
    """What a non-blocking pipe holds: None if nothing yet, b"" at its end (or when broken)."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def poll_wait(channel: Channel, deadline: float, write: memoryview | None = None):
    """Wait until something happens on the child's pipes or the deadline passes."""
    poller = select.poll()
    if not channel.results_eof:
        poller.register(channel.child.res_fd, select.POLLIN)
    if not channel.output_eof:
        poller.register(channel.child.out_fd, select.POLLIN)
    if write is not None:
        poller.register(channel.child.req_fd, select.POLLOUT)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return []
    return poller.poll(max(1, int(remaining * 1000)))

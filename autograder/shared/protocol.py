"""Every message between the grader and the processes that run a student's code, as dataclasses.

Two channels, each with its own set of kinds; `encode`/`decode` (control) and `plain`/
`from_plain` (chapter) check every field of what comes in, and anything else is a
ProtocolError.

The control channel, between the grader and a student's warm worker (one per sandbox).

The warm worker (`autograder.runtime.warm`) starts inside the student's sandbox, imports torch
and the runtime once, and then forks one fresh child per chapter notebook on request; it never
runs student code itself. Messages travel over a SOCK_SEQPACKET socket pair: one datagram per
message, JSON, with the chapter child's three pipe ends attached (SCM_RIGHTS) to `Fork`.

    grader -> warm  Fork(token, config) + [requests read end, results write end, output write end]
    warm   -> grader Forked(pid)            the chapter child runs `worker.serve` on those pipes
    grader -> warm  Kill(pid)               the child, its descendants and its process group
    warm   -> grader Exited(pid, returncode) whenever a chapter child ends (Popen's convention)
    grader -> warm  Reset()                 between two chapters: every other process is killed
    warm   -> grader ResetDone()             and /tmp is emptied
    warm   -> grader Ready(pid, uid, seconds) once, after its imports

The zygote channel, between a batch worker and its zygote (`autograder.runtime.zygote`): one
sandbox per batch worker that imports torch once and starts each student's warm worker by
forking it into namespaces of its own (see `autograder.sandbox.warm.Zygote`). Same encoding.

    zygote -> grader Ready(pid, uid, seconds) once, after its imports
    grader -> zygote Spawn(token, config) + [control socket end, output write end]
    zygote -> grader Spawned(token, pid)      the student's warm worker starts on that socket
    grader -> zygote KillBox(token)           that student's sandbox and everything in it
    zygote -> grader BoxEnded(token, returncode) whenever a student's sandbox ends (boxes are
                                              named by token: a pid may be used again)

A batch's first zygote also listens on a socket that only root can reach (a folder of the
command's, mode 0700): each batch worker connects and sends

    worker -> zygote Clone(token) + [control socket end, output write end]

and gets a zygote of its own, forked from that one (torch imported already), serving that
control socket as above: one sandbox and one torch import for the whole batch.

The chapter channel, between the grader and one chapter's child (`autograder.runtime.child.serve`):
`wire` frames over pipes (outcomes carry tensors), each a dict {"kind": ..., fields}.

    child  -> grader ChildReady(pid, uid, seconds)          once, before any student code
    grader -> child  RunCells(cells, skip, timeout, budget) the notebook's code cells; `skip`:
                                                            cell numbers not to run; `budget`:
                                                            seconds for all cells together
    child  -> grader CellDone(cell, status, error, seconds) one per cell, numbered from 1;
                                                            status "ok", "error", "timeout",
                                                            "skipped" or "not run"
    child  -> grader CellsDone(defined)                     the notebook's top-level names
    grader -> child  RunCall(id, call, timeout)             one graded Call, as Call.to_wire()
    child  -> grader CallDone(id, outcome)                  its Outcome.to_plain()

Kept free of torch (the grader imports it before torch).
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass, fields

MAX_MESSAGE = 64 << 10  # a control message is a few hundred bytes; the config is the largest
MAX_FDS = 3


class ProtocolError(ValueError):
    """A control message that is not one of the kinds below, or malformed."""


@dataclass
class Ready:
    pid: int
    uid: int
    seconds: float


@dataclass
class Fork:
    token: str
    config: dict


@dataclass
class Forked:
    pid: int


@dataclass
class Kill:
    pid: int


@dataclass
class Exited:
    pid: int
    returncode: int


@dataclass
class Reset:
    pass


@dataclass
class ResetDone:
    pass


@dataclass
class Spawn:
    token: str
    config: dict


@dataclass
class Spawned:
    token: str
    pid: int


@dataclass
class KillBox:
    token: str


@dataclass
class BoxEnded:
    token: str
    returncode: int


@dataclass
class Clone:
    token: str


KINDS = {cls.__name__: cls for cls in (Ready, Fork, Forked, Kill, Exited, Reset, ResetDone,
                                       Spawn, Spawned, KillBox, BoxEnded, Clone)}


# ------------------------------------------------------------------ the chapter channel

@dataclass
class ChildReady:
    pid: int
    uid: int
    seconds: float


@dataclass
class RunCells:
    cells: list
    skip: list
    timeout: float
    budget: float


@dataclass
class CellDone:
    cell: int
    status: str
    error: dict | None
    seconds: float


@dataclass
class CellsDone:
    defined: list


@dataclass
class RunCall:
    id: int
    call: dict
    timeout: float


@dataclass
class CallDone:
    id: int
    outcome: dict


CHAPTER_KINDS = {cls.__name__: cls for cls in (ChildReady, RunCells, CellDone, CellsDone, RunCall,
                                               CallDone)}
_TYPES = {"int": int, "float": (int, float), "str": str, "dict": dict, "list": list,
          "dict | None": (dict, type(None))}


def plain(message) -> dict:
    """A message as a dict for `wire` (fields as they are: tensors are not copied)."""
    return {"kind": type(message).__name__, **{f.name: getattr(message, f.name) for f in fields(message)}}


def from_plain(data, kinds: dict = CHAPTER_KINDS):
    """The message `data` holds, checked field by field; ProtocolError if it is not one."""
    if not isinstance(data, dict):
        raise ProtocolError("not a message")
    data = dict(data)
    cls = kinds.get(data.pop("kind", None))
    if cls is None:
        raise ProtocolError("unknown message kind")
    names = {f.name: f for f in fields(cls)}
    if set(data) != set(names):
        raise ProtocolError(f"{cls.__name__}: fields {sorted(data)} (expected {sorted(names)})")
    for name, f in names.items():
        if not isinstance(data[name], _TYPES[f.type]) or isinstance(data[name], bool):
            raise ProtocolError(f"{cls.__name__}.{name}: expected {f.type}")
    return cls(**data)


# ------------------------------------------------------------------ control: encoding

def encode(message) -> bytes:
    return json.dumps(plain(message)).encode()


def decode(data: bytes):
    """The control message in `data`, checked field by field; ProtocolError if it is not one."""
    try:
        message = json.loads(data)
    except ValueError as e:
        raise ProtocolError(f"not JSON ({e})") from None
    return from_plain(message, KINDS)


def send(sock: socket.socket, message, fds=()) -> None:
    data = encode(message)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def receive(sock: socket.socket):
    """(message, fds), or (None, []) at end of stream. ProtocolError if malformed (the fds
    that came with it are closed)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        _close(fds)
        return None, []
    try:
        return decode(data), fds
    except ProtocolError:
        _close(fds)
        raise


def _close(fds) -> None:
    import os

    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass

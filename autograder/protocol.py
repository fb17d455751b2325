"""The control channel between the grader and a student's warm worker (one per sandbox).

The warm worker (`autograder.worker.warm`) starts inside the student's sandbox, imports torch
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

The chapter child itself speaks the per-chapter protocol described in `autograder.worker`.
Kept free of torch (the grader imports it before torch).
"""
from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass, fields

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


KINDS = {cls.__name__: cls for cls in (Ready, Fork, Forked, Kill, Exited, Reset, ResetDone)}
_TYPES = {"int": int, "float": (int, float), "str": str, "dict": dict}


def encode(message) -> bytes:
    return json.dumps({"kind": type(message).__name__, **asdict(message)}).encode()


def decode(data: bytes):
    """The message in `data`, checked field by field; ProtocolError if it is not one."""
    try:
        plain = json.loads(data)
    except ValueError as e:
        raise ProtocolError(f"not JSON ({e})") from None
    cls = KINDS.get(plain.pop("kind", None)) if isinstance(plain, dict) else None
    if cls is None:
        raise ProtocolError("unknown message kind")
    names = {f.name: f for f in fields(cls)}
    if set(plain) != set(names):
        raise ProtocolError(f"{cls.__name__}: fields {sorted(plain)} (expected {sorted(names)})")
    for name, f in names.items():
        if not isinstance(plain[name], _TYPES[f.type]) or isinstance(plain[name], bool):
            raise ProtocolError(f"{cls.__name__}.{name}: expected {f.type}")
    return cls(**plain)


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

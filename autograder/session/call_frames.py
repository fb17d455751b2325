"""A graded call's frame for the child, its inputs encoded once per grading process.

Every student's child is sent the same inputs: a case's `init`, `state`, `args` and `kwargs`
are the same objects for every student a process grades, and for the device check's run of the
case (`Call.on` shares them; the grader never changes them: the reference runs on copies).
Encoding them again for each call (each tensor's bytes copied out) was about a seventh of a
batch worker's CPU. Here they are encoded once, kept while those objects are (an entry holds
them, so no other object can take their ids), and each RunCall frame is built around them.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from ..shared import wire
from ..shared.calls import Call

INPUTS = ("init", "state", "args", "kwargs")  # the fields that carry tensors
MAX_BYTES = 64 << 20  # of encoded inputs kept (a whole course's cases take about 6 MB)

_LOCK = threading.Lock()
_KEPT: OrderedDict[tuple, tuple] = OrderedDict()  # ids -> (objects, header, payload), least recent first
_kept_bytes = 0


def run_call(call_id: int, call: Call, timeout: float) -> bytes:
    """The frame of `protocol.RunCall(call_id, call.to_wire(), timeout)`: the same message,
    decoded, as `wire.encode` makes of it."""
    fields = call.to_wire()
    objects = tuple(fields.pop(name) for name in INPUTS)
    header, payload = _inputs(objects)
    rest, extra = wire.parts({"kind": "RunCall", "id": call_id, "timeout": timeout, "call": fields})
    if extra:  # (a tensor outside the inputs: no call the grader makes has one)
        return wire.encode({"kind": "RunCall", "id": call_id, "timeout": timeout,
                            "call": call.to_wire()})
    # `rest` ends with the call's and the message's closing braces; the inputs go before them
    # (their tensors' offsets start at 0: the payload is theirs alone).
    return wire.frame(rest[:-2] + b", " + header + b"}}", payload)


def _inputs(objects: tuple) -> tuple[bytes, bytes]:
    """The inputs' header entries ('"init": ..., "kwargs": {...}', no braces) and payload."""
    global _kept_bytes
    key = tuple(map(id, objects))
    with _LOCK:
        kept = _KEPT.get(key)
        if kept is not None and all(a is b for a, b in zip(kept[0], objects)):
            _KEPT.move_to_end(key)
            return kept[1], kept[2]
    header, payload = wire.parts(dict(zip(INPUTS, objects)))
    header = header[1:-1]
    size = len(header) + len(payload)
    with _LOCK:
        if key not in _KEPT and size <= MAX_BYTES:
            _KEPT[key] = (objects, header, payload)
            _kept_bytes += size
            while _kept_bytes > MAX_BYTES:
                _, (_, h, p) = _KEPT.popitem(last=False)
                _kept_bytes -= len(h) + len(p)
    return header, payload


def forget() -> None:
    """Drop every kept encoding (tests)."""
    global _kept_bytes
    with _LOCK:
        _KEPT.clear()
        _kept_bytes = 0

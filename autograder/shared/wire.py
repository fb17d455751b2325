"""A data format that cannot execute code: JSON for structure, raw bytes for tensors.

Used for everything that crosses from the student's process to the grader (never pickle), and
for the self-check fixtures. Decoding builds fresh, plain CPU tensors from bytes, so nothing the
student's process sends (a tensor subclass, an object with a lying __eq__) survives the trip.

Frame layout: b"AGW1", 8-byte big-endian header length, UTF-8 JSON header, 8-byte payload
length, payload (the tensors' bytes, concatenated). In the header a tensor is
{"__tensor__": [dtype, shape, offset, nbytes]}.

Decoding is bounded, since a frame may be hostile: the tensors' byte ranges tile the payload
exactly (no range named twice, so each byte is copied once), and the header's size, number of
values, nesting and numbers are capped, checked before json.loads. It costs about the frame's
size again in memory; anything malformed is a WireError, never another exception.
"""
from __future__ import annotations

import json
import os
import re
import struct
from typing import Any

import torch

MAGIC = b"AGW1"
MAX_HEADER = 64 << 20
MAX_PAYLOAD = 1 << 30
# JSON values (keys included) and nesting of a header: every frame the grader writes is far
# below (the reference snapshot of every chapter: 73 000 values with the CPU and meta devices,
# about 125 000 with CUDA; depth 11; a child's outcome: under 1 000, depth 7), and json.loads of
# a 64-deep header cannot exhaust the stack.
MAX_NODES = 1 << 20
MAX_DEPTH = 64
MAX_DIMS = 64  # torch's own limit on a tensor's dimensions
# Digits in a row in a header's number: an int64 has 19, json.dumps writes a float with 20 at
# most (0.00012345678901234567); a much longer number could only make whoever reads it overflow
# (float(10**400) raises OverflowError).
MAX_DIGITS = 32

DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}


class WireError(ValueError):
    """Malformed or oversized data from the other side."""


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach()
    with torch._C.DisableTorchFunctionSubclass():
        t = torch.Tensor.as_subclass(t, torch.Tensor).to("cpu").contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy().tobytes()


def encode(obj: Any) -> bytes:
    """Encode nested dicts/lists/tuples of plain values and tensors into one frame."""
    return frame(*parts(obj))


def frame(header: bytes, payload: bytes) -> bytes:
    """The frame of a JSON header and its payload (`parts`)."""
    return MAGIC + struct.pack(">Q", len(header)) + header + struct.pack(">Q", len(payload)) + payload


def parts(obj: Any) -> tuple[bytes, bytes]:
    """`obj`'s header (UTF-8 JSON, tensors as {"__tensor__": [dtype, shape, offset, nbytes]})
    and payload: what `frame` joins. For a caller that reuses a part encoded once, whose
    tensors' offsets start at 0 (`session.call_frames`)."""
    chunks: list[bytes] = []
    offset = 0

    def walk(x):
        nonlocal offset
        if isinstance(x, torch.Tensor):
            dtype = str(x.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise WireError(f"unsupported tensor dtype {x.dtype}")
            if x.device.type == "meta":
                raise WireError("meta tensors carry no data")
            data = _tensor_bytes(x)
            entry = {"__tensor__": [dtype, list(x.shape), offset, len(data)]}
            chunks.append(data)
            offset += len(data)
            return entry
        if isinstance(x, dict):
            out = {}
            for k, v in x.items():
                if not isinstance(k, str):
                    raise WireError("dict keys must be strings")
                out[k] = walk(v)
            return out
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        if isinstance(x, int) and not isinstance(x, bool) and len(str(abs(x))) > MAX_DIGITS:
            raise WireError(f"integer too large for the wire format ({MAX_DIGITS} digits at most)")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise WireError(f"cannot encode {type(x).__name__}")

    header = json.dumps(walk(obj), allow_nan=True).encode()
    return header, b"".join(chunks)


def frame_length(buf, max_header: int = MAX_HEADER, max_payload: int = MAX_PAYLOAD) -> int | None:
    """The length of the complete frame at the start of `buf`, or None while it is incomplete;
    WireError as soon as it is malformed or over the limits."""
    if len(buf) < 12:
        if buf and not MAGIC.startswith(bytes(buf[:4])):
            raise WireError("bad frame magic")
        return None
    if bytes(buf[:4]) != MAGIC:
        raise WireError("bad frame magic")
    (hlen,) = struct.unpack_from(">Q", buf, 4)
    if hlen > max_header:
        raise WireError(f"header too large ({hlen} bytes)")
    if len(buf) < 20 + hlen:
        return None
    (plen,) = struct.unpack_from(">Q", buf, 12 + hlen)
    if plen > max_payload:
        raise WireError(f"payload too large ({plen} bytes)")
    end = 20 + hlen + plen
    return end if len(buf) >= end else None


class FrameReader:
    """Frames out of a byte stream that arrives in pieces: the one reader of both sides (the
    grader feeds it from a non-blocking pipe, the child reads its request pipe with `read`).

        reader.feed(data); frame = reader.pop()   # None until a whole frame is in
    """

    def __init__(self, max_header: int = MAX_HEADER, max_payload: int = MAX_PAYLOAD,
                 max_nodes: int = MAX_NODES):
        self.buf = bytearray()
        self.max_header, self.max_payload, self.max_nodes = max_header, max_payload, max_nodes

    def feed(self, data: bytes) -> None:
        self.buf += data

    def pop(self) -> bytearray | None:
        """The next complete frame's bytes (removed from the buffer), or None; WireError if
        what is buffered is malformed or over the limits. A frame that is the whole buffer
        (the usual case) is handed over as it is, not copied."""
        end = frame_length(self.buf, self.max_header, self.max_payload)
        if end is None:
            return None
        if end == len(self.buf):
            frame, self.buf = self.buf, bytearray()
            return frame
        frame = self.buf[:end]
        del self.buf[:end]
        return frame

    def read(self, fd: int) -> Any:
        """The next frame from the blocking file descriptor `fd`, decoded; EOFError when the
        stream ends first."""
        while True:
            frame = self.pop()
            if frame is not None:
                return decode(frame, self.max_nodes)
            data = os.read(fd, 1 << 20)
            if not data:
                raise EOFError("stream closed")
            self.feed(data)


def decode(frame, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Any:
    """Decode one whole frame (bytes or bytearray). Anything malformed, over the limits or
    hostile is a WireError, never another exception: the frame may come from student code."""
    try:
        if frame_length(frame) != len(frame):
            raise WireError("not one whole frame")
        (hlen,) = struct.unpack_from(">Q", frame, 4)
        view = memoryview(frame)  # (slices of a view copy nothing)
        payload = view[20 + hlen:]
        try:
            return _decode(bytes(view[12: 12 + hlen]), payload, max_nodes, max_depth)
        finally:  # (so nothing left of the decoding keeps the frame's memory alive)
            payload.release()
            view.release()
    except WireError:
        raise
    except Exception as e:  # RecursionError, MemoryError, ...: still only a bad frame
        raise WireError(f"undecodable frame ({type(e).__name__})") from None


_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)  # a JSON string literal
_LONG_NUMBER = re.compile(rb"[0-9]{%d}" % (MAX_DIGITS + 1))
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def _check_header(header: bytes, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> None:
    """WireError if the JSON `header` holds more than `max_nodes` values (keys included), nests
    deeper than `max_depth` or writes a number of more than MAX_DIGITS digits, found before
    json.loads builds (or recurses into) anything, and at C speed: string literals stripped,
    brackets and separators counted."""
    strings = (header.count(b'"') - header.count(b'\\"')) // 2  # at most the strings there are
    if strings > max_nodes:
        raise WireError(f"header has more than {max_nodes} values")
    skeleton = _STRING.sub(b'""', header) if strings else header
    opening = skeleton.count(b"[") + skeleton.count(b"{")
    if 1 + opening + skeleton.count(b",") + skeleton.count(b":") > max_nodes:
        raise WireError(f"header has more than {max_nodes} values")
    if skeleton.count(b"]") + skeleton.count(b"}") != opening:
        raise WireError("header's brackets do not match")
    if _LONG_NUMBER.search(skeleton):
        raise WireError(f"header has a number of more than {MAX_DIGITS} digits")
    brackets = skeleton.translate(_BRACKETS, _NOT_BRACKETS)  # (twice the containers at most)
    for _ in range(max_depth):  # each round removes the innermost level
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break
        brackets = inner
    if brackets:
        raise WireError(f"header nested deeper than {max_depth} levels" if b"[]" in brackets
                        else "header's brackets do not match")


def _decode(header: bytes, payload: memoryview, max_nodes: int, max_depth: int) -> Any:
    tree = _parse_header(header, max_nodes, max_depth)
    root = [tree]  # (so that a frame that is one tensor is replaced like any other)
    slots: list = []
    _collect(root, len(payload), slots)
    _check_tiling([spec for _, _, spec in slots], len(payload))  # before a single byte is copied
    for container, key, spec in slots:  # (the tree is json.loads' own: replaced in place)
        container[key] = _tensor(payload, *spec)
    return root[0]


def _parse_header(header: bytes, max_nodes: int, max_depth: int) -> Any:
    """The header's JSON, its bounds checked before json.loads."""
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("header is not UTF-8") from None
    _check_header(header, max_nodes, max_depth)
    try:
        return json.loads(text)
    except ValueError as e:
        raise WireError(f"bad header: {e}") from None


def _spec(entry, size: int) -> tuple:
    """A tensor entry of the header, checked: (offset, nbytes, dtype, shape), its bytes within
    a payload of `size` bytes and matching its shape."""
    if not (isinstance(entry, list) and len(entry) == 4):
        raise WireError("bad tensor entry")
    dtype_name, shape, offset, nbytes = entry
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise WireError(f"bad tensor dtype {dtype_name!r}")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
            and all(type(s) is int and s >= 0 for s in shape)):
        raise WireError("bad tensor shape")
    if not (type(offset) is int and type(nbytes) is int and 0 <= offset
            and 0 <= nbytes <= size - offset):
        raise WireError("tensor data out of range")
    numel = 1
    for s in shape:
        numel *= s
    if numel * dtype.itemsize != nbytes:
        raise WireError("tensor size does not match its shape")
    return offset, nbytes, dtype, shape


def _collect(x, size: int, slots: list) -> None:
    """Every tensor entry below the container `x` (a dict or list of the parsed header, whose
    nesting `_check_header` bounded), checked, as (its container, its key, its spec). One pass
    that calls itself for containers only: the outcome of a module's call holds thousands of
    values (its parameters' names and shapes)."""
    for key, value in (x.items() if type(x) is dict else enumerate(x)):
        kind = type(value)
        if kind is dict:
            if len(value) == 1 and "__tensor__" in value:
                slots.append((x, key, _spec(value["__tensor__"], size)))
            else:
                _collect(value, size, slots)
        elif kind is list:
            _collect(value, size, slots)


def _tensor(payload: memoryview, offset: int, nbytes: int, dtype, shape) -> torch.Tensor:
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = bytearray(payload[offset: offset + nbytes])  # the one copy of these bytes
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)


def _check_tiling(specs: list, size: int) -> None:
    """The tensors' byte ranges must tile the payload exactly: sorted by offset, they start at 0,
    each where the one before ends, the last at the payload's end. So no range is named twice
    (a frame cannot make the grader copy its payload once per entry) and no byte is unread."""
    end = 0
    for offset, nbytes, _, _ in sorted(specs, key=lambda s: (s[0], s[1])):
        if offset != end:
            raise WireError("tensor ranges overlap" if offset < end else "tensor ranges leave a gap")
        end = offset + nbytes
    if end != size:
        raise WireError("tensor ranges do not end at the payload's end")


def save(obj: Any, path) -> None:
    with open(path, "wb") as f:
        f.write(encode(obj))


def load(path) -> Any:
    with open(path, "rb") as f:
        return decode(f.read())

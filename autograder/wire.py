"""A data format that cannot execute code: JSON for structure, raw bytes for tensors.

Used for everything that crosses from the student's process to the grader (never pickle), and
for the self-check fixtures. Decoding builds fresh, plain CPU tensors from bytes, so nothing the
student's process sends (a tensor subclass, an object with a lying __eq__) survives the trip.

Frame layout: b"AGW1", 8-byte big-endian header length, UTF-8 JSON header, 8-byte payload
length, payload (the tensors' bytes, concatenated). In the header a tensor is
{"__tensor__": [dtype, shape, offset, nbytes]}.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any

import torch

MAGIC = b"AGW1"
MAX_HEADER = 64 << 20
MAX_PAYLOAD = 1 << 30

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
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise WireError(f"cannot encode {type(x).__name__}")

    header = json.dumps(walk(obj), allow_nan=True).encode()
    payload = b"".join(chunks)
    return MAGIC + struct.pack(">Q", len(header)) + header + struct.pack(">Q", len(payload)) + payload


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

    def __init__(self, max_header: int = MAX_HEADER, max_payload: int = MAX_PAYLOAD):
        self.buf = bytearray()
        self.max_header, self.max_payload = max_header, max_payload

    def feed(self, data: bytes) -> None:
        self.buf += data

    def pop(self) -> bytes | None:
        """The next complete frame's bytes (removed from the buffer), or None; WireError if
        what is buffered is malformed or over the limits."""
        end = frame_length(self.buf, self.max_header, self.max_payload)
        if end is None:
            return None
        frame = bytes(self.buf[:end])
        del self.buf[:end]
        return frame

    def read(self, fd: int) -> Any:
        """The next frame from the blocking file descriptor `fd`, decoded; EOFError when the
        stream ends first."""
        while True:
            frame = self.pop()
            if frame is not None:
                return decode(frame)
            data = os.read(fd, 1 << 20)
            if not data:
                raise EOFError("stream closed")
            self.feed(data)


def decode(frame: bytes) -> Any:
    """Decode one whole frame (WireError if it is not exactly one)."""
    if frame_length(frame) != len(frame):
        raise WireError("not one whole frame")
    (hlen,) = struct.unpack_from(">Q", frame, 4)
    return _decode(frame[12: 12 + hlen], frame[20 + hlen:])


def _decode(header: bytes, payload: bytes) -> Any:
    try:
        tree = json.loads(header)
    except ValueError as e:
        raise WireError(f"bad header: {e}") from None

    def tensor(spec):
        if not (isinstance(spec, list) and len(spec) == 4):
            raise WireError("bad tensor entry")
        dtype_name, shape, offset, nbytes = spec
        dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise WireError(f"bad tensor dtype {dtype_name!r}")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise WireError("bad tensor shape")
        if not (isinstance(offset, int) and isinstance(nbytes, int) and 0 <= offset
                and offset + nbytes <= len(payload)):
            raise WireError("tensor data out of range")
        numel = 1
        for s in shape:
            numel *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != nbytes:
            raise WireError("tensor size does not match its shape")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        raw = bytearray(payload[offset: offset + nbytes])
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)

    def walk(x):
        if isinstance(x, dict):
            if set(x) == {"__tensor__"}:
                return tensor(x["__tensor__"])
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(tree)


def save(obj: Any, path) -> None:
    with open(path, "wb") as f:
        f.write(encode(obj))


def load(path) -> Any:
    with open(path, "rb") as f:
        return decode(f.read())

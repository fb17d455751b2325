"""The no-pickle data format: round trips, and refusal of malformed or hostile frames."""
import os
import json
import struct

import pytest
import torch

from autograder import wire


def test_round_trip_nested_structure_with_every_dtype():
    obj = {"a": [torch.arange(6, dtype=d).reshape(2, 3) for d in (torch.float64, torch.float32, torch.int64)],
           "b": {"mask": torch.tensor([[True, False]]), "half": torch.ones(3, dtype=torch.bfloat16)},
           "plain": [1, 2.5, None, "x", float("inf")], "empty": torch.zeros(0, 4)}
    back = wire.decode(wire.encode(obj))
    for x, y in zip(obj["a"], back["a"]):
        assert torch.equal(x, y) and x.dtype == y.dtype
    assert torch.equal(back["b"]["mask"], obj["b"]["mask"])
    assert back["b"]["half"].dtype == torch.bfloat16
    assert back["plain"][:4] == [1, 2.5, None, "x"] and back["plain"][4] == float("inf")
    assert back["empty"].shape == (0, 4)


def test_non_contiguous_and_subclass_tensors_come_back_plain():
    class Sneaky(torch.Tensor):
        def __eq__(self, other):  # an object that claims to equal anything
            return True

    t = torch.arange(12.0).reshape(3, 4).t()
    s = t.as_subclass(Sneaky)
    back = wire.decode(wire.encode({"t": t, "s": s}))
    assert torch.equal(back["t"], t)
    assert type(back["s"]) is torch.Tensor


def test_refuses_objects_that_are_not_plain_data():
    with pytest.raises(wire.WireError):
        wire.encode({"f": lambda: 0})
    with pytest.raises(wire.WireError):
        wire.encode({1: "non-string key"})


def _frame(header: dict, payload: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return wire.MAGIC + struct.pack(">Q", len(h)) + h + struct.pack(">Q", len(payload)) + payload


@pytest.mark.parametrize("entry", [
    ["float64", [2], 0, 8],           # size does not match the shape
    ["float64", [1], 0, 800],         # out of the payload
    ["object", [1], 0, 8],            # not an allowed dtype
    ["float64", [-1], 0, 8],          # negative shape
])
def test_rejects_malformed_tensor_entries(entry):
    with pytest.raises(wire.WireError):
        wire.decode(_frame({"t": {"__tensor__": entry}}, b"\0" * 8))


def test_rejects_bad_magic_and_oversized_header():
    with pytest.raises(wire.WireError):
        wire.decode(b"PICKLE" + b"\0" * 20)
    reader = wire.FrameReader()
    reader.feed(wire.MAGIC + struct.pack(">Q", wire.MAX_HEADER + 1))
    with pytest.raises(wire.WireError):
        reader.pop()
    with pytest.raises(wire.WireError, match="one whole frame"):
        wire.decode(wire.encode(1) + b"AGW1")


def test_the_frame_reader_splits_a_stream_however_it_arrives():
    """The one reader of both sides: frames fed byte by byte or several at once come out
    whole and in order; a blocking read of a pipe ends with EOFError."""
    frames = [wire.encode({"n": n, "t": torch.arange(n)}) for n in range(4)]
    stream = b"".join(frames)
    for step in (1, 7, len(stream)):
        reader, got = wire.FrameReader(), []
        for i in range(0, len(stream), step):
            reader.feed(stream[i:i + step])
            while (frame := reader.pop()) is not None:
                got.append(wire.decode(frame)["n"])
        assert got == [0, 1, 2, 3] and not reader.buf
    r, w = os.pipe()
    os.write(w, stream[:30])
    os.write(w, stream[30:])
    os.close(w)
    reader = wire.FrameReader()
    assert [reader.read(r)["n"] for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(EOFError):
        reader.read(r)
    os.close(r)


def test_frame_length_is_the_one_parser_for_partial_and_malformed_frames():
    frame = wire.encode({"x": torch.arange(3), "s": "é"})
    for n in range(len(frame)):  # every prefix is incomplete, never an error
        assert wire.frame_length(frame[:n]) is None
    assert wire.frame_length(frame) == len(frame)
    assert wire.frame_length(frame + b"AGW1") == len(frame)  # the next frame's start stays
    with pytest.raises(wire.WireError, match="magic"):
        wire.frame_length(b"XGW1" + frame[4:])
    with pytest.raises(wire.WireError, match="header too large"):
        wire.frame_length(frame, max_header=3)
    with pytest.raises(wire.WireError, match="payload too large"):
        wire.frame_length(frame, max_payload=3)

"""A graded call's frame with its inputs encoded once (`session.call_frames`): the same message as
encoding it whole, for every case the grader sends; kept per input objects, never by value."""
import gc
import weakref

import pytest
import torch

from autograder.grading.variants import variants
from autograder.references.cache import REFERENCES
from autograder.runtime.device_check import FAKE_CUDA
from autograder.session import call_frames
from autograder.shared import protocol, wire
from autograder.shared.calls import Call
from autograder.shared.contract import CHAPTERS

SEED = 1234


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (a == b or a != a)  # (NaN)


def whole(call_id: int, call: Call, timeout: float) -> bytes:
    return wire.encode(protocol.plain(protocol.RunCall(call_id, call.to_wire(), timeout)))


@pytest.fixture(autouse=True)
def empty_cache():
    call_frames.forget()
    yield
    call_frames.forget()


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_case_of_every_device_is_the_message_encoding_it_whole_gives(chapter):
    sent = 0
    for ex in CHAPTERS[chapter].exercises:
        cases = REFERENCES.cases(chapter, ex.name, SEED, False)
        for device in ("cpu", FAKE_CUDA, "cuda"):
            for i, (_, c) in enumerate(variants(cases, device)):
                if i % 2:  # (what the grader sends where an exercise it builds on failed)
                    c = Call(**{**c.to_wire(), "watch": ["softmax"]})
                for twice in range(2):  # (the second from what the first kept)
                    frame = call_frames.run_call(7 + twice, c, 2.5)
                    assert same(wire.decode(frame), wire.decode(whole(7 + twice, c, 2.5))), (c.case, device)
                    message = protocol.from_plain(wire.decode(frame))
                    assert isinstance(message, protocol.RunCall) and message.id == 7 + twice
                    sent += 1
    assert sent


def test_inputs_are_encoded_once_for_every_variant_that_shares_them(monkeypatch):
    args = [torch.randn(3, 4), {"mask": torch.ones(3, 3, dtype=torch.bool)}]
    call = Call("02_scaled_dot_product_attention", "x", "case", "f", args=args, kwargs={"scale": 0.5})
    encoded = []
    real = wire.parts
    monkeypatch.setattr(wire, "parts", lambda obj: encoded.append(obj) or real(obj))
    call_frames.run_call(1, call, 1.0)
    call_frames.run_call(2, call.on(FAKE_CUDA, "float32"), 1.0)
    with_inputs = [obj for obj in encoded if "args" in obj]
    assert len(with_inputs) == 1  # (the rest of each message is encoded each time: no tensors)
    # Equal inputs in other objects are other inputs: encoded afresh, never matched by value.
    call_frames.run_call(3, Call(**{**call.to_wire(), "args": [args[0].clone(), args[1]]}), 1.0)
    assert len([obj for obj in encoded if "args" in obj]) == 2


def test_what_is_kept_holds_its_objects_and_stays_under_its_bound(monkeypatch):
    monkeypatch.setattr(call_frames, "MAX_BYTES", 3000)
    first = torch.zeros(100, dtype=torch.float64)  # 800 bytes of payload each
    gone = weakref.ref(first)
    call_frames.run_call(1, Call("c", "e", "case", "f", args=[first]), 1.0)
    del first
    gc.collect()
    assert gone() is not None  # (kept: no later object can take its id)
    for _ in range(5):
        call_frames.run_call(1, Call("c", "e", "case", "f", args=[torch.zeros(100, dtype=torch.float64)]), 1.0)
    assert 0 < call_frames._kept_bytes <= 3000
    gc.collect()
    assert gone() is None  # the least recent, dropped
    call_frames.run_call(1, Call("c", "e", "case", "f", args=[torch.zeros(1000, dtype=torch.float64)]), 1.0)  # over the bound
    assert call_frames._kept_bytes <= 3000


def test_a_tensor_outside_the_inputs_is_sent_too():
    call = Call("c", "e", "case", "f", args=[torch.ones(2)], grad=[torch.arange(3)])  # (none the grader makes)
    assert same(wire.decode(call_frames.run_call(4, call, 1.0)), wire.decode(whole(4, call, 1.0)))

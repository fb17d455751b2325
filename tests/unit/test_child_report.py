"""autograder/session/trust.py: what a chapter's child reports is believed only when every field
has the right type; strings are capped and only plain tensors pass."""
import torch

from autograder.shared.calls import Outcome
from autograder.session.trust import plain_error, validated


class Sub(torch.Tensor):
    pass


def test_a_well_formed_outcome_is_rebuilt_field_by_field():
    plain = Outcome(returned="Tensor", outputs=[torch.ones(2)], meta=[{"shape": [2], "dtype": "float64",
                    "device": "cpu", "extra": "dropped"}], grads={"args.0": torch.zeros(2)},
                    called=["softmax"], seconds=0.5, largest_tensor=[4, "aten.mm"]).to_plain()
    out = validated(plain)
    assert out.outputs[0].tolist() == [1.0, 1.0] and out.grads["args.0"].tolist() == [0.0, 0.0]
    assert out.meta == [{"shape": [2], "dtype": "float64", "device": "cpu"}]
    assert out.called == ["softmax"] and out.largest_tensor == [4, "aten.mm"]


def test_anything_else_is_refused():
    good = Outcome(outputs=[torch.ones(1)]).to_plain()
    for bad in ([], {"unknown_field": 1}, {**good, "outputs": [Sub(torch.ones(1))]},
                {**good, "outputs": ["not a tensor"]}, {**good, "meta": [{"shape": ["2"]}]},
                {**good, "grads": []}, {**good, "params": {"w": [2.5]}},
                {**good, "largest_tensor": ["4", "mm"]}, {**good, "called": "softmax"}):
        assert validated(bad) is None, bad


def test_long_strings_are_capped_and_errors_are_plain():
    out = validated({"error": {"type": "E" * 50_000, "message": 3, "where": ""}, "returned": "x" * 9999})
    assert len(out.error["type"]) <= 20_000 and out.error["message"] == ""
    assert len(out.returned) <= 502
    assert plain_error("a string") == {"type": "Error", "message": "(unreadable error)", "where": ""}


def test_a_required_error_is_believed_only_from_a_raise_in_the_graded_code():
    from autograder.session.trust import expected_error_credible

    cells = ["import torch\n",
             "class Heads:\n    def __init__(self, e, h):\n        if e % h: raise ValueError('no')\n",
             "class MyError(ValueError):\n    pass\n\ndef f(x):\n    raise MyError('bad x')\n\n"
             "def g():\n    raise ValueError('forged')\n"]
    own = {"type": "ValueError", "message": "no", "where": "<cell 2>, line 3, in __init__: if e % h: raise ValueError('no')"}
    assert expected_error_credible(own, "ValueError", cells, "Heads")
    sub = {"type": "MyError", "message": "bad x", "where": "<cell 3>, line 5, in f: raise MyError('bad x')"}
    assert expected_error_credible(sub, "ValueError", cells, "f")
    # a real raise line, but outside the graded function: a forged claim
    elsewhere = {"type": "ValueError", "message": "", "where": "<cell 3>, line 8, in g: raise ValueError('forged')"}
    assert not expected_error_credible(elsewhere, "ValueError", cells, "Heads")
    # a line the notebook does not have
    invented = {"type": "ValueError", "message": "", "where": "<cell 2>, line 3, in __init__: raise ValueError('x')"}
    assert not expected_error_credible(invented, "ValueError", cells, "Heads")
    # the stub's own raise, claimed as a ValueError: the class is judged from Python's, not the claim
    stub = {"type": "NotImplementedError", "mro": ["NotImplementedError", "ValueError"], "message": "",
            "where": "<cell 3>, line 5, in f: raise MyError('bad x')"}
    assert not expected_error_credible(stub, "ValueError", cells, "f")


def test_a_classmates_exception_class_is_not_believed_from_the_parse_cache():
    """The grader parses each notebook once for these checks (its `ParsedSubmission`, which a
    worker may have held for a classmate just before). A student whose notebook raises
    `ShapeError` without making it a ValueError must not borrow the class of a classmate graded
    just before, whose notebook has the same raise line and `class ShapeError(ValueError)`."""
    from autograder.session.trust import expected_error_credible

    graded = "def f(x):\n    raise ShapeError('bad x')\n"
    classmate = ["import torch\n", "class ShapeError(ValueError):\n    pass\n", graded]
    student = ["import torch\n", "class ShapeError(RuntimeError):\n    pass\n", graded]
    claim = {"type": "ShapeError", "mro": ["ShapeError", "ValueError"], "message": "bad x",
             "where": "<cell 3>, line 2, in f: raise ShapeError('bad x')"}
    for _ in range(2):  # (as a worker grading them in turn does)
        assert expected_error_credible(claim, "ValueError", classmate, "f")
        assert not expected_error_credible(claim, "ValueError", student, "f")
        assert not expected_error_credible(claim, "ValueError", student[::2], "f")  # no class at all


def test_the_float32_run_is_never_read_from_the_child():
    """`at_float32` (the reference's own float32 run, which widens what passes in a float64 case)
    is computed in the grader only: a child that sends one, as a patched executor could, has it
    dropped. (`transient`, the non-persistent buffer names, is read: at most it spares an extra
    buffer the "unexpected parameters" message, never a value comparison.)"""
    forged = Outcome(returned="Tensor", outputs=[torch.zeros(2)], meta=[{"shape": [2], "dtype": "float32",
                                                                        "device": "cpu"}]).to_plain()
    forged["at_float32"] = {"outputs": [torch.ones(2)], "grads": {}}
    forged["transient"] = ["position_ids"]
    out = validated(forged)
    assert out is not None and out.at_float32 is None and out.transient == ["position_ids"]

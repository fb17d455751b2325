"""The comparison of outcomes: ordered diagnosis, tolerances, and the numbers in the message."""
import torch

from autograder.calls import Call, Outcome
from autograder.compare import compare, compare_meta, value_error
from autograder.execute import execute


def _call(**kw):
    return Call(chapter="x", exercise="f", case="c", target="f", **kw)


def _run(fn, call):
    return execute({"f": fn}, call)


def test_identical_outcomes_match_and_values_report_largest_error_and_where():
    x = torch.randn(3, 4, dtype=torch.float64)
    c = _call(args=[x], grad=["args.0"])
    ref = _run(lambda t: (t * 2, t.sum(-1)), c)
    assert compare(c, _run(lambda t: (2 * t, t.sum(dim=-1)), c), ref) is None
    def bad(t):
        out = t * 2
        return out + torch.nn.functional.one_hot(torch.tensor(1 * 4 + 2), 12).reshape(3, 4) * 0.5, t.sum(-1)
    m = compare(c, _run(bad, c), ref)
    assert m.aspect == "values" and m.where == [1, 2] and abs(m.max_abs - 0.5) < 1e-12
    assert "largest absolute error 0.5" in m.message


def test_order_of_aspects_shape_before_dtype_before_values():
    x = torch.randn(2, 3, dtype=torch.float64)
    c = _call(args=[x])
    ref = _run(lambda t: t + 1, c)
    assert compare(c, _run(lambda t: (t + 1).t(), c), ref).aspect == "shape"
    assert compare(c, _run(lambda t: (t + 1).float(), c), ref).aspect == "dtype"
    assert compare(c, _run(lambda t: (t + 1, t), c), ref).aspect == "returned"
    assert compare(c, _run(lambda t: t / 0 * 0, c), ref).aspect == "nonfinite"


def test_errors_missing_names_and_expected_errors():
    c = _call(args=[torch.zeros(2)])
    ref = _run(lambda t: t, c)
    m = compare(c, execute({}, c), ref)
    assert m.aspect == "missing" and "`f` is not defined" in m.message
    def boom(t):
        raise NotImplementedError()
    assert compare(c, _run(boom, c), ref).aspect == "error"
    ce = _call(args=[torch.zeros(2)], expect_error="ValueError")
    def raises_subclass(t):
        class MyError(ValueError):
            pass
        raise MyError("bad")
    assert compare(ce, _run(raises_subclass, ce), Outcome()) is None
    assert compare(ce, _run(lambda t: t, ce), Outcome()).aspect == "expected-error"


def test_detached_gradient_and_in_place_modification_are_reported():
    x = torch.randn(4, dtype=torch.float64)
    c = _call(args=[x], grad=["args.0"])
    ref = _run(lambda t: t * 3, c)
    m = compare(c, _run(lambda t: (t * 3).detach(), c), ref)
    assert m.aspect == "grads" and "no gradient reaches argument #1" in m.message
    def in_place(t):
        with torch.no_grad():
            t.mul_(1.0)
            t.add_(1.0)
        return (t - 1.0) * 3
    assert compare(c, _run(in_place, c), ref).aspect == "inplace"


def test_meta_device_catches_tensors_created_on_the_cpu():
    c = _call(args=[torch.randn(2, 3, dtype=torch.float64)]).on("meta", "float32")
    ref = _run(lambda t: t + torch.zeros_like(t), c)
    good = _run(lambda t: t + torch.zeros(t.shape, device=t.device, dtype=t.dtype), c)
    bad = _run(lambda t: t + torch.zeros(t.shape), c)
    assert compare_meta(c, good, ref) is None
    m = compare_meta(c, bad, ref)
    assert m is not None and "device=x.device" in m.hint


def test_tolerance_depends_on_dtype():
    e = torch.ones(3, dtype=torch.float64)
    assert value_error(e + 1e-5, e, "float32") is None
    assert value_error(e + 1e-5, e, "float64") is not None
    b = torch.tensor([True, False])
    assert value_error(torch.tensor([True, True]), b, "float64")[2] == [1]

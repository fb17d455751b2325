"""The comparison of outcomes: ordered diagnosis, tolerances, and the numbers in the message."""
import pytest
import torch

import test_grading_ch02
import test_grading_ch03
import test_grading_ch06
from autograder import cases as case_registry
from autograder.shared.calls import Call, Outcome
from autograder.grading.compare import FLOAT32_NOTE, compare, compare_meta, value_error
from autograder.shared.contract import CHAPTERS
from autograder.runtime.execute import execute
from autograder.grading.variants import HALF_DTYPES
from autograder.references.cache import REFERENCES
from grading_helpers import GRADER, namespace_of


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


def test_an_output_that_its_meta_misdescribes_fails_whatever_it_broadcasts_to():
    """A forged result (a child reports the reference's shape over a tensor that broadcasts to
    the reference's values: a scalar where every value is the same) does not pass: `structure`
    holds each output to its meta before any value is compared (value_error broadcasts)."""
    c = _call(args=[torch.zeros(2, 3, dtype=torch.float64)])
    ref = _run(lambda t: t + 1, c)
    forged = _run(lambda t: t + 1, c)
    forged.outputs = [torch.tensor(1.0, dtype=torch.float64)]  # meta still says (2, 3)
    m = compare(c, forged, ref)
    assert m is not None and m.aspect == "returned" and "does not match its description" in m.message, m
    forged.outputs = [torch.ones(4, 2, 3, dtype=torch.float64)]
    assert compare(c, forged, ref).aspect == "returned"


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


def test_float32_rounding_in_a_float64_case_passes_with_a_note_and_a_larger_error_fails():
    x = torch.randn(50, dtype=torch.float64)
    c = _call(args=[x])
    ref = _run(lambda t: t.exp(), c)
    notes = []
    assert compare(c, _run(lambda t: t.exp() * (1 + 2e-5), c), ref, notes) is None  # float32-level
    assert notes == [FLOAT32_NOTE]
    notes = []
    assert compare(c, _run(lambda t: t.exp() * (1 + 1e-3), c), ref, notes).aspect == "values"
    assert compare(c, _run(lambda t: t.exp(), c), ref, notes) is None and notes == []


def test_tolerance_depends_on_dtype():
    e = torch.ones(3, dtype=torch.float64)
    assert value_error(e + 1e-5, e, "float32") is None
    assert value_error(e + 1e-5, e, "float64") is not None
    b = torch.tensor([True, False])
    assert value_error(torch.tensor([True, True]), b, "float64")[2] == [1]



def test_the_quick_rule_and_the_detailed_one_agree_on_every_special_value():
    """value_error answers "all close" with one isclose and explains a mismatch with its own
    ops: the two must agree, element by element, on NaNs, infinities, zeros and the edges of
    the tolerance (a disagreement would pass a wrong value, or fail a right one with no place)."""
    import itertools

    rtol, atol = 1e-6, 1e-8
    inf, nan = float("inf"), float("nan")
    values = [0.0, -0.0, 1.0, -1.0, 1 + 0.9e-6, 1 + 1.1e-6, 1e-9, 2e-8, inf, -inf, nan, 1e300]
    for x, y in itertools.product(values, repeat=2):
        a, e = torch.tensor([x], dtype=torch.float64), torch.tensor([y], dtype=torch.float64)
        both_nan = x != x and y != y
        same_inf = abs(x) == inf and x == y
        diff = 0.0 if both_nan or same_inf else abs(x - y)
        diff = inf if diff != diff else diff
        wrong = diff > atol + rtol * (0.0 if abs(y) == inf or y != y else abs(y))
        assert (value_error(a, e, "float64") is not None) == wrong, (x, y)
    # a mismatch anywhere in a larger tensor still says where
    e = torch.randn(4, 5, dtype=torch.float64)
    a = e.clone()
    a[2, 3] += 1e-3
    assert value_error(a, e, "float64")[2] == [2, 3]

# --------------------------------------------------------------------------- half precision
# The float16/bfloat16 tolerances of the CUDA test, checked where no GPU is needed: on the CPU,
# implementations that are correct but computed differently (einsum, other reshapes, their own
# softmax) must pass in half precision, and a real mistake must still fail. (On a GPU the grader
# runs the same comparisons on CUDA.)
VARIANTS = [(m.CH, name, src) for m in (test_grading_ch02, test_grading_ch03, test_grading_ch06)
            for name, src in m.CORRECT]


def half_calls(chapter: str, exercise: str, dtype: str):
    for c in REFERENCES.cases(chapter, exercise, GRADER.seed, False):
        if not (c.expect_error or c.as_default or c.train):
            yield c.on("cpu", dtype)


def mismatches(chapter: str, ns: dict, dtype: str) -> list:
    ref = namespace_of(chapter)
    out = []
    for ex in CHAPTERS[chapter].exercises:
        for c in half_calls(chapter, ex.name, dtype):
            m = case_registry.compare(c, execute(ns, c), execute(ref, c))
            if m:
                out.append((ex.name, c.case, m.aspect, m.message[:200]))
    return out


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("chapter, name, src", VARIANTS, ids=[f"{v[0][:2]}-{v[1]}" for v in VARIANTS])
def test_correct_but_different_passes_in_half_precision(chapter, name, src, dtype):
    assert mismatches(chapter, namespace_of(chapter, src), dtype) == []


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_unscaled_scores_still_fail_in_half_precision(dtype):
    src = next(b[2] for b in test_grading_ch02.BUGGY if b[0] == "unscaled")
    found = mismatches(test_grading_ch02.CH, namespace_of(test_grading_ch02.CH, src), dtype)
    assert any(ex == "scaled_dot_product_attention" and aspect == "values" for ex, _, aspect, _ in found), found


def test_a_meta_comparison_leaves_the_shared_reference_outcome_as_it_was():
    """compare_meta judges shallow copies of the two outcomes (no deep copy of every reference
    tensor): the reference outcome is the grader's cached one, shared by every student a worker
    grades. Whatever a student's child reports (a forged structure, extra parameters, a load
    error, a wrong return), the cached outcome must come out of the comparison unchanged."""
    from autograder.shared import wire
    from autograder.session.trust import validated
    from autograder.references.cache import reference_key
    from autograder.grading.variants import variants

    chapter, exercise = "08_transformer", "TinyTransformer"
    cases = REFERENCES.cases(chapter, exercise, GRADER.seed, False)
    index, c = variants(cases, "meta")[0]
    expected = REFERENCES.expected(c, reference_key(chapter, exercise, GRADER.seed, False, index, c))
    before = wire.encode(expected.to_plain())
    hostile = [
        {"returned": "tuple(Tensor, list(Tensor))", "outputs": [None, None],
         "meta": [{"shape": [9, 9], "dtype": "float64", "device": "cpu"}] * 2,
         "params": {"evil": [1], **{k: [7] for k in expected.params}}, "transient": ["evil"],
         "load_error": "missing: everything", "inputs_modified": ["tokens"], "called": ["softmax"]},
        {"error": {"type": "ValueError", "message": "x", "where": ""}},
        {"returned": "NoneType"},
    ]
    for plain in hostile:
        student = validated(plain)
        assert student is not None
        assert compare_meta(c, student, expected) is not None
    assert wire.encode(expected.to_plain()) == before

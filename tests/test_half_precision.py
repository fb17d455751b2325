"""The float16/bfloat16 tolerances of the CUDA test, checked where no GPU is needed: on the CPU,
implementations that are correct but computed differently (einsum, other reshapes, their own
softmax) must pass in half precision, and a real mistake must still fail. (On a GPU the grader
runs the same comparisons on CUDA; this machine has none.)"""
import pytest

from autograder import cases as case_registry
from autograder.contract import CHAPTERS
from autograder.execute import execute
from autograder.grading import HALF_DTYPES, REFERENCES

from grading_helpers import GRADER, namespace_of
import test_grading_ch02
import test_grading_ch03
import test_grading_ch06

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

"""`SubmissionResult.to_plain` (the journal, the workers' spool, the class report) gives what
`dataclasses.asdict` gave, without its deep copy of every leaf, and shares no list or dict with
the result it came from."""
from __future__ import annotations

import json
from dataclasses import asdict

from autograder.grading import results
from autograder.grading.results import CaseResult, ChapterResult, SubmissionResult
from autograder.sandbox.modes import SandboxMode


def _result() -> SubmissionResult:
    figure = {"expected": [[0.25, 0.75], [1.0, 0.0]], "submitted": [[0.5, 0.5], [1.0, float("nan")]]}
    cases = [CaseResult("a mask", "cpu", "float64", True, figure=figure, used=["softmax"]),
             CaseResult("no mask", "fake-cuda", "float32", False, aspect="value", message="off by 1e-3",
                        hint="scale by 1/sqrt(d_k)", not_implemented=False, figure=None, used=[]),
             CaseResult("stub", "cpu", "float64", False, not_implemented=True, used=("x", "y"))]
    tests = [results.TestResult("02_scaled_dot_product_attention", "scaled_dot_product_attention", "cpu", 2.0, 3.0,
                        cases, note="")]
    chapter = ChapterResult("02_scaled_dot_product_attention", "02.ipynb", tests, notes=["cell 3 failed"],
                            output="out", seconds=1.5, sandbox=next(iter(SandboxMode)))
    return SubmissionResult("amy", [chapter, ChapterResult("01_intuition", None, not_graded="missing")],
                            notes=["n"], seconds=2.0, sandbox=next(iter(SandboxMode)))


def test_to_plain_is_asdict_with_the_scores():
    result = _result()
    expected = asdict(result)
    expected["score"], expected["max_score"] = result.score, result.max_score
    plain = result.to_plain()
    assert json.dumps(plain, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert repr(plain) == repr(expected)  # (tuples stay tuples, the sandbox mode stays itself)


def test_the_plain_form_shares_no_container_with_the_result():
    result = _result()
    plain = result.to_plain()
    case = plain["chapters"][0]["tests"][0]["cases"][0]
    case["figure"]["expected"][0][0] = 99.0
    case["used"].append("matmul")
    plain["chapters"][0]["notes"].clear()
    original = result.chapters[0]
    assert original.tests[0].cases[0].figure["expected"][0][0] == 0.25
    assert original.tests[0].cases[0].used == ["softmax"] and original.notes == ["cell 3 failed"]


def test_from_plain_reads_it_back():
    result = _result()
    back = SubmissionResult.from_plain(json.loads(json.dumps(result.to_plain())))
    assert back.score == result.score and back.max_score == result.max_score
    assert [c.chapter for c in back.chapters] == [c.chapter for c in result.chapters]
    assert back.chapters[0].tests[0].cases[1].hint == "scale by 1/sqrt(d_k)"

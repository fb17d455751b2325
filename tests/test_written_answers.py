"""Written answers ("predict the output", contract kind "answer") are checked without storing
them: the self-check runs in the student's own kernel, beside the package's public source, so
nothing there may give an answer back, and trying values there must teach nothing.

- the self-check data of an answer hold no number (nor list of numbers) equal to the answer;
- the self-check says the same for every value of the asked form (a brute-force loop over
  candidate values learns nothing); it flags only the form (stub, not numbers, wrong shape);
- no hint of a likely wrong answer, and no grader message, states the right value or a sum that
  gives it, and the package source holds no distinctive answer;
- grading a written answer gives one test at full weight: no meta or CUDA row.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import math
import re
from pathlib import Path

import pytest
import torch

from autograder import wire
from autograder.answers import ANSWER_ATOL, close
from autograder.cases import build_cases
from autograder.cases.extra import HINTS
from autograder.contract import CHAPTERS
from autograder.execute import execute
from autograder.grading import Grader, exercise_tests, grade_exercise, judge, variants, zero_chapter
from autograder.inputs import SELF_CHECK_SEED
from autograder.references import load_reference
from autograder.selfcheck import DATA, SelfCheckFailed, build_fixtures, check, run_checks

PACKAGE = Path(__file__).resolve().parent.parent / "autograder"

ANSWERS = [(ch.id, ex) for ch in CHAPTERS.values() for ex in ch.exercises if ex.kind == "answer"]
IDS = [ex.name for _, ex in ANSWERS]


def _answer_call(chapter: str, ex):
    (call,) = build_cases(chapter, ex.name, load_reference(chapter), seed=SELF_CHECK_SEED, quick=True)
    return call


def _right(chapter: str, ex) -> torch.Tensor:
    """The answer, as the grader computes it from the reference solution."""
    out = execute(load_reference(chapter), _answer_call(chapter, ex))
    assert out.error is None and len(out.outputs) == 1, out.error
    return out.outputs[0].double()


@pytest.fixture(scope="module")
def fresh_fixtures() -> dict:
    return build_fixtures()


# ------------------------------------------------------------------ numbers in stored data
def _sequences(obj):
    """Every run of numbers in a plain structure: each tensor flattened, each list of numbers,
    each lone number (bools included: True is 1)."""
    if isinstance(obj, torch.Tensor):
        yield [float(x) for x in obj.detach().double().flatten().tolist()]
    elif isinstance(obj, (int, float)):
        yield [float(obj)]
    elif isinstance(obj, str):
        yield from ([float(x)] for x in _numbers_in(obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _sequences(k)
            yield from _sequences(v)
    elif isinstance(obj, (list, tuple)):
        if obj and all(isinstance(x, (int, float)) for x in obj):
            yield [float(x) for x in obj]
        for x in obj:
            yield from _sequences(x)


def _contains(seq: list[float], answer: torch.Tensor) -> bool:
    """Whether the flattened answer appears, at the answers' tolerance, as a contiguous run of
    `seq` (for a single number: any number of `seq`)."""
    flat = answer.flatten()
    n = flat.numel()
    for i in range(len(seq) - n + 1):
        if bool(close(torch.tensor(seq[i:i + n], dtype=torch.float64), flat).all()):
            return True
    return False


def _stored_fixtures():
    return wire.load(DATA)


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_the_self_check_data_hold_no_answer(chapter, ex, fresh_fixtures):
    """Neither freshly built data nor the package's selfcheck.agw hold a number (or run of
    numbers) equal to the answer among all that is stored for the exercise."""
    right = _right(chapter, ex)
    for data in (fresh_fixtures, _stored_fixtures()):
        entries = data[f"{chapter}/{ex.name}"]
        assert entries and all(e["expected"]["outputs"] == [] and e["expected_meta"] is None for e in entries)
        leaks = [seq for seq in _sequences(entries) if _contains(seq, right)]
        assert not leaks, (ex.name, leaks)
        # what is kept is the form the question asks for, nothing else
        assert [e["expected"]["meta"] for e in entries] == [[{"shape": list(right.shape), "dtype": "float64",
                                                              "device": "cpu"}]]


# ------------------------------------------------------------------ brute force learns nothing
def _candidates(right: torch.Tensor, ex_name: str) -> list:
    gen = torch.Generator().manual_seed(0)
    shape = tuple(right.shape)
    cands = [right.tolist(), (right + 0.004).tolist(), (right + 0.5).tolist(), (right - 1).tolist(),
             torch.zeros(shape).tolist(), torch.ones(shape).tolist(), torch.full(shape, math.nan).tolist(),
             torch.full(shape, math.inf).tolist(), (-torch.full(shape, math.inf)).tolist()]
    cands += [torch.randn(shape, generator=gen).mul(10).tolist() for _ in range(20)]
    cands += [p.tolist() for p, _ in HINTS_OF(ex_name)]
    if not shape:  # one number: a whole grid, as a brute-force loop would try
        cands += [x / 100 for x in range(-300, 301)] + list(range(0, 1025))
    else:  # every 0/1 pattern of the shape (the masks and the shapes are small)
        n = right.numel()
        if n <= 6:
            cands += [torch.tensor(bits, dtype=torch.float64).reshape(shape).tolist()
                      for bits in itertools.product([0, 1], repeat=n)]
    return cands


def HINTS_OF(ex_name: str):
    (key,) = [k for k in HINTS if k[1] == ex_name]
    return HINTS[key].explain.pairs


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_brute_force_gets_the_same_verdict_for_right_and_wrong_answers(chapter, ex):
    right = _right(chapter, ex)
    seen = {}
    for value in _candidates(right, ex.name):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            verdict = check(chapter, ex.name, value, raise_on_failure=False)
        mismatches = [m for _, m, _ in run_checks(chapter, ex.name, value)]
        seen.setdefault((verdict, out.getvalue(), tuple(m is None for m in mismatches)), value)
    assert len(seen) == 1, list(seen)
    ((verdict, text, _),) = seen
    assert verdict is True and "recorded" in text and "autograder" in text


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_the_self_check_still_flags_the_form(chapter, ex):
    right = _right(chapter, ex)
    with pytest.raises(SelfCheckFailed, match="not implemented yet"):
        check(chapter, ex.name, ...)
    with pytest.raises(SelfCheckFailed, match="should be a number"):
        check(chapter, ex.name, "0.5")
    wrong_shape = [right.tolist(), right.tolist()] if right.dim() else [right.item(), right.item()]
    with pytest.raises(SelfCheckFailed, match="the question asks for"):
        check(chapter, ex.name, wrong_shape)


# ------------------------------------------------------------------ hints and messages
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")


def _numbers_in(text: str) -> list[float]:
    out = []
    for token in NUMBER.findall(text):
        if "/" in token:
            a, b = token.split("/")
            out.append(float(a) / float(b) if float(b) else math.inf)
        else:
            out.append(float(token))
    return out


def _gives_away(text: str, right: torch.Tensor, wrong: torch.Tensor | None) -> bool:
    """Whether `text` states the answer: the run of its numbers, or (for one number) a signed sum
    of some of its numbers and the wrong answer it is the hint of ("512: fc1 has 32 and fc2 8
    more parameters" gives 552)."""
    numbers = _numbers_in(text)
    if _contains(numbers, right):
        return True
    if right.dim() == 0:
        pool = numbers + ([float(wrong)] if wrong is not None and wrong.dim() == 0 else [])
        for k in range(2, min(len(pool), 6) + 1):
            for subset in itertools.combinations(pool, k):
                for signs in itertools.product((1, -1), repeat=k):
                    if abs(sum(s * x for s, x in zip(signs, subset)) - float(right)) <= ANSWER_ATOL:
                        return True
    return False


def test_the_give_away_rule_catches_the_old_hints():
    right = torch.tensor(552.0, dtype=torch.float64)
    assert _gives_away("nn.Linear has a bias by default: fc1 has 32 and fc2 8 more parameters", right,
                       torch.tensor(512.0))
    assert _gives_away("fc2 has a bias too (8 parameters)", right, torch.tensor(544.0))
    assert _gives_away("the gate is sigmoid(linear_g(x)), and sigmoid(0) = 0.5", torch.tensor(0.5), None)
    assert _gives_away("even columns hold sines: [0, 1, 0, 1, 0, 1]", torch.tensor([0., 1, 0, 1, 0, 1]), None)
    assert not _gives_away("count each layer's bias too", right, torch.tensor(512.0))


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_no_hint_or_message_states_the_answer(chapter, ex):
    right = _right(chapter, ex)
    call = _answer_call(chapter, ex)
    expected = execute(load_reference(chapter), call)
    pairs = HINTS_OF(ex.name)
    assert pairs
    for wrong, text in pairs:
        assert wrong.shape != right.shape or not bool(close(wrong, right).all()), (ex.name, wrong)
        assert not _gives_away(text, right, wrong), (ex.name, text)
        # and what the grader shows for that wrong answer: the message and the hint
        student = execute({ex.target: wrong.tolist()}, call)
        m = judge(ex, call, student, expected).mismatch
        assert m is not None and m.hint == text, (ex.name, m)
        assert not _gives_away(f"{m.message} {m.hint}", right, wrong), (ex.name, m.message)


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_the_package_source_holds_no_distinctive_answer(chapter, ex):
    """An answer that is no everyday number (552, not 0.5) appears nowhere in the package."""
    right = _right(chapter, ex)
    distinctive = [x for x in right.flatten().tolist() if math.isfinite(x) and abs(x) >= 10]
    for x in distinctive:
        token = re.compile(rf"(?<![\w.]){int(x) if x == int(x) else x}(?![\w])")
        found = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if token.search(p.read_text())]
        assert not found, (ex.name, x, found)


# ------------------------------------------------------------------ no device row
GRADER = Grader(device="cpu")


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_grading_a_written_answer_gives_one_row_at_full_weight(chapter, ex):
    right = _right(chapter, ex)
    for value, points in ((right.tolist(), ex.points), ((right + 1).tolist(), 0.0)):
        ns = dict(load_reference(chapter))
        ns[ex.target] = value
        tests = GRADER.grade_namespace(CHAPTERS[chapter], ns, exercises=[ex.name])
        assert [(t.device, t.max_score) for t in tests] == [("cpu", ex.points)], tests
        assert tests[0].score == pytest.approx(points)
        assert all(c.device == "cpu" for c in tests[0].cases)
    # with CUDA in the plan too (no GPU needed: an answer has no device variant)
    cases = build_cases(chapter, ex.name, load_reference(chapter), seed=SELF_CHECK_SEED, quick=True)
    assert variants(cases, "meta") == [] and variants(cases, "cuda") == []
    assert exercise_tests(ex, ["cpu", "cuda"]) == [("cpu", 1.0)]
    ns = dict(load_reference(chapter))
    tests = grade_exercise(CHAPTERS[chapter], ex, lambda c: execute(ns, c), ["cpu", "cuda"], seed=1)
    assert [(t.device, t.max_score, t.score) for t in tests] == [("cpu", ex.points, ex.points)]
    # a chapter that could not be graded: one zero row too
    rows = [t for t in zero_chapter(CHAPTERS[chapter], ["cpu", "meta"], "not graded") if t.exercise == ex.name]
    assert [(t.device, t.max_score) for t in rows] == [("cpu", ex.points)]


def test_code_exercises_keep_their_device_row():
    ch = CHAPTERS["02_scaled_dot_product_attention"]
    ex = ch.exercise("scaled_dot_product_attention")
    assert [d for d, _ in exercise_tests(ex, ["cpu", "meta"])] == ["cpu", "meta"]

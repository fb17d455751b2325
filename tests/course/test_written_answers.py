"""Written answers ("predict the output", contract kind "answer") are checked without storing
them: the self-check runs in the student's own kernel, beside the package's public source, so
nothing there may give an answer back, and trying values there must teach nothing.

- the self-check data of an answer hold no number (nor list of numbers) equal to the answer;
- the self-check says the same for every value of the asked form (a brute-force loop over
  candidate values learns nothing); it flags only the form (stub, not numbers, wrong shape);
- no hint of a likely wrong answer, and no grader message, states the right value or a sum that
  gives it, and the package source holds no distinctive answer;
- grading a written answer gives one test at full weight: no meta or CUDA row;
- no written answer can be computed from the package's files: the hints of likely wrong answers
  and those wrong answers are the instructor's data (the solution notebooks), never the package's,
  whose hint functions give nothing without them; no file of the package holds an answer or a
  wrong answer of the table; the grader's verdict on a wrong answer has no count or index of
  wrong entries (resubmitting cannot narrow an answer down entry by entry);
- no answer stands in its chapter's book page or exercise notebook (the sources here; the
  rendered pages, with their outputs, in tests/course/test_site.py).
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

from autograder.shared import wire
from autograder.cases.written_answers import ANSWER_ATOL, _hint_table, close, hint_table
from autograder.cases import build_cases
from autograder.cases.other_kinds import HINTS
from autograder.shared.contract import CHAPTERS
from autograder.runtime.execute import execute
from autograder.grading.grader import Grader
from autograder.grading.scoring import exercise_tests, zero_chapter
from autograder.grading.judge import grade_exercise, judge
from autograder.grading.variants import variants
from autograder.cases.inputs import SELF_CHECK_SEED
from autograder.references.solutions import load_reference
from autograder.selfcheck import DATA, SelfCheckFailed, check, run_checks
from autograder.cases.selfcheck_data import build_fixtures

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "autograder"

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
    """The instructor's (wrong answer, hint) pairs of an answer, from its solution notebook."""
    ((chapter, _),) = [k for k in HINTS if k[1] == ex_name]
    return hint_table(chapter, ex_name)


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


# ------------------------------------------------------------------ nothing to compute from the package
def _package_texts() -> dict[str, str]:
    """Every text file of the package (what a student installs; the self-check data are checked
    entry by entry above), whitespace normalised."""
    return {str(p.relative_to(PACKAGE)): " ".join(p.read_text(encoding="utf-8", errors="replace").split())
            for p in sorted(PACKAGE.rglob("*")) if p.is_file() and p.suffix != ".agw" and "__pycache__" not in p.parts}


def _bools_as_numbers(text: str) -> str:
    return re.sub(r"\bTrue\b", "1", re.sub(r"\bFalse\b", "0", text))


def _distinctive_numbers(value: torch.Tensor) -> list[float]:
    """The numbers of an answer that would not turn up in a file by chance: 10 or more, or not a
    multiple of 0.01 (sin(3) = 0.1411..., not 0.5)."""
    return [x for x in value.flatten().tolist()
            if math.isfinite(x) and (abs(x) >= 10 or abs(x * 100 - round(x * 100)) > 1e-6)]


def _written_in(x: float, text: str) -> bool:
    """Whether `text` writes the number x (to its shown digits, at least three significant)."""
    for token in NUMBER.findall(text):
        if "/" in token:
            continue
        digits = len(token.lstrip("-").replace(".", "").lstrip("0"))
        if (digits >= 3 or abs(x) >= 10) and abs(float(token) - x) <= 0.5 * 10 ** -len(token.partition(".")[2]):
            return True
    return False


def _findable(value: torch.Tensor, texts: dict) -> list[str]:
    return sorted({name for x in _distinctive_numbers(value) for name, text in texts.items() if _written_in(x, text)})


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_no_written_answer_can_be_computed_from_the_package(chapter, ex, tmp_path, monkeypatch):
    """What a student holds is the package: its hint functions, with the solutions out of reach,
    answer nothing for any value; no package file holds the answer, nor any wrong answer of the
    instructor's table (hints for 512, 520 and 544 gave 552 away)."""
    right = _right(chapter, ex)
    table = HINTS_OF(ex.name)
    assert table, f"{ex.name}: the instructor's table of likely wrong answers is empty"
    # 1. the package's own hint function, on a machine without the solutions, is no oracle
    call = _answer_call(chapter, ex)
    expected = execute(load_reference(chapter), call)
    monkeypatch.setenv("AUTOGRADER_SOLUTIONS", str(tmp_path))
    _hint_table.cache_clear()
    try:
        assert hint_table(chapter, ex.name) == []
        explain = HINTS[chapter, ex.name].explain
        for value in _candidates(right, ex.name):
            student = execute({ex.target: value}, call)
            m = judge(ex, call, student, expected).mismatch
            if m is not None:
                assert explain(call, student, expected, m) is None and m.hint is None, (ex.name, value, m.hint)
    finally:
        _hint_table.cache_clear()
    # 2. no file of the package holds the answer, nor a hint of the table (nor so its wrong answer)
    texts = _package_texts()
    assert not _findable(right, texts), (ex.name, right.tolist(), _findable(right, texts))
    for _, hint in table:
        assert not [name for name, text in texts.items() if " ".join(hint.split()) in text], (ex.name, hint)


def test_the_package_check_finds_planted_answers():
    """The scan finds an answer written into the package's source, as the old hint table and a
    stored vector would be, and passes numbers that only look alike."""
    texts = {"cases/extra.py": "(552, 'count each bias'), (0.1411, -0.99, 0.03, 0.9996)"}
    assert _findable(torch.tensor(552.0, dtype=torch.float64), texts) == ["cases/extra.py"]
    assert _findable(torch.tensor([math.sin(3), math.cos(3), math.sin(.03), math.cos(.03)]), texts) == ["cases/extra.py"]
    assert _findable(torch.tensor([math.sin(3)]), {"x.py": "rtol=0.15, atol=0.1"}) == []


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_a_wrong_answer_gets_one_verdict_with_no_count_or_index(chapter, ex):
    """One entry wrong and every entry wrong read the same (but for the value written): no
    resubmission learns which entries are right."""
    right = _right(chapter, ex)
    call = _answer_call(chapter, ex)
    expected = execute(load_reference(chapter), call)
    one = right.clone().flatten()
    one[0] += 1
    messages = set()
    for value in (one.reshape(right.shape), right + 1):
        m = judge(ex, call, execute({ex.target: value.tolist()}, call), expected).mismatch
        assert m is not None and m.where in (None, [])
        messages.add(re.sub(r"\(you wrote [^)]*\)", "", m.message))
    assert len(messages) == 1, messages
    assert not re.search(r"\bindex\b|\d+ of \d+", messages.pop())


# ------------------------------------------------------------------ not on the page
def _chapter_texts(chapter: str) -> dict[str, str]:
    import nbformat

    nb = nbformat.read(REPO / "exercises" / f"{chapter}.ipynb", as_version=4)
    return {f"book/{chapter}.md": (REPO / "book" / f"{chapter}.md").read_text(encoding="utf-8"),
            f"exercises/{chapter}.ipynb": "\n".join(c.source for c in nb.cells)}


SEPARATOR = re.compile(r"[\s,;()\[\]]+")


def answer_on_page(value: torch.Tensor, text: str) -> bool:
    """Whether `text` states the answer: its numbers in a row, as a list, tuple or printed tensor
    writes them (only separators between them, booleans as 1/0; not a call's arguments, such as
    randn(3, 4)); for a single number, one that is written as a result ("= 0.5", "is 552").
    Everyday numbers elsewhere in code or prose do not count."""
    text = _bools_as_numbers(text)
    tokens = [(m.start(), m.end(), m.group()) for m in NUMBER.finditer(text)]
    flat = value.flatten()
    n = flat.numel()
    for i in range(len(tokens) - n + 1):
        run = tokens[i:i + n]
        if any("/" in t for _, _, t in run):
            continue
        if not all(SEPARATOR.fullmatch(text[a[1]:b[0]]) for a, b in zip(run, run[1:])):
            continue
        if not bool(close(torch.tensor([float(t) for _, _, t in run], dtype=torch.float64), flat).all()):
            continue
        before = text[max(0, run[0][0] - 12):run[0][0]]
        if n > 1 and not re.search(r"\w\($", before):
            return True
        if n == 1 and (abs(float(flat)) >= 10 or re.search(r"(=|\bis|\bgives|\bequals)\s*$", before)):
            return True
    return False


def test_the_page_check_finds_the_old_answers():
    """The rule catches what the issue found: chapter 4's row 0 and chapter 7's window row."""
    assert answer_on_page(torch.tensor([0., 1, 0, 1, 0, 1]), "Row 0 is (0, 1, 0, 1, 0, 1) for every d_model")
    assert answer_on_page(torch.tensor([0., 0, 1, 1, 1, 0]), "tensor([False, False,  True,  True,  True, False])")
    assert answer_on_page(torch.tensor([3.0, 1.5032]), "print(m, l)\n3.0 1.5032")
    assert answer_on_page(torch.tensor(0.5), "so the gate is sigmoid(0) = 0.5 everywhere")
    assert not answer_on_page(torch.tensor([3.0, 1.5032]), "a maximum of 3 and a sum of 2.37")
    assert not answer_on_page(torch.tensor([[3.0, 4.0]]), "x = torch.randn(3, 4)")
    assert not answer_on_page(torch.tensor(0.5), "axvline(h * c - 0.5)")


@pytest.mark.parametrize("chapter, ex", ANSWERS, ids=IDS)
def test_no_answer_stands_in_its_chapter_page_or_notebook(chapter, ex):
    right = _right(chapter, ex)
    for name, text in _chapter_texts(chapter).items():
        assert not answer_on_page(right, text), (ex.name, name)


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

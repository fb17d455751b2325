"""The student-side check: fixtures in sync with the references, fast, and a useful diagnosis."""
import contextlib
import io
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.shared import wire
from autograder.shared.contract import CHAPTERS
from autograder.references.solutions import load_reference
from autograder.cases.other_kinds import fix_text
from autograder.selfcheck import DATA, SelfCheckFailed, check
from autograder.cases.selfcheck_data import build_fixtures

REPO = Path(__file__).resolve().parents[2]


def _same(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and path.endswith("seconds"):
        pass  # timings differ run to run
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b, path


def test_committed_fixtures_match_the_references():
    """Fails when a solution changed without `python -m autograder selfcheck-data`."""
    fresh = wire.decode(wire.encode(build_fixtures()))
    _same(fresh, wire.load(DATA))


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_references_pass_their_self_checks(chapter):
    """(Their speed, under 1 s a cell, is measured by tools/benchmark.py.)"""
    ref = load_reference(chapter)
    for ex in CHAPTERS[chapter].exercises:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert check(chapter, ex.name, ref[ex.target]) is True
        assert "✓" in out.getvalue()


def test_a_stub_is_reported_as_not_implemented():
    def scaled_dot_product_attention(q, k, v, mask=None):
        raise NotImplementedError()

    with pytest.raises(SelfCheckFailed, match="not implemented yet"):
        check("02_scaled_dot_product_attention", "scaled_dot_product_attention", scaled_dot_product_attention)


def test_an_unscaled_attention_gets_a_diagnosis_with_numbers_and_a_hint():
    def scaled_dot_product_attention(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.nan_to_num(torch.softmax(scores, dim=-1))
        return w @ v, w

    with pytest.raises(SelfCheckFailed) as e:
        check("02_scaled_dot_product_attention", "scaled_dot_product_attention", scaled_dot_product_attention)
    text = str(e.value)
    assert "largest absolute error" in text and "at index" in text
    assert "hint: scores look unscaled" in text
    assert "def " not in text and "reference" not in text.lower().replace("differs from the reference", "")


def test_without_raising_the_check_prints_and_returns_false(capsys):
    assert check("05_masks", "causal_mask", lambda seq_len, device=None: torch.ones(seq_len, seq_len,
                 dtype=torch.bool, device=device), raise_on_failure=False) is False
    assert "✗ causal_mask" in capsys.readouterr().out


# --------------------------------------------------------------------------- the mistake cross-test
# Every realistic mistake of the chapter tests (their BUGGY lists, each asserted there to lose
# points at grading) through the self-check, and every correct variant (the references and the
# CORRECT lists): the self-check must pass every correct variant and flag what the grader
# penalises (at least 95% of the mistakes). Exceptions, (chapter, variant id) -> why: none at present.
SELF_CHECK_MISSES: dict = {}
CHAPTERS_DIR = Path(__file__).resolve().parents[1] / "chapters"  # tests/chapters/, on sys.path (conftest)
CHAPTER_TESTS = sorted(p.stem for p in CHAPTERS_DIR.glob("test_grading_ch*.py"))


def _chapter_variants():
    import importlib

    for name in CHAPTER_TESTS:
        mod = importlib.import_module(name)
        yield mod.CH, mod.BUGGY, getattr(mod, "CORRECT", []) + getattr(mod, "FLOAT32_ROUNDING", [])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_self_check_flags_what_the_grader_penalises_and_passes_correct_code():
    from grading_helpers import namespace_of, self_check_failures

    mistakes, missed, correct_failing = 0, [], []
    for chapter, buggy, correct in _chapter_variants():
        for name, exercise, src, _ in buggy:
            mistakes += 1
            if exercise not in self_check_failures(chapter, namespace_of(chapter, src), [exercise]):
                missed.append((chapter, name))
        for name, src in [("reference", "")] + list(correct):
            failing = self_check_failures(chapter, namespace_of(chapter, src))
            correct_failing += [(chapter, name, ex, m.message) for ex, m in failing.items()]
    assert mistakes >= 134
    assert not correct_failing
    assert set(missed) == set(SELF_CHECK_MISSES), missed
    assert 1 - len(missed) / mistakes >= 0.95


# --------------------------------------------------------------------------- find the bug: symptoms, not fixes
FIND_THE_BUG = [(ch.id, ex.name) for ch in CHAPTERS.values() for ex in ch.exercises if ex.name.startswith("fixed_")]
_CODE = re.compile(r"(?:[\w.]+\s*[-+*/]\s*)?[\w.]+\([^()]*\)|[\w.]*\[[^\]]*\]|[\w.]+\s*[-+*/]\s*[\w.]+")


def _solution_region(chapter: str, name: str) -> tuple[str, str]:
    """(the fix's code, the buggy function's code) of a find-the-bug exercise, from the solution
    notebook: the solution region of `def name`, and the cell that defines `buggy_*`."""
    nb = nbformat.read(REPO / "solutions" / f"{chapter}.ipynb", as_version=4)
    (fix,) = [c.source for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source]
    (buggy,) = [c.source for c in nb.cells if c.cell_type == "code" and "def buggy_" in c.source]
    region = fix.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
    return "\n".join(line.split("#", 1)[0] for line in region.splitlines()), buggy


def fix_fragments(chapter: str, name: str) -> list[str]:
    """The fix's code, as the pieces a hint could quote: each call, subscript and arithmetic of
    the solution that the buggy function does not have (whitespace removed), and the grader's
    own words for the fix."""
    fix, buggy = _solution_region(chapter, name)
    squeeze = lambda t: re.sub(r"\s+", "", t)  # noqa: E731
    words = fix_text(chapter, name)  # the grader's fix, in words and code
    pieces = {squeeze(m) for line in fix.splitlines() + [words] for m in _CODE.findall(line)}
    pieces = {p for p in pieces if len(p) >= 5 and p not in squeeze(buggy)}
    return sorted(pieces) + [squeeze(words)]


@pytest.mark.parametrize("chapter, name", FIND_THE_BUG, ids=[n for _, n in FIND_THE_BUG])
def test_the_self_check_names_the_symptom_of_the_unchanged_bug_not_the_fix(chapter, name):
    """On the buggy function handed in as it is, the self-check says what is wrong (which output,
    on which case, by how much) and never how to fix it; the grader's report gives the fix."""
    from grading_helpers import grade_in, namespace_of

    buggy = "buggy_" + name.removeprefix("fixed_")
    ns = namespace_of(chapter, f"{name} = {buggy}")
    with pytest.raises(SelfCheckFailed) as e:
        check(chapter, name, ns[name])
    text = str(e.value)
    assert "hint:" in text and re.search(r"\d", text.split("hint:", 1)[1]), text  # a symptom, in numbers
    squeezed = re.sub(r"\s+", "", text)
    fragments = fix_fragments(chapter, name)
    assert len(fragments) >= 2, fragments
    leaks = [f for f in fragments if f in squeezed]
    assert not leaks, (name, leaks, text)
    # the grader's report, read after the work is handed in, does give the fix
    hints = grade_in(chapter, ns)[name]["hints"]
    assert any(re.sub(r"\s+", "", fix_text(chapter, name)) in re.sub(r"\s+", "", h) for h in hints), hints


def test_the_fix_check_finds_a_fix_in_a_message():
    """The rule would catch the old hints (chapter 7's and chapter 4's, quoted) and the solution's
    own code."""
    assert "l1*torch.exp(m1-m)" in fix_fragments("07_efficient_attention", "fixed_merge_softmax_stats")
    old = "the sums are still added as they are: rescale each by exp(m_block - m_new) to the new maximum"
    assert any(f in re.sub(r"\s+", "", old) for f in fix_fragments("07_efficient_attention",
                                                                    "fixed_merge_softmax_stats"))
    old = "it must be 2i / d_model (torch.arange(0, d_model, 2))"
    assert any(f in re.sub(r"\s+", "", old) for f in fix_fragments("04_positional_encoding", "fixed_pe_angles"))

"""An exercise still the template's stub raises NotImplementedError whatever its inputs: its
first CPU case is run, and its other CPU cases (of the same kind: calls of the function, or the
module's construction) are judged on that outcome without a run, with the rows a full run gives.
The claim comes from the student's side (`execute.stub_raise`), so it is believed only where it
fails their own cases: code that raises NotImplementedError for some inputs only, a claim on
another error, or a forged one never costs a case the student's code earns."""
from __future__ import annotations

import dataclasses

import pytest

from autograder.grading.grader import Grader
from autograder.grading.judge import _entry_shape, grade_exercise
from autograder.references.cache import REFERENCES
from autograder.runtime.execute import execute, stub_raise
from autograder.shared.calls import Call, Outcome
from autograder.shared.contract import CHAPTERS
from grading_helpers import exercise_namespace, namespace_of

GRADER = Grader(device="cpu")


def _grade(chapter_id: str, name: str, ns: dict, claims: bool = True, forced=None):
    """The exercise's tests and the CPU cases run (indices); `claims=False`: the child's stub
    claim removed, so every case runs (the rows before this rule); `forced(index)`: an outcome
    the run returns for that case instead (a forged one)."""
    chapter = CHAPTERS[chapter_id]
    ex = chapter.exercise(name)
    cases = REFERENCES.cases(chapter_id, name, GRADER.seed, GRADER.quick)
    ran: list[int] = []

    def run(c: Call) -> Outcome:
        index = next(i for i, x in enumerate(cases) if x.case == c.case)
        if c.device == "cpu":
            ran.append(index)
        out = forced(index) if forced else None
        out = out or execute(ns, c, trusted=True)
        if not claims and out.error:
            out.error.pop("stub", None)
        return out

    tests = grade_exercise(chapter, ex, run, GRADER.devices, GRADER.seed, GRADER.quick)
    return cases, tests, ran


def _first_of_each_shape(cases) -> list[int]:
    """The cases run for an untouched exercise: the first of each call shape (arguments' number
    and names: `judge._entry_shape`), the memory case besides."""
    first: dict = {}
    for i, c in enumerate(cases):
        if c.capped_memory:
            first[("memory", i)] = i
        else:
            first.setdefault(_entry_shape(c), i)
    return sorted(first.values())


def _rows(tests) -> list:
    return [(t.device, t.score, t.note, [dataclasses.asdict(c) for c in t.cases]) for t in tests]


@pytest.mark.parametrize("chapter_id,name", [("03_multi_head_attention", "split_heads"),
                                             ("03_multi_head_attention", "MultiHeadAttention"),
                                             ("08_transformer", "TransformerBlock")])
def test_an_untouched_stub_runs_one_case_of_each_call_shape_and_gives_the_rows_of_a_full_run(chapter_id, name):
    ns = exercise_namespace(chapter_id)
    cases, tests, ran = _grade(chapter_id, name, ns)
    _, full, ran_all = _grade(chapter_id, name, ns, claims=False)
    assert len(cases) > 3 and ran == _first_of_each_shape(cases) and len(ran) < len(cases) / 2
    assert len(ran_all) == len(cases)
    assert _rows(tests) == _rows(full)
    assert all(t.score == 0 for t in tests)


# Stubs as a review wrote them (stop 50), each with rows of its own that a full run gives.
STUBS_OF_THEIR_OWN = {
    "a base of the student's own raises the ValueError a case asks for": ("03_multi_head_attention", "MultiHeadAttention", """
class _HeadsBase(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
class MultiHeadAttention(_HeadsBase):
    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__(embed_dim, num_heads, bias, dropout)
        raise NotImplementedError()
"""),
    "a parameter named otherwise (attn_mask): the mask cases' TypeError and its hint": (
        "02_scaled_dot_product_attention", "scaled_dot_product_attention", """
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    raise NotImplementedError("todo")
"""),
}


@pytest.mark.parametrize("which", sorted(STUBS_OF_THEIR_OWN))
def test_a_stub_that_does_more_gives_the_rows_of_a_full_run(which):
    ch, name, src = STUBS_OF_THEIR_OWN[which]
    ns = namespace_of(ch, src)
    _, tests, ran = _grade(ch, name, ns)
    _, full, ran_all = _grade(ch, name, ns, claims=False)
    assert _rows(tests) == _rows(full)
    assert any(c.passed or "TypeError" in c.message for c in full[0].cases)  # (rows a claim would hide)


PARTIAL = '''
_ref = scaled_dot_product_attention
def scaled_dot_product_attention(q, k, v, mask=None):
    if mask is not None:
        raise NotImplementedError("masks next week")
    return _ref(q, k, v)
'''

BY_A_HELPER = '''
_ref = scaled_dot_product_attention
def _todo():
    raise NotImplementedError()
def scaled_dot_product_attention(q, k, v, mask=None):
    if mask is not None:
        _todo()
    return _ref(q, k, v)
'''


@pytest.mark.parametrize("src", [PARTIAL, BY_A_HELPER])
def test_code_that_raises_not_implemented_for_some_inputs_keeps_the_others(src):
    """A partial implementation is no stub: every case runs, the cases without a mask pass."""
    ch, name = "02_scaled_dot_product_attention", "scaled_dot_product_attention"
    cases, tests, ran = _grade(ch, name, namespace_of(ch, src))
    assert ran == list(range(len(cases)))
    cpu = {c.case: c for c in tests[0].cases}
    no_mask = [c.case for c in cases if c.kwargs.get("mask") is None and len(c.args) < 4 and not c.expect_error]
    assert no_mask and all(cpu[n].passed for n in no_mask)
    assert any(c.not_implemented for c in cpu.values())


def test_a_module_whose_forward_alone_is_a_stub_runs_every_case():
    """The claim is about the code a case enters first (the module's __init__): a forward still
    the stub under a working __init__ does not stop the cases that check the constructor."""
    ch, name = "03_multi_head_attention", "MultiHeadAttention"
    src = '''
_Ref = MultiHeadAttention
class MultiHeadAttention(_Ref):
    def forward(self, query, key=None, value=None, mask=None):
        raise NotImplementedError()
'''
    cases, tests, ran = _grade(ch, name, namespace_of(ch, src))
    assert ran == list(range(len(cases)))
    errors = [c.case for c in cases if c.expect_error]
    assert errors and all(r.passed for r in tests[0].cases if r.case in errors)


def test_a_forged_claim_never_credits_a_case():
    """A child claiming the stub on an error that is not NotImplementedError is not believed
    (every case runs); one claiming it on NotImplementedError only fails its own cases."""
    ch, name = "02_scaled_dot_product_attention", "scaled_dot_product_attention"
    ns = namespace_of(ch, "")

    def forged(kind):
        def outcome(index):
            if index == 0:
                out = Outcome.failure(kind, "no")
                out.error["stub"] = True
                return out
            return None
        return outcome

    cases, tests, ran = _grade(ch, name, ns, forced=forged("ValueError"))
    assert ran == list(range(len(cases)))
    assert [r.passed for r in tests[0].cases] == [False] + [True] * (len(cases) - 1)
    cases, tests, ran = _grade(ch, name, ns, forced=forged("NotImplementedError"))
    claimed = [i for i, c in enumerate(cases) if _entry_shape(c) == _entry_shape(cases[0])]
    assert len(claimed) > 1 and not set(claimed[1:]) & set(ran)
    assert [r.passed for r in tests[0].cases] == [i not in claimed for i in range(len(cases))]


def _raised(ns: dict, target: str, call: Call) -> BaseException:
    try:
        obj = ns[target]
        obj(**call.init) if call.init is not None else obj(*call.args, **call.kwargs)
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("did not raise")


@pytest.mark.parametrize("src,is_stub", [
    ('def f(x, n):\n    """Doc."""\n    # YOUR CODE HERE\n    raise NotImplementedError()\n', True),
    ('def f(x, n):\n    raise NotImplementedError("later")\n', True),
    ('def f(x, n):\n    if n:\n        raise NotImplementedError()\n    return x\n', False),
    ('def f(x, n):\n    print(x)\n    raise NotImplementedError()\n', False),
    ('def f(x, n):\n    raise NotImplementedError(n)\n', False),
    ('def f(x, n):\n    try:\n        pass\n    finally:\n        raise NotImplementedError()\n', False),
    ('class NotImplementedError(Exception):\n    pass\ndef f(x, n):\n    raise NotImplementedError()\n', False),
    ('class E(NotImplementedError):\n    pass\ndef f(x, n):\n    raise E()\n', False),
    ('import functools\ndef g(x, n):\n    raise NotImplementedError()\n'
     '@functools.wraps(g)\ndef f(*a, **k):\n    return g(*a, **k)\n', False),
])
def test_what_the_child_calls_a_stub(src, is_stub):
    ns: dict = {}
    exec(src, ns)
    call = Call("x", "e", "case", "f", args=[1, 2])
    assert stub_raise(_raised(ns, "f", call), ns["f"], call) is is_stub


@pytest.mark.parametrize("src,is_stub", [
    ('import torch\nclass M(torch.nn.Module):\n    def __init__(self, d):\n        super().__init__()\n'
     '        # YOUR CODE HERE\n        raise NotImplementedError()\n', True),
    ('import torch\nclass M(torch.nn.Module):\n    def __init__(self, d):\n        super().__init__()\n'
     '        if d > 2:\n            raise NotImplementedError()\n', False),
    ('import torch\nclass Meta(type(torch.nn.Module)):\n    pass\nclass M(torch.nn.Module, metaclass=Meta):\n'
     '    def __init__(self, d):\n        raise NotImplementedError()\n', False),
    ('import torch\nclass M(torch.nn.Module):\n    def __new__(cls, *a, **k):\n        return super().__new__(cls)\n'
     '    def __init__(self, d):\n        raise NotImplementedError()\n', False),
])
def test_what_the_child_calls_a_module_stub(src, is_stub):
    ns: dict = {}
    exec(src, ns)
    call = Call("x", "e", "case", "M", init={"d": 4})
    assert stub_raise(_raised(ns, "M", call), ns["M"], call) is is_stub


def test_through_the_sandbox_a_stub_notebook_makes_one_call_an_exercise(monkeypatch):
    """The claim crosses the wire from the sandboxed child: chapter 3's untouched notebook makes
    one CPU call for each call shape of each exercise, and its report is the one every call gave."""
    from pathlib import Path

    from autograder.session import student_session, trust

    notebook = Path(__file__).resolve().parents[2] / "exercises" / "03_multi_head_attention.ipynb"
    calls: list = []
    real_run = student_session.StudentSession.run

    def counted(self, c):
        calls.append(c.exercise)
        return real_run(self, c)

    monkeypatch.setattr(student_session.StudentSession, "run", counted)
    graded = GRADER.grade_path(notebook, jobs=1)
    exercises = [ex.name for ex in CHAPTERS["03_multi_head_attention"].exercises]
    expected = [ex for ex in exercises for _ in _first_of_each_shape(
        REFERENCES.cases("03_multi_head_attention", ex, GRADER.seed, GRADER.quick))]
    assert sorted(calls) == sorted(expected) and len(calls) < 2 * len(exercises)
    believed = trust.plain_error
    monkeypatch.setattr(trust, "plain_error", lambda err: (e := believed(err)) and {
        k: v for k, v in e.items() if k != "stub"})
    calls.clear()
    every = GRADER.grade_path(notebook, jobs=1)
    assert len(calls) > 3 * len(exercises)
    rows = lambda r: [(t.exercise, t.device, t.score, [dataclasses.asdict(c) for c in t.cases])  # noqa: E731
                      for t in r.chapters[0].tests]
    assert rows(graded) == rows(every) and graded.score == every.score == 0


class _CudaOnTheCpu:
    """The reference outcomes, with a CUDA case's taken from the same case on the CPU: what a
    GPU gives, on a machine without one (for the judge's bookkeeping, not for values)."""

    def __init__(self, real):
        self.real = real

    def cases(self, *args):
        return self.real.cases(*args)

    def expected(self, call, key):
        if call.device != "cuda":
            return self.real.expected(call, key)
        return self.real.expected(call.on("cpu", call.dtype), (*key, "cuda-on-the-cpu"))

    def with_float32(self, call, key, expected):
        return expected


@pytest.mark.parametrize("name", ["split_heads", "MultiHeadAttention"])
def test_on_a_gpu_a_stubs_cuda_rows_are_judged_on_its_cpu_outcome(name):
    """With a GPU, every case runs on CUDA too (no device check): an untouched exercise's CUDA
    rows take the stub's outcome, as a run of each gives them."""
    ch = "03_multi_head_attention"
    chapter, ns = CHAPTERS[ch], exercise_namespace(ch)
    references = _CudaOnTheCpu(REFERENCES)
    cases = references.cases(ch, name, GRADER.seed, GRADER.quick)

    def grade(claims: bool):
        ran = []

        def run(c: Call) -> Outcome:
            ran.append(c.device)
            out = execute(ns, c.on("cpu", c.dtype) if c.device == "cuda" else c, trusted=True)
            if out.error and not claims:
                out.error.pop("stub", None)
            return out
        tests = grade_exercise(chapter, chapter.exercise(name), run, ["cpu", "cuda"], GRADER.seed,
                               GRADER.quick, references=references)
        return tests, ran

    tests, ran = grade(True)
    full, ran_all = grade(False)
    assert ran == ["cpu"] * len(_first_of_each_shape(cases)) and ran_all.count("cuda") >= len(cases)
    assert [t.device for t in tests] == ["cpu", "cuda"] and _rows(tests) == _rows(full)

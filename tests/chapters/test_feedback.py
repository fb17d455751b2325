"""What a student reads after porting someone else's code (tests/ports.py): the hint names the
actual mistake, never blames an exercise the code does not use, and every hint that suggests
code is right: the suggestion, applied to the mistaken port, gets full marks."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from grading_helpers import GRADER, full, grade_in, namespace_of
from ports import PORTS

from autograder.report.text import exercise_lines
from autograder.shared.contract import CHAPTERS

BY_NAME = {p.name: p for p in PORTS}


def _graded(port_name: str, replace: tuple = ()):
    p = BY_NAME[port_name]
    src = p.src
    for old, new in replace:
        assert old in src, old
        src = src.replace(old, new)
    return grade_in(p.chapter, namespace_of(p.chapter, src))[p.exercise]


def _shown(e) -> list[str]:
    """The hints the report shows for this exercise, and the first failure's message."""
    return e["hints"] + ([e["first"].message] if e["first"] else [])


@pytest.mark.parametrize("port", [p for p in PORTS if p.mistake and p.issue_item], ids=lambda p: p.name)
def test_a_ported_mistake_loses_points_and_is_named(port):
    e = _graded(port.name)
    assert e["score"] < e["max"]
    assert any(port.words in text for text in _shown(e)), (port.mistake, _shown(e))


@pytest.mark.parametrize("port", [p for p in PORTS if p.mistake is None], ids=lambda p: p.name)
def test_a_correct_port_gets_full_marks(port):
    result = grade_in(port.chapter, namespace_of(port.chapter, port.src))
    assert all(full(e) for e in result.values()), {k: (e["score"], e["hints"]) for k, e in result.items()}


# ----------------------------------------------------------------------------- item 1
def test_no_prerequisite_is_blamed_when_the_code_does_not_define_or_call_it():
    for name in ("annotated-transformer MultiHeadedAttention (linears list)", "TorchLeet MHA (attn_mask keyword)",
                 "LazyLinear projections"):
        e = _graded(name)
        blamed = [h for t in e["tests"] for c in t.cases for h in [c.hint] if h and "fails its own tests" in h]
        assert not blamed, (name, blamed)


def test_a_prerequisite_the_code_calls_is_still_blamed():
    """MultiHeadAttention calls a wrong merge_heads: the hint points there."""
    src = BY_NAME["TorchLeet MHA (attn_mask keyword)"].src.replace("attn_mask", "mask")
    ns = namespace_of("03_multi_head_attention", src + """
def merge_heads(x):
    return x.transpose(-3, -2).flatten(-2) * 2   # a mistake no chapter-3 model names
""")
    e = grade_in("03_multi_head_attention", ns)["MultiHeadAttention"]
    assert any("`merge_heads` fails its own tests too" in h for h in e["hints"]), e["hints"]
    # The device check's rows are not recorded (the hook would cost a quarter of their CPU):
    # each takes what its CPU twin called, so the hint stands there too.
    device = next(t for t in e["tests"] if t.device == "fake-cuda")
    failing = [c for c in device.cases if not c.passed]
    assert failing and all("merge_heads" in c.used for c in failing), [(c.case, c.used) for c in failing]


def test_only_a_cpu_case_of_the_students_records_what_it_calls():
    from autograder.runtime.execute import execute
    from autograder.shared.calls import Call

    ns = namespace_of("03_multi_head_attention")
    mha = Call("03_multi_head_attention", "MultiHeadAttention", "self-attention", "MultiHeadAttention",
               init={"embed_dim": 8, "num_heads": 2}, args=[torch.randn(2, 3, 8, dtype=torch.float64)])
    assert execute(ns, mha).called == ["merge_heads", "split_heads"]
    assert execute(ns, mha.on("fake-cuda", "float32")).called == []
    assert execute(ns, mha, trusted=True, record=False).called == []  # (the reference's runs)
    # The grader's calls name the prerequisites to watch: those that failed (`Call.watch`).
    assert execute(ns, dataclasses.replace(mha, watch=["merge_heads"])).called == ["merge_heads"]
    assert execute(ns, dataclasses.replace(mha, watch=[])).called == []


def _watched(chapter: str, ns: dict) -> dict:
    """exercise -> the `Call.watch` of each CPU call the grader made, grading `ns` in full."""
    from autograder.grading.grader import grade_chapter
    from autograder.runtime.execute import execute

    seen: dict = {}

    def run(call):
        if call.device == "cpu":
            seen.setdefault(call.exercise, []).append(call.watch)
        return execute(ns, call)
    grade_chapter(CHAPTERS[chapter], run, GRADER.devices, GRADER.seed)
    return seen


def test_the_grader_watches_only_the_prerequisites_that_failed():
    """The recording hook slows every Python call of the student's code: a student whose
    foundations pass has none of their calls watched; one whose merge_heads fails has that
    one watched, and split_heads not."""
    solution = _watched("03_multi_head_attention", namespace_of("03_multi_head_attention"))
    assert solution["MultiHeadAttention"] and all(w == [] for w in solution["MultiHeadAttention"])
    assert all(w is None for w in solution["split_heads"])  # (it builds on nothing)
    wrong = _watched("03_multi_head_attention", namespace_of("03_multi_head_attention", """
def merge_heads(x):
    return x.transpose(-3, -2).flatten(-2) * 2
"""))
    assert all(w == ["merge_heads"] for w in wrong["MultiHeadAttention"]), wrong["MultiHeadAttention"]
    assert all(w == ["merge_heads"] for w in wrong["MultiHeadSelfAttention"])


def test_a_renamed_keyword_is_named():
    e = _graded("TorchLeet MHA (attn_mask keyword)")
    assert any("`mask=`" in h for h in e["hints"]), e["hints"]
    fixed = _graded("TorchLeet MHA (attn_mask keyword)", [("attn_mask", "mask")] * 1)
    assert fixed["score"] > e["score"]


# ----------------------------------------------------------------------------- item 2
def test_the_report_shows_the_hint_most_failing_cases_share_and_counts_them():
    e = _graded("fused qkv as (B, N, H, 3, d_h)")
    cpu = next(t for t in e["tests"] if t.device == "cpu")
    failing = len(cpu.cases) - cpu.passed
    lines = exercise_lines([cpu])
    layout = [line for line in lines if "(B, N, 3, H, d_h)" in line]
    assert layout and f"of {failing} failing cases)" in layout[0], lines


# ----------------------------------------------------------------------------- items 3, 4, 8: code hints work
FLOAT_MASK_FIX = ('masked_fill(mask == 0, -1e9)', 'masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool '
                  'else scores + mask')


def test_the_float_mask_hint_applied_gives_full_marks():
    """The hint says: a float mask is added, only a boolean one goes through masked_fill (and the
    fully-masked-row hint: zero such rows); both applied, the port is right."""
    e = _graded("annotated-transformer attention")
    assert any("read as a boolean one" in h for h in e["hints"]), e["hints"]
    fixed = _graded("annotated-transformer attention", [
        ("scores = scores.masked_fill(mask == 0, -1e9)",
         "scores = scores.masked_fill(~mask, float('-inf')) if mask.dtype == torch.bool else scores + mask"),
        ("p_attn = scores.softmax(dim=-1)",
         "dead = torch.isneginf(scores).all(-1, keepdim=True)\n"
         "    p_attn = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)"),
    ])
    assert full(fixed), fixed["hints"]


def test_the_nan_to_num_hint_applied_gives_full_marks():
    e = _graded("nan_to_num after softmax")
    assert any("nan_to_num after the softmax leaves NaN in the backward pass" in h for h in e["hints"])
    fixed = _graded("nan_to_num after softmax", [(
        "weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)",
        "dead = torch.isneginf(scores).all(-1, keepdim=True)\n"
        "    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)")])
    assert full(fixed), fixed["hints"]


def test_nan_to_num_is_hinted_in_chapter_3_too():
    ns = namespace_of("03_multi_head_attention", BY_NAME["LazyLinear projections"].src.replace("LazyLinear(", "Linear(embed_dim, ").replace(
        "w = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)",
        "w = torch.softmax(s, -1).nan_to_num(0.0)"))
    e = grade_in("03_multi_head_attention", ns)["MultiHeadAttention"]
    assert e["score"] < e["max"]
    assert any("nan_to_num" in h for h in e["hints"]), e["hints"]


@pytest.mark.parametrize("name", ["AlphaFold worksheet (-1e8 offset)", "worksheet offset turned into -inf"])
def test_the_worksheet_masking_hint_applied_gives_full_marks(name):
    """Chapter 6's hint suggests masked_fill code; pasted in place of the offset, it is right."""
    e = _graded(name)
    assert any("keep = attention_mask[..., None, None, :] != 0" in h for h in e["hints"]), e["hints"]
    fixed = _graded(name, [("    if attention_mask is not None:\n        a = a + ",
                            "    if attention_mask is not None:\n        _unused = "),
                           ("    a = torch.softmax(a, dim=-1)\n",
                            "    if attention_mask is not None:\n"
                            "        keep = attention_mask[..., None, None, :] != 0\n"
                            "        a = a.masked_fill(~keep, float('-inf'))\n"
                            "        dead = ~keep.any(-1, keepdim=True)\n"
                            "        a = torch.softmax(a.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)\n"
                            "    else:\n"
                            "        a = torch.softmax(a, dim=-1)\n")])
    assert full(fixed), fixed["hints"]


def test_the_batch_axes_hint_applied_gives_full_marks():
    fixed = _graded("d2l DotProductAttention", [("torch.bmm(q, k.transpose(1, 2))", "q @ k.transpose(-2, -1)"),
                                                ("torch.bmm(weights, v)", "weights @ v")])
    assert full(fixed), fixed["hints"]


def test_the_extra_axis_hint_applied_gives_full_marks():
    fixed = _graded("annotated-transformer subsequent_mask", [("(1, seq_len, seq_len)", "(seq_len, seq_len)")])
    assert full(fixed), fixed["hints"]


# ----------------------------------------------------------------------------- items 6, 7, 9
def test_lazy_layers_are_reported_in_the_students_terms():
    e = _graded("LazyLinear projections")
    message = e["first"].message
    assert "do not exist yet after __init__" in message and "nn.Linear(in_features, out_features)" in message
    assert "uninitialized parameter" not in message  # torch's words from the grader's own probe


def test_a_relative_error_is_not_printed_where_the_expected_value_is_0():
    e = _graded("annotated-transformer attention")
    zero = [c.message for t in e["tests"] for c in t.cases if "expected 0)" in c.message]
    assert zero and all("relative" not in m for m in zero), zero


def test_the_no_nan_hint_is_given_only_where_a_row_is_fully_masked():
    """minGPT gives NaN only on fully masked rows; cases without one must not carry that hint."""
    e = _graded("minGPT CausalSelfAttention")
    for t in e["tests"]:
        for c in t.cases:
            if c.hint and "gives NaN" in c.hint:
                assert "fully masked" in c.case, c.case


@pytest.mark.parametrize("name", ["annotated-transformer PositionalEncoding (1, max_len, d) buffer",
                                  "PyTorch tutorial PositionalEncoding (max_len, 1, d) buffer"])
def test_a_pe_buffer_of_another_shape_loses_the_structure_case_only(name):
    e = _graded(name)
    cpu = next(t for t in e["tests"] if t.device == "cpu")
    failed = [c for c in cpu.cases if not c.passed]
    assert [c.case for c in failed] == [cpu.cases[0].case] and "(max_len, d_model)" in failed[0].case
    assert "expected (20, 8)" in failed[0].message


# ----------------------------------------------------------------------------- the feedback page (issue 20, item 5)
def _submission(path: str, *tests):
    from autograder.grading.results import ChapterResult, SubmissionResult

    return SubmissionResult(path, [ChapterResult("01_intuition", f"{path}/01_intuition.ipynb", list(tests))])


def _test(exercise: str, device: str, passed: list[bool]):
    from autograder.grading.results import CaseResult, TestResult

    cases = [CaseResult(f"case {i}", device, "float64", ok, "" if ok else "values", "" if ok else "wrong values")
             for i, ok in enumerate(passed)]
    return TestResult("01_intuition", exercise, device, 1.0 * sum(passed), float(len(passed)), cases)


def test_the_feedback_page_shows_no_absolute_path():
    from autograder.report import html

    page = html.render(_submission("/home/instructor/secret-course/submissions/alice",
                                   _test("softmax", "cpu", [True])))
    assert "<title>Feedback: alice</title>" in page and "/home/instructor" not in page


def test_meta_is_explained_once_in_each_report():
    from autograder.report import html, text

    result = _submission("alice", _test("softmax", "cpu", [True, True]), _test("softmax", "meta", [True, True]),
                         _test("attention_pool", "cpu", [True]), _test("attention_pool", "meta", [False]))
    assert text.META_NOTE.startswith("fake-cuda: ") and "as if on a GPU" in text.META_NOTE
    assert text.render(result).count(text.META_NOTE) == 1
    assert html.render(result).count("as if on a GPU") == 1
    cpu_only = _submission("bob", _test("softmax", "cpu", [True]))
    assert "as if on a GPU" not in html.render(cpu_only) + text.render(cpu_only)


def test_case_counts_are_plural_only_when_more_than_one():
    from autograder.report import html

    page = html.render(_submission("alice", _test("softmax", "cpu", [True]), _test("attention_pool", "cpu", [False]),
                                   _test("predict_softmax_large", "cpu", [True, True, True]),
                                   _test("fixed_softmax_rows", "cpu", [True, False])))
    assert "1 case passed" in page and "all 1 cases" not in page
    assert "0 of 1 case passed" in page and "all 3 cases passed" in page and "1 of 2 cases passed" in page


def test_a_syntax_error_shows_in_its_exercises_row(tmp_path):
    """A SyntaxError in softmax's cell: the missing softmax's row says which cell failed and how,
    in the terminal report and in the HTML table (as well as above the table)."""
    import json
    import re

    from autograder.grading.grader import Grader
    from autograder.report import html, text
    from grading_helpers import REPO

    nb = json.loads((REPO / "solutions" / "01_intuition.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "".join(c["source"]).startswith("def softmax("))
    cell["source"] = "".join(cell["source"]).replace("def softmax(x, dim=-1):", "def softmax(x dim=-1):")
    (tmp_path / "01_intuition.ipynb").write_text(json.dumps(nb))
    result = Grader(device="cpu").grade_path(tmp_path / "01_intuition.ipynb")
    softmax = next(t for t in result.chapters[0].tests if t.exercise == "softmax" and t.device == "cpu")
    assert re.search(r"is not defined in the notebook\. It is defined in cell \d+, which failed: SyntaxError",
                     softmax.note), softmax.note
    pool = next(t for t in result.chapters[0].tests if t.exercise == "attention_pool" and t.device == "cpu")
    assert "SyntaxError" not in pool.note  # (defined in a cell of its own, which ran)
    row = next(r for r in html.render(result).split("<tr>") if r.startswith("<td>softmax</td><td>cpu</td>"))
    assert "SyntaxError" in row
    lines = text.render(result).splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("✗ softmax"))
    assert "SyntaxError" in lines[at + 1]


# ----------------------------------------------------------------------------- float32 policy
def test_a_llama_style_float32_softmax_gets_full_marks_with_the_note_on_the_large_input_case():
    """The float32 policy covers gradients too: on "large inputs (scaled by 30)" the float32
    softmax's gradients are off by as much as the reference's own float32 run (about 4e-5 on
    q_proj.weight, beyond float32's tolerance of the float64 values), so they are compared with
    that run: full marks, with the note, and no precision hint."""
    from autograder.grading.compare import FLOAT32_NOTE
    e = _graded("LLaMA attention (float32 softmax)")
    assert e["score"] == e["max"], _shown(e)
    large = [c for t in e["tests"] if t.device == "cpu" for c in t.cases if c.case.startswith("large inputs")]
    assert large and all(c.passed and c.note == FLOAT32_NOTE for c in large), large


def test_the_float32_policy_does_not_pass_a_float32_mistake():
    """A float32 softmax whose scores are also unscaled is still a mistake: the policy allows
    float32's rounding, never a different computation."""
    e = _graded("LLaMA attention (float32 softmax)", replace=(("/ math.sqrt(self.head_dim)", ""),))
    assert e["score"] < e["max"] and any("sqrt" in h for h in _shown(e)), _shown(e)

"""The exercises of other kinds than "implement", two per chapter (autograder/cases/other_kinds.py):
"predict the output" (`predict_*`, a value the student writes; contract kind "answer") and
"find the bug" (`fixed_*`, the corrected version of a buggy function the notebook gives).

Wrong answers and the unfixed bug lose that exercise's points only, with a clear message and,
for the likely ones, a hint; the self-check flags the unfixed bugs (of a written answer, only
its form: tests/course/test_written_answers.py); right answers written in other forms
(rounded to two decimals, a tensor, booleans as 0/1) and correct fixes written differently
score full marks. Full marks for the reference and zero for the stubs: test_grading.py."""
import pytest

from autograder.shared.contract import CHAPTERS
from autograder.selfcheck import SelfCheckFailed, check

from grading_helpers import check_buggy, check_equivalent, grade_in, namespace_of

I, S, M, P, K, G, E, T = ("01_intuition", "02_scaled_dot_product_attention", "03_multi_head_attention",
                          "04_positional_encoding", "05_masks", "06_gated_global_attention",
                          "07_efficient_attention", "08_transformer")

# (id, chapter, exercise, source run on top of the reference, words the hint must contain or None)
BUGGY = [
    # find the bug: the buggy version handed in unchanged, and other likely wrong fixes
    ("softmax-global-max", I, "fixed_softmax_rows", "fixed_softmax_rows = buggy_softmax_rows", "each row's own maximum"),
    ("mask-after-softmax", S, "fixed_masked_attention", "fixed_masked_attention = buggy_masked_attention",
     "after the softmax"),
    ("heads-scaled-by-D", M, "fixed_heads_attention", "fixed_heads_attention = buggy_heads_attention",
     "sqrt(D // num_heads)"),
    ("angles-pair-index", P, "fixed_pe_angles", "fixed_pe_angles = buggy_pe_angles", "2i / d_model"),
    ("masked-softmax-1e9", K, "fixed_masked_softmax", "fixed_masked_softmax = buggy_masked_softmax", "uniform"),
    ("masked-softmax-nan", K, "fixed_masked_softmax",
     "def fixed_masked_softmax(scores, mask):\n    return torch.softmax(scores.masked_fill(~mask, float('-inf')), -1)",
     "NaN"),
    ("global-mean-by-length", G, "fixed_global_query", "fixed_global_query = buggy_global_query", "number of positions"),
    ("merge-no-rescale", E, "fixed_merge_softmax_stats", "fixed_merge_softmax_stats = buggy_merge_softmax_stats",
     "rescale"),
    ("loss-not-shifted", T, "fixed_next_token_loss", "fixed_next_token_loss = buggy_next_token_loss", "shifted"),
    # predict the output: likely wrong answers get a hint, others a plain "not the right answer"
    ("softmax-large-nan", I, "predict_softmax_large", "predict_softmax_large = [float('nan')] * 3", "overflows"),
    ("softmax-large-thirds", I, "predict_softmax_large", "predict_softmax_large = [0.33, 0.33, 0.33]", "exp(-inf)"),
    ("equal-keys-last-value", S, "predict_equal_keys_output", "predict_equal_keys_output = [[8, 0]]",
     "weights those scores give"),
    ("equal-keys-sum", S, "predict_equal_keys_output", "predict_equal_keys_output = [[12, 6]]", "add up to"),
    ("split-shape-order", M, "predict_split_heads_shape", "predict_split_heads_shape = [2, 5, 3, 4]",
     "order of the axes"),
    ("pe-row-cos-first", P, "predict_pe_row", "predict_pe_row = [-0.99, 0.14, 1.0, 0.03]", "sines and which cosines"),
    ("pe-row-degrees", P, "predict_pe_row", "predict_pe_row = [0.05, 1.0, 0.0, 1.0]", "radians"),
    ("masked-zero-row", K, "predict_fully_masked_weights",
     "predict_fully_masked_weights = [[0.5, 0.5, 0], [0, 0, 0]]", "-1e9 is"),
    ("masked-nan-row", K, "predict_fully_masked_weights",
     "predict_fully_masked_weights = [[0.5, 0.5, 0], [float('nan')] * 3]", "not -inf"),
    ("gate-zero", G, "predict_zero_gate_factor", "predict_zero_gate_factor = 0", "through a sigmoid"),
    ("stats-no-rescale", E, "predict_online_stats", "predict_online_stats = [3, 2.37]", "new maximum"),
    ("stats-first-block-dropped", E, "predict_online_stats", "predict_online_stats = [3, 1.37]", "still counts"),
    ("params-no-bias", T, "predict_feedforward_params", "predict_feedforward_params = 8 * 32 * 2", "bias"),
    ("params-other", T, "predict_feedforward_params", "predict_feedforward_params = 600", None),
    ("answer-wrong-shape", K, "predict_fully_masked_weights", "predict_fully_masked_weights = [0.5, 0.5, 0]", None),
]


@pytest.mark.parametrize("name, chapter, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_wrong_answer_or_unfixed_bug_loses_that_exercise_only(name, chapter, exercise, src, words):
    # The self-check of a written answer judges its form only, never its value
    # (tests/course/test_written_answers.py): it flags a wrong shape, not a wrong value.
    value_only = CHAPTERS[chapter].exercise(exercise).kind == "answer" and name != "answer-wrong-shape"
    check_buggy(chapter, exercise, src, words, self_check=not value_only)


EQUIVALENT = [
    ("answers-rounded-tensor-bools", I, "predict_softmax_large = torch.tensor([0.499, 0.501, 0])"),
    ("answers-tuple", S, "predict_equal_keys_output = ((4, 2),)"),
    ("answers-ints", M, "predict_split_heads_shape = torch.Size([2, 3, 5, 4])"),
    ("answers-two-decimals-pe", P, "predict_pe_row = [0.14, -0.99, 0.03, 1.0]"),
    ("answers-two-decimals", K, "predict_fully_masked_weights = [[0.5, 0.5, 0], [0.33, 0.33, 0.34]]"),
    ("answers-bools", K, "predict_fully_masked_weights = [[0.5, 0.5, False], [1 / 3, 1 / 3, 1 / 3]]"),
    ("answers-float", G, "predict_zero_gate_factor = 1 / 2"),
    ("answers-tensor-stats", E, "predict_online_stats = torch.tensor([3.0, 1.5])"),
    ("answers-float-params", T, "predict_feedforward_params = 552.0"),
    ("fix-softmax-logsumexp", I,
     "def fixed_softmax_rows(x):\n    return torch.exp(x - torch.logsumexp(x, -1, keepdim=True))"),
    ("fix-with-own-sdpa", S,
     "def fixed_masked_attention(q, k, v, mask):\n    return scaled_dot_product_attention(q, k, v, mask)"),
    ("fix-heads-with-own-split-merge", M,
     "def fixed_heads_attention(q, k, v, num_heads):\n"
     "    q, k, v = (split_heads(t, num_heads) for t in (q, k, v))\n"
     "    w = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, -1)\n"
     "    return merge_heads(w @ v)"),
    ("fix-angles-exp-log", P,
     "def fixed_pe_angles(max_len, d_model):\n"
     "    p = torch.arange(max_len)[:, None]\n"
     "    return p * torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2) / d_model)"),
    ("fix-masked-softmax-where", K,
     "def fixed_masked_softmax(scores, mask):\n"
     "    w = torch.softmax(scores.masked_fill(~mask, -1e9), -1)\n"
     "    return torch.where(mask, w, torch.zeros_like(w))"),
    ("fix-global-eps", G,
     "def fixed_global_query(q, mask):\n"
     "    return torch.einsum('...lc,...l->...c', q, mask) / (mask.sum(-1)[..., None] + 1e-10)"),
    ("fix-merge-logaddexp", E,
     "def fixed_merge_softmax_stats(m1, l1, m2, l2):\n"
     "    m = torch.maximum(m1, m2)\n"
     "    return m, torch.exp(torch.logaddexp(m1 + torch.log(l1), m2 + torch.log(l2)) - m)"),
    ("fix-loss-transpose", T,
     "def fixed_next_token_loss(logits, tokens):\n"
     "    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:])"),
]


@pytest.mark.parametrize("chapter, src", [e[1:] for e in EQUIVALENT], ids=[e[0] for e in EQUIVALENT])
def test_right_answers_in_other_forms_and_other_fixes_score_full_marks(chapter, src):
    check_equivalent(chapter, src)


def test_every_chapter_has_a_predict_and_a_find_the_bug_exercise():
    for ch in CHAPTERS.values():
        answers = [ex for ex in ch.exercises if ex.kind == "answer"]
        fixes = [ex for ex in ch.exercises if ex.name.startswith("fixed_")]
        assert answers and fixes, ch.id
        assert all(1 <= ex.points <= 2 for ex in answers + fixes), ch.id


@pytest.mark.parametrize("value", ['"0.5"', "None", "[[0.5], [0.5, 0.5]]", "{'a': 1}"],
                         ids=["string", "None", "ragged", "dict"])
def test_an_answer_that_is_not_numbers_gets_a_message_not_a_crash(value):
    result = grade_in(G, namespace_of(G, f"predict_zero_gate_factor = {value}"))
    e = result["predict_zero_gate_factor"]
    assert e["score"] == 0 and e["first"] is not None and e["first"].message, e
    assert all(abs(r["score"] - r["max"]) < 1e-9 for name, r in result.items() if name != "predict_zero_gate_factor")


def test_messages_and_self_check_do_not_give_the_answer_away(capsys):
    ns = namespace_of(T, "predict_feedforward_params = 600")
    first = grade_in(T, ns)["predict_feedforward_params"]["first"]
    assert "552" not in first.message and "600" in first.message and "0.01" in first.message
    # the self-check judges the form only: the same words for a wrong and the right value
    assert check(T, "predict_feedforward_params", 600)
    wrong = capsys.readouterr().out
    assert check(T, "predict_feedforward_params", 552)
    assert capsys.readouterr().out == wrong and "recorded" in wrong and "552" not in wrong
    with pytest.raises(SelfCheckFailed, match="a single number"):
        check(T, "predict_feedforward_params", [552])

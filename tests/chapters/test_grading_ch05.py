"""Chapter 5 grading: the reference scores full marks, realistic mistakes lose credit on the
exercise they touch only, hints name the mistake, equivalent formulations score full marks.
What every chapter shares (full marks for the reference, zero for the stubs, the quick cases) is in
test_grading.py."""
import functools

import pytest

from grading_helpers import check_buggy, check_equivalent, grade_in, namespace_of

CH = "05_masks"
namespace = functools.partial(namespace_of, CH)  # the reference with `src` run on top
grade = functools.partial(grade_in, CH)


def causal(body):
    return f"def causal_mask(seq_len, device=None):\n    return {body}\n"


def padding(body):
    return f"def padding_mask(tokens, pad_id=0):\n    return {body}\n"


def decoder(body):
    return (f"def decoder_mask(tokens, pad_id=0):\n    L = tokens.shape[1]\n"
            f"    keep = tokens != pad_id\n    tri = torch.ones(L, L, dtype=torch.bool, device=tokens.device)\n"
            f"    return {body}\n")


# (id, exercise, source, words the hint of the first CPU failure must contain, or None)
BUGGY = [
    ("causal-inverted", "causal_mask",
     causal("torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)"), "inverted"),
    ("causal-upper-triangle", "causal_mask",
     causal("torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu()"), "upper triangle"),
    ("causal-diagonal-excluded", "causal_mask",
     causal("torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril(-1)"), "diagonal must be True"),
    ("causal-additive-float", "causal_mask",
     causal("torch.full((seq_len, seq_len), float('-inf'), device=device).triu(1)"), "boolean mask"),
    ("causal-int", "causal_mask",
     causal("torch.ones(seq_len, seq_len, dtype=torch.long, device=device).tril()"), "boolean mask"),
    ("causal-batch-dim", "causal_mask",
     causal("torch.ones(1, seq_len, seq_len, dtype=torch.bool, device=device).tril()"), None),
    ("padding-shape-B-L", "padding_mask", padding("tokens != pad_id"), "(B, 1, 1, L)"),
    ("padding-shape-B-1-L", "padding_mask", padding("(tokens != pad_id).unsqueeze(1)"), "(B, 1, 1, L)"),
    ("padding-shape-B-L-1-1", "padding_mask", padding("(tokens != pad_id)[:, :, None, None]"), "(B, 1, 1, L)"),
    ("padding-inverted", "padding_mask", padding("(tokens == pad_id)[:, None, None, :]"), "inverted"),
    ("padding-ignores-pad-id", "padding_mask", padding("(tokens != 0)[:, None, None, :]"),
     "pad_id argument is ignored"),
    ("padding-bool-cast", "padding_mask", padding("tokens.bool()[:, None, None, :]"),
     "pad_id argument is ignored"),
    ("padding-float", "padding_mask", padding("(tokens != pad_id).float()[:, None, None, :]"), "boolean mask"),
    ("padding-assumes-right-padding", "padding_mask", padding(
        "(torch.arange(tokens.shape[1], device=tokens.device) < (tokens != pad_id).sum(1, keepdim=True))"
        "[:, None, None, :]"), None),
    ("decoder-or", "decoder_mask", decoder("keep[:, None, None, :] | tri.tril()"), "OR"),
    ("decoder-causal-only", "decoder_mask", decoder("tri.tril().expand(tokens.shape[0], 1, L, L)"),
     "padding is missing"),
    ("decoder-padding-only", "decoder_mask", decoder("keep[:, None, None, :].expand(-1, 1, L, L)"),
     "causal part is missing"),
    ("decoder-padding-on-queries", "decoder_mask", decoder("keep[:, None, :, None] & tri.tril()"),
     "padded query rows are masked"),  # with right padding; left padding tells it apart, below
    ("decoder-padding-on-both-axes", "decoder_mask",
     decoder("keep[:, None, :, None] & keep[:, None, None, :] & tri.tril()"), "padded query rows are masked too"),
    ("decoder-upper-triangle", "decoder_mask", decoder("keep[:, None, None, :] & tri.triu()"), "upper triangle"),
    ("decoder-inverted", "decoder_mask", decoder("~(keep[:, None, None, :] & tri.tril())"), "inverted"),
    ("decoder-shape-B-L-L", "decoder_mask", decoder("keep[:, None, :] & tri.tril()"), "(B, 1, L, L)"),
    ("decoder-ignores-pad-id", "decoder_mask", decoder("padding_mask(tokens) & causal_mask(L, tokens.device)"),
     "pad_id argument is ignored"),
    ("decoder-diagonal-excluded", "decoder_mask", decoder("keep[:, None, None, :] & tri.tril(-1)"),
     "diagonal"),
]


@pytest.mark.parametrize("name, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_implementation_loses_credit_on_its_exercise_only(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)


def test_padding_on_queries_instead_of_keys_is_named_where_left_padding_tells_them_apart():
    src = next(b[2] for b in BUGGY if b[0] == "decoder-padding-on-queries")
    e = grade(namespace(src))["decoder_mask"]
    cpu = next(t for t in e["tests"] if t.device == "cpu")
    left = next(c for c in cpu.cases if c.case.startswith("left padding"))
    assert not left.passed and "instead of the key columns" in left.hint


@pytest.mark.parametrize("exercise, src", [
    ("causal_mask", causal("torch.ones(seq_len, seq_len, dtype=torch.bool).tril()")),       # device ignored
    ("decoder_mask", decoder("padding_mask(tokens, pad_id) & causal_mask(L)")),            # causal on the CPU
])
def test_ignoring_the_device_loses_only_the_portability_test(exercise, src):
    e = grade(namespace(src))[exercise]
    assert e["cpu"][0] == e["cpu"][1]
    assert e["fake-cuda"][0] < e["fake-cuda"][1]
    meta = next(t for t in e["tests"] if t.device == "fake-cuda").first_failure
    assert meta.hint and "device" in meta.hint


CORRECT = [
    ("causal-arange-compare", causal(
        "torch.arange(seq_len, device=device)[:, None] >= torch.arange(seq_len, device=device)")),
    ("causal-not-triu", causal("~torch.triu(torch.ones(seq_len, seq_len, device=device), 1).bool()")),
    ("padding-ne-view", padding("tokens.ne(pad_id).view(tokens.shape[0], 1, 1, tokens.shape[1])")),
    ("decoder-logical-and-expand", decoder(
        "torch.logical_and(keep.view(-1, 1, 1, L), torch.tril(tri)).expand(tokens.shape[0], 1, L, L)")),
    ("decoder-own-helpers", decoder("padding_mask(tokens, pad_id) & causal_mask(L, device=tokens.device)")),
]


@pytest.mark.parametrize("name, src", CORRECT, ids=[c[0] for c in CORRECT])
def test_equivalent_implementations_score_full_marks(name, src):
    check_equivalent(CH, src)


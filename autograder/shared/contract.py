"""The exercise contract (book/exercise_api.md) as data: chapters, exercises, points, forbidden ops.

Everything else in the grader asks this module what a chapter contains, so the list of graded
names lives in one place.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .kinds import FIND_THE_BUG, IMPLEMENT, WRITTEN_ANSWER, Task

# Op names (torch.ops.aten overload packets, also torch.* functions of the same name) that count as
# "PyTorch's ready-made attention". Recorded through a TorchFunctionMode (execute.py), which
# every route passes: torch.*, Tensor methods, aliases, torch.ops.aten and torch._C bindings.
ATTENTION_OPS = frozenset({
    "scaled_dot_product_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_attention_math_for_mps",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
    "_fused_sdp_choice",
    "_native_multi_head_attention",
    "_transformer_encoder_layer_fwd",
})
# Python-level functions (they decompose into ordinary aten ops, so only their name shows them).
ATTENTION_FUNCTIONS = frozenset({
    "scaled_dot_product_attention",
    "multi_head_attention_forward",
})
SOFTMAX_OPS = frozenset({
    "softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax",
    "special_softmax", "special_log_softmax", "_masked_softmax",
})
SOFTMAX_FUNCTIONS = frozenset({"softmax", "log_softmax"})


@dataclass(frozen=True)
class Forbidden:
    """What an exercise may not hand to PyTorch, and how to say so."""

    ops: frozenset = frozenset()        # aten overload-packet names
    functions: frozenset = frozenset()  # __torch_function__ names (func.__name__)
    what: str = ""                      # human words for the message

    def __bool__(self) -> bool:
        return bool(self.ops or self.functions)

    def used_in(self, seen) -> set:
        """Which of the recorded names (executor's Outcome.forbidden) this rule forbids."""
        return {s for s in seen if (s.removeprefix("aten.") in self.ops if s.startswith("aten.")
                                    else s in self.functions)}


NO_ATTENTION = Forbidden(
    ATTENTION_OPS, ATTENTION_FUNCTIONS,
    "PyTorch's ready-made attention (scaled_dot_product_attention / nn.MultiheadAttention / "
    "multi_head_attention_forward)",
)
# Chapter 8 builds a whole transformer: nn.TransformerEncoderLayer / DecoderLayer / Transformer
# run through the ops above (their fast path is _transformer_encoder_layer_fwd, their slow path
# multi_head_attention_forward), so the same op names catch them; only the words are wider.
NO_TRANSFORMER = Forbidden(
    ATTENTION_OPS, ATTENTION_FUNCTIONS,
    "PyTorch's ready-made attention or transformer layers (scaled_dot_product_attention / "
    "nn.MultiheadAttention / nn.TransformerEncoderLayer and friends)",
)
NO_SOFTMAX = Forbidden(
    SOFTMAX_OPS, SOFTMAX_FUNCTIONS,
    "PyTorch's softmax (torch.softmax, Tensor.softmax, F.softmax, log_softmax)",
)


@dataclass(frozen=True)
class Exercise:
    """One graded name of the contract.

    kind, how the graded name is reached: "function", "module" (an nn.Module class; construction,
    parameters and forward are graded) or "method" (a method of the chapter's module class, e.g.
    prepare_qkv); or "answer": a plain value (number or nested list of numbers) assigned to the
    name, read rather than called.
    task, what the student is asked to do (`shared/kinds.py`): IMPLEMENT (the default),
    WRITTEN_ANSWER ("predict the output", kind "answer": autograder/cases/written_answers.py) or
    FIND_THE_BUG (a corrected version of a buggy function the notebook shows; kind "function").
    The rest of the grader asks the task, never the name, what an exercise gets.
    """

    name: str
    kind: str
    points: float
    forbidden: Forbidden = field(default_factory=Forbidden)
    owner: str | None = None  # for kind == "method": the class that holds it
    builds_on: tuple = ()     # exercises of the chapter the reference solution calls
    outputs: tuple = ()       # the contract's names of the returned tensors, in order, where they
    #                           are not (output, weights): reports call them by these names
    task: Task = IMPLEMENT

    def __post_init__(self):
        if (self.kind == "answer") != self.task.value:
            raise ValueError(f"{self.name}: a value (kind 'answer') is exactly a written answer's task")

    @property
    def target(self) -> str:
        """The notebook-level name that must exist for this exercise to be graded."""
        return self.owner or self.name


@dataclass(frozen=True)
class Chapter:
    id: str
    title: str
    exercises: tuple

    def exercise(self, name: str) -> Exercise:
        for ex in self.exercises:
            if ex.name == name:
                return ex
        raise KeyError(f"{self.id} has no exercise {name!r}")

    @property
    def points(self) -> float:
        return sum(ex.points for ex in self.exercises)


CHAPTERS: dict[str, Chapter] = {c.id: c for c in (
    Chapter("01_intuition", "Intuition", (
        Exercise("softmax", "function", 5, NO_SOFTMAX),
        Exercise("attention_pool", "function", 5, builds_on=("softmax",)),
        Exercise("predict_softmax_large", "answer", 1, task=WRITTEN_ANSWER),
        Exercise("fixed_softmax_rows", "function", 2, NO_SOFTMAX, task=FIND_THE_BUG),
    )),
    Chapter("02_scaled_dot_product_attention", "Scaled dot-product attention", (
        Exercise("scaled_dot_product_attention", "function", 10, NO_ATTENTION),
        Exercise("SelfAttention", "module", 5, NO_ATTENTION, builds_on=("scaled_dot_product_attention",)),
        Exercise("predict_equal_keys_output", "answer", 1, task=WRITTEN_ANSWER),
        Exercise("fixed_masked_attention", "function", 2, NO_ATTENTION, task=FIND_THE_BUG),
    )),
    Chapter("03_multi_head_attention", "Multi-head attention", (
        Exercise("split_heads", "function", 3, NO_ATTENTION),
        Exercise("merge_heads", "function", 2, NO_ATTENTION),
        Exercise("MultiHeadAttention", "module", 10, NO_ATTENTION, builds_on=("split_heads", "merge_heads")),
        Exercise("MultiHeadSelfAttention", "module", 5, NO_ATTENTION, builds_on=("merge_heads",)),
        Exercise("predict_split_heads_shape", "answer", 1, task=WRITTEN_ANSWER),
        Exercise("fixed_heads_attention", "function", 2, NO_ATTENTION, task=FIND_THE_BUG),
    )),
    Chapter("04_positional_encoding", "Positional encoding", (
        Exercise("sinusoidal_positional_encoding", "function", 4),
        Exercise("SinusoidalPositionalEncoding", "module", 3, builds_on=("sinusoidal_positional_encoding",)),
        Exercise("LearnedPositionalEmbedding", "module", 3),
        Exercise("apply_rotary_embedding", "function", 5),
        Exercise("predict_pe_row", "answer", 1, task=WRITTEN_ANSWER),
        Exercise("fixed_pe_angles", "function", 2, task=FIND_THE_BUG),
    )),
    Chapter("05_masks", "Masks", (
        Exercise("causal_mask", "function", 3),
        Exercise("padding_mask", "function", 3),
        Exercise("decoder_mask", "function", 4, builds_on=("causal_mask", "padding_mask")),
        Exercise("predict_fully_masked_weights", "answer", 1, task=WRITTEN_ANSWER),
        Exercise("fixed_masked_softmax", "function", 2, task=FIND_THE_BUG),
    )),
    Chapter("06_gated_global_attention", "Gated and global attention", (
        Exercise("prepare_qkv", "method", 3, NO_ATTENTION, owner="MultiHeadAttention"),
        Exercise("prepare_qkv_global", "method", 3, NO_ATTENTION, owner="MultiHeadAttention"),
        Exercise("MultiHeadAttention", "module", 14, NO_ATTENTION,
                 builds_on=("prepare_qkv", "prepare_qkv_global")),
        Exercise("predict_zero_gate_factor", "answer", 1, task=WRITTEN_ANSWER),
        Exercise("fixed_global_query", "function", 2, NO_ATTENTION, task=FIND_THE_BUG),
    )),
    Chapter("07_efficient_attention", "Efficient attention", (
        Exercise("online_softmax_attention", "function", 10, NO_ATTENTION, outputs=("the output", "lse")),
        Exercise("repeat_kv", "function", 2, NO_ATTENTION),
        Exercise("GroupedQueryAttention", "module", 8, NO_ATTENTION, builds_on=("repeat_kv",),
                 outputs=("the output", "the weights", "present_kv's keys", "present_kv's values")),
        Exercise("sliding_window_mask", "function", 2, NO_ATTENTION),
        Exercise("alibi_bias", "function", 3, NO_ATTENTION),
        Exercise("predict_online_stats", "answer", 1, task=WRITTEN_ANSWER),
        Exercise("fixed_merge_softmax_stats", "function", 2, NO_ATTENTION, task=FIND_THE_BUG,
                 outputs=("the merged maximum m", "the merged sum l")),
    )),
    Chapter("08_transformer", "A transformer that learns", (
        Exercise("MultiHeadAttention", "module", 3, NO_TRANSFORMER),
        Exercise("FeedForward", "module", 3, NO_TRANSFORMER),
        Exercise("TransformerBlock", "module", 6, NO_TRANSFORMER, builds_on=("MultiHeadAttention", "FeedForward")),
        Exercise("TinyTransformer", "module", 8, NO_TRANSFORMER, builds_on=("TransformerBlock",),
                 outputs=("the logits", *(f"block {i}'s weights" for i in range(1, 17)))),
        Exercise("predict_feedforward_params", "answer", 1, task=WRITTEN_ANSWER),
        Exercise("fixed_next_token_loss", "function", 2, NO_TRANSFORMER, task=FIND_THE_BUG),
    )),
)}

CHAPTER_IDS = tuple(CHAPTERS)


def chapter_for_filename(filename: str) -> Chapter | None:
    """The chapter a notebook file belongs to, from its name ('02_scaled_dot_product_attention.ipynb',
    also with a student's prefix or suffix such as 'alice_02_scaled_dot_product_attention (1).ipynb')."""
    stem = filename.rsplit("/", 1)[-1]
    if stem.endswith(".ipynb"):
        stem = stem[: -len(".ipynb")]
    if stem in CHAPTERS:
        return CHAPTERS[stem]
    matches = [c for c in CHAPTER_IDS if c in stem]
    if len(matches) == 1:
        return CHAPTERS[matches[0]]
    # A bare number prefix ("02.ipynb", "02_sdpa.ipynb") is accepted when unambiguous.
    prefix = stem[:2]
    matches = [c for c in CHAPTER_IDS if c.startswith(prefix + "_")] if prefix.isdigit() else []
    return CHAPTERS[matches[0]] if len(matches) == 1 else None

"""Chapter 8 grading: the reference scores full marks, realistic mistakes lose credit on the
exercise they touch only (with a hint naming the mistake), equivalent formulations score full
marks, PyTorch's ready-made attention and transformer layers score zero, a failing
MultiHeadAttention is pointed at from the blocks built on it, and the reference model learns the
book's reversal task. What every chapter shares is in test_grading_common.py."""
import functools
import textwrap

import pytest
import torch

from autograder.references.solutions import load_reference

from grading_helpers import check_buggy, check_equivalent, full, grade_in, namespace_of

CH = "08_transformer"
namespace = functools.partial(namespace_of, CH)
grade = functools.partial(grade_in, CH)


# A block and a model written independently of the reference, as a template: the buggy variants
# below change one marked line each.
TEMPLATE = """
class FeedForward(nn.Module):
    def __init__(self, embed_dim, hidden_dim, dropout=0.0):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, embed_dim)
        self.p = dropout

    def forward(self, x):
        h = F.gelu(self.fc1(x))                                          # @act
        return F.dropout(self.fc2(h), self.p, self.training)             # @ffdrop


class TransformerBlock(nn.Module):
    def __init__(self, embed_dim, num_heads, hidden_dim, dropout=0.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(embed_dim)
        self.attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout)
        self.ln_2 = nn.LayerNorm(embed_dim)
        self.ff = FeedForward(embed_dim, hidden_dim, dropout)

    def forward(self, x, mask=None):
        a, w = self.attn(self.ln_1(x), mask=mask)                        # @attn
        h = x + a                                                        # @res1
        out = h + self.ff(self.ln_2(h))                                  # @res2
        return out, w


class TinyTransformer(nn.Module):
    def __init__(self, vocab_size, max_len, embed_dim, num_heads, num_layers, hidden_dim, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.tok_emb = nn.Embedding(vocab_size, embed_dim)
        self.pos_emb = nn.Embedding(max_len, embed_dim)
        self.blocks = nn.ModuleList(TransformerBlock(embed_dim, num_heads, hidden_dim, dropout)
                                    for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size)

    def forward(self, tokens, mask=None):
        L = tokens.shape[1]
        if L > self.max_len:                                             # @check
            raise ValueError("too long")
        pos = torch.arange(L, device=tokens.device)                      # @pos
        x = self.tok_emb(tokens) + self.pos_emb(pos)[None]               # @emb
        ws = []
        for i, block in enumerate(self.blocks):
            x, w = block(x, mask)                                        # @mask
            ws.append(w)
        x = self.ln_f(x)                                                 # @lnf
        return self.head(x), ws                                          # @ret
"""


def patch(template: str, marker: str, new: str) -> str:
    """Replace the line marked `# @marker` by `new`, keeping its indentation."""
    lines = template.splitlines()
    hits = [i for i, line in enumerate(lines) if line.rstrip().endswith(f"# @{marker}")]
    assert len(hits) == 1, marker
    line = lines[hits[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[hits[0]] = textwrap.indent(textwrap.dedent(new), indent)
    return "\n".join(lines)


def part(src: str, cls: str) -> str:
    """Only the class `cls` of a template: the reference's other classes keep their own globals,
    so a buggy FeedForward alone leaves the reference's TransformerBlock correct."""
    chunks = ["class " + c for c in textwrap.dedent(src).split("\nclass ")[1:]]
    return next(c for c in chunks if c.startswith(f"class {cls}("))


def only(cls: str, marker: str, new: str) -> str:
    return part(patch(TEMPLATE, marker, new), cls)


# Chapter 3's module pasted with a chapter 3 mistake: chapter 3's hint, on this chapter's exercise.
MHA_UNSCALED = """
class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.h, self.p = num_heads, dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = (p(t).unflatten(-1, (self.h, -1)).transpose(1, 2)
                   for p, t in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        w = attention_weights(q * math.sqrt(q.shape[-1]), k, mask)     # undoes the scaling
        o = F.dropout(w, self.p, self.training) @ v
        return self.out_proj(o.transpose(1, 2).flatten(-2)), w
"""

# (id, exercise, source, words the hint of the first CPU failure must contain, or None)
BUGGY = [
    ("mha-pasted-unscaled", "MultiHeadAttention", MHA_UNSCALED, "unscaled"),
    ("ff-tanh-gelu", "FeedForward", only("FeedForward", "act", 'h = F.gelu(self.fc1(x), approximate="tanh")'), "tanh"),
    ("ff-relu", "FeedForward", only("FeedForward", "act", "h = torch.relu(self.fc1(x))"), "ReLU"),
    ("ff-dropout-always-on", "FeedForward",
     only("FeedForward", "ffdrop", "return F.dropout(self.fc2(h), self.p, True)"), None),
    ("block-post-ln", "TransformerBlock", part(patch(patch(TEMPLATE, "attn", "a, w = self.attn(x, mask=mask)"),
     "res1", "h = self.ln_1(x + a)").replace("out = h + self.ff(self.ln_2(h))", "out = self.ln_2(h + self.ff(h))"),
     "TransformerBlock"), "post-LN"),
    ("block-no-attn-residual", "TransformerBlock", only("TransformerBlock", "res1", "h = a"), "residual"),
    ("block-no-ff-residual", "TransformerBlock", only("TransformerBlock", "res2", "out = self.ff(self.ln_2(h))"),
     "residual"),
    ("block-ln-swapped", "TransformerBlock", part(patch(patch(TEMPLATE, "attn", "a, w = self.attn(self.ln_2(x), mask=mask)"),
     "res2", "out = h + self.ff(self.ln_1(h))"), "TransformerBlock"), "swapped"),
    ("block-mask-ignored", "TransformerBlock", only("TransformerBlock", "attn", "a, w = self.attn(self.ln_1(x))"), None),
    ("tiny-positions-from-1", "TinyTransformer",
     only("TinyTransformer", "pos", "pos = torch.arange(1, L + 1, device=tokens.device)"), "positions start at 1"),
    ("tiny-no-final-ln", "TinyTransformer", only("TinyTransformer", "lnf", "pass"), "final LayerNorm"),
    ("tiny-mask-first-block-only", "TinyTransformer",
     only("TinyTransformer", "mask", "x, w = block(x, mask if i == 0 else None)"), "every block"),
    ("tiny-last-weights-only", "TinyTransformer", only("TinyTransformer", "ret", "return self.head(x), ws[-1]"),
     "every block"),
    ("tiny-no-length-check", "TinyTransformer", only("TinyTransformer", "check", "if False:"), "max_len"),
    ("tiny-scaled-embeddings", "TinyTransformer",
     only("TinyTransformer", "emb", "x = self.tok_emb(tokens) * math.sqrt(self.tok_emb.embedding_dim) + self.pos_emb(pos)"),
     "sqrt(embed_dim)"),
]


@pytest.mark.parametrize("name, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_implementation_loses_credit_on_its_exercise_only(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)


CORRECT = [
    ("independent-template", TEMPLATE),
    ("nn-modules-sequential-gelu", """
        class FeedForward(nn.Module):
            def __init__(self, embed_dim, hidden_dim, dropout=0.0):
                super().__init__()
                self.fc1, self.act = nn.Linear(embed_dim, hidden_dim), nn.GELU()
                self.fc2, self.drop = nn.Linear(hidden_dim, embed_dim), nn.Dropout(dropout)

            def forward(self, x):
                return self.drop(self.fc2(self.act(self.fc1(x))))
        """),
    ("manual-layernorm-erf-gelu-and-one-hot-embeddings", """
        class FeedForward(nn.Module):
            def __init__(self, embed_dim, hidden_dim, dropout=0.0):
                super().__init__()
                self.fc1 = nn.Linear(embed_dim, hidden_dim)
                self.fc2 = nn.Linear(hidden_dim, embed_dim)
                self.drop = nn.Dropout(dropout)

            def forward(self, x):
                h = self.fc1(x)
                return self.drop(self.fc2(0.5 * h * (1 + torch.erf(h / math.sqrt(2)))))

        def _norm(ln, x):
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias

        class TransformerBlock(nn.Module):
            def __init__(self, embed_dim, num_heads, hidden_dim, dropout=0.0):
                super().__init__()
                self.ln_1 = nn.LayerNorm(embed_dim)
                self.attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout)
                self.ln_2 = nn.LayerNorm(embed_dim)
                self.ff = FeedForward(embed_dim, hidden_dim, dropout)

            def forward(self, x, mask=None):
                a, w = self.attn(_norm(self.ln_1, x), None, None, mask)
                x = x + a
                return x + self.ff(_norm(self.ln_2, x)), w

        class TinyTransformer(nn.Module):
            def __init__(self, vocab_size, max_len, embed_dim, num_heads, num_layers, hidden_dim, dropout=0.0):
                super().__init__()
                self.tok_emb = nn.Embedding(vocab_size, embed_dim)
                self.pos_emb = nn.Embedding(max_len, embed_dim)
                self.blocks = nn.ModuleList()
                for _ in range(num_layers):
                    self.blocks.append(TransformerBlock(embed_dim, num_heads, hidden_dim, dropout))
                self.ln_f = nn.LayerNorm(embed_dim)
                self.head = nn.Linear(embed_dim, vocab_size)

            def forward(self, tokens, mask=None):
                B, L = tokens.shape
                if L > self.pos_emb.weight.shape[0]:
                    raise ValueError("sequence longer than max_len")
                one_hot = F.one_hot(tokens, self.tok_emb.num_embeddings).to(self.tok_emb.weight.dtype)
                x = one_hot @ self.tok_emb.weight + self.pos_emb.weight[:L]
                weights = []
                for block in self.blocks:
                    x, w = block(x, mask=mask)
                    weights += [w]
                return self.head(_norm(self.ln_f, x)), weights
        """),
]


@pytest.mark.parametrize("name, src", CORRECT, ids=[c[0] for c in CORRECT])
def test_equivalent_implementations_score_full_marks(name, src):
    check_equivalent(CH, src)


@pytest.mark.parametrize("src", [
    """
    class TransformerBlock(nn.Module):      # nn.TransformerEncoderLayer with the contract's names
        def __init__(self, embed_dim, num_heads, hidden_dim, dropout=0.0):
            super().__init__()
            self.ln_1 = nn.LayerNorm(embed_dim)
            self.attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout)
            self.ln_2 = nn.LayerNorm(embed_dim)
            self.ff = FeedForward(embed_dim, hidden_dim, dropout)
            self.num_heads = num_heads

        def forward(self, x, mask=None):
            E = x.shape[-1]
            layer = nn.TransformerEncoderLayer(E, self.num_heads, self.ff.fc1.out_features, dropout=0.0,
                                               activation="gelu", batch_first=True, norm_first=True).to(x)
            layer.eval()
            out = layer(x)
            return out, self.attn(self.ln_1(x), mask=mask)[1]
    """,
], ids=["nn.TransformerEncoderLayer"])
def test_pytorch_ready_made_transformer_layers_score_zero_with_a_note(src):
    result = grade(namespace(src))
    e = result["TransformerBlock"]
    assert e["score"] == 0
    assert e["notes"] and all("ready-made attention" in n for n in e["notes"])
    for other in ("MultiHeadAttention", "FeedForward"):
        assert full(result[other]), other


def test_a_failing_multi_head_attention_is_pointed_at_from_the_blocks():
    src = """
    _MHA = MultiHeadAttention
    class MultiHeadAttention(_MHA):
        def forward(self, query, key=None, value=None, mask=None):
            out, w = super().forward(query, key, value, mask)
            return out * 1.5, w                                   # a wrong output
    """
    result = grade(namespace(textwrap.dedent(src) + TEMPLATE))  # the template's blocks call it
    assert result["MultiHeadAttention"]["score"] < result["MultiHeadAttention"]["max"]
    assert full(result["FeedForward"])
    block = result["TransformerBlock"]
    assert block["score"] < block["max"]
    assert block["first"].hint and "`MultiHeadAttention`" in block["first"].hint, block["first"].hint


# ----------------------------------------------------------------------------- training
def test_the_reference_model_learns_the_books_reversal_task():
    """The book's model and recipe (more steps than the page), deterministic: near 100 %."""
    ref = load_reference(CH)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = ref["TinyTransformer"](vocab_size=11, max_len=16, embed_dim=64, num_heads=2, num_layers=2,
                                       hidden_dim=128)
        history = ref["train_reversal"](model, steps=250, log_every=250)
    finally:
        torch.set_num_threads(threads)
    assert history["step"] == [250]
    assert history["accuracy"][-1] >= 0.99, history
    assert history["loss"][-1] < 0.1, history
    # a fresh model is at chance (one digit in ten)
    torch.manual_seed(1)
    fresh = ref["TinyTransformer"](11, 16, 64, 2, 2, 128)
    seq = ref["reversal_batch"](256, generator=torch.Generator().manual_seed(5))
    assert ref["reversal_accuracy"](fresh, seq) < 0.3


# ----------------------------------------------------------------------------- training-mode dropout
BLOCK_DROPOUT = [
    ("dropout after the activation too", patch(TEMPLATE, "act",
                                               "h = F.dropout(F.gelu(self.fc1(x)), self.p, self.training)")),
    ("dropout on the attention's residual branch", patch(TEMPLATE, "res1",
                                                         "h = x + F.dropout(a, self.ff.p, self.training)")),
    ("no dropout in FeedForward", patch(TEMPLATE, "ffdrop", "return self.fc2(h)")),
]


@pytest.mark.parametrize("name, src", BLOCK_DROPOUT, ids=[b[0] for b in BLOCK_DROPOUT])
def test_training_mode_dropout_of_the_block_is_graded_by_its_properties(name, src):
    """A block whose only difference is where dropout acts in training mode (an extra dropout, or
    none) loses the training-mode case, in the grader and in the self-check."""
    from grading_helpers import self_check_failures
    ns = namespace(src)
    e = grade(ns)["TransformerBlock"]
    failed = [c for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed]
    assert any("training mode" in c.case and "dropout" in c.message for c in failed), [c.case for c in failed]
    assert "TransformerBlock" in self_check_failures(CH, ns, ["TransformerBlock"])


def test_the_reference_and_an_independent_block_pass_the_training_mode_case():
    for ns in (namespace(), namespace(TEMPLATE)):
        e = grade(ns)["TransformerBlock"]
        assert e["score"] == e["max"], [c.message for t in e["tests"] for c in t.cases if not c.passed]


# ----------------------------------------------------------------------------- only stated rules cost points
def test_an_extra_non_persistent_buffer_costs_nothing():
    """HF-style position_ids: a buffer outside state_dict() holds no weights and changes nothing;
    the contract names the parameters and saved buffers only. A saved (persistent) extra buffer
    is still reported."""
    src = TEMPLATE.replace("        self.head = nn.Linear(embed_dim, vocab_size)",
                           "        self.head = nn.Linear(embed_dim, vocab_size)\n"
                           "        self.register_buffer('position_ids', torch.arange(max_len), persistent=False)")
    assert "position_ids" in src
    e = grade(namespace(src))["TinyTransformer"]
    assert e["score"] == e["max"], [c.message for t in e["tests"] for c in t.cases if not c.passed]
    saved = grade(namespace(src.replace(", persistent=False", "")))["TinyTransformer"]
    assert saved["score"] < saved["max"] and "position_ids" in saved["first"].message


def test_tied_embeddings_are_named_as_such():
    src = TEMPLATE.replace("        self.head = nn.Linear(embed_dim, vocab_size)",
                           "        self.head = nn.Linear(embed_dim, vocab_size, bias=False)\n"
                           "        self.head.weight = self.tok_emb.weight   # tied, as GPT-2")
    assert "tied" in src
    e = grade(namespace(src))["TinyTransformer"]
    assert e["score"] < e["max"] and any("tied" in h for h in e["hints"]), (e["first"].message, e["hints"])


def test_training_mode_dropout_outside_the_blocks_loses_the_training_mode_case():
    """nanoGPT's embedding dropout (not in this contract's model): with blocks that add nothing
    the logits in training mode must be the eval-mode ones; grader and self-check both see it."""
    from grading_helpers import self_check_failures
    src = patch(TEMPLATE, "emb", "x = F.dropout(self.tok_emb(tokens) + self.pos_emb(pos)[None], "
                                 "self.blocks[0].ff.p, self.training)")
    ns = namespace(src)
    e = grade(ns)["TinyTransformer"]
    failed = [c.case for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed]
    assert failed == [c for c in failed if "training mode" in c] and any("zero" in c for c in failed), failed
    assert any("outside the blocks" in h for h in e["hints"]), e["hints"]
    assert "TinyTransformer" in self_check_failures(CH, ns, ["TinyTransformer"])


def test_a_tanh_gelu_is_named_in_every_failing_case_not_float32():
    """The tanh GELU is within 1e-4 of the exact one, so outputs can match at float32's accuracy
    while a gradient is off; the hint names the GELU (a model at float64's accuracy), in every
    failing case of TinyTransformer and in the self-check, never float32."""
    from grading_helpers import self_check_failures
    ns = namespace(patch(TEMPLATE, "act", 'h = F.gelu(self.fc1(x), approximate="tanh")'))
    e = grade(ns)["TinyTransformer"]
    hints = [c.hint or "" for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed]
    assert hints and all("tanh" in h for h in hints), hints
    assert "tanh" in (self_check_failures(CH, ns, ["TinyTransformer"])["TinyTransformer"].hint or "")


def test_nan_on_fully_masked_rows_is_caught_through_the_whole_model():
    """A plain softmax in the pasted MultiHeadAttention: the fully masked row's NaN reaches the
    logits; TinyTransformer loses that case (before, every TinyTransformer case passed)."""
    src = MHA_UNSCALED.replace("w = attention_weights(q * math.sqrt(q.shape[-1]), k, mask)     # undoes the scaling",
                               "s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
                               "        if mask is not None:\n"
                               "            s = s.masked_fill(~mask, float('-inf')) if mask.dtype == torch.bool "
                               "else s + mask\n"
                               "        w = torch.softmax(s, dim=-1)")
    assert "torch.softmax(s, dim=-1)" in src
    e = grade(namespace(src + TEMPLATE))["TinyTransformer"]  # (the template's blocks use this module)
    failed = [c.case for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed]
    assert failed and all("fully masked" in c for c in failed), failed
    hints = [c.hint or "" for t in e["tests"] if t.device == "cpu" for c in t.cases if not c.passed]
    assert all("all masked" in h for h in hints), hints  # (the NaN spreads in block 2: still this hint)

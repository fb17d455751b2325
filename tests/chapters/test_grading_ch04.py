"""Chapter 4 grading: the reference scores full marks, realistic mistakes lose credit on the
exercise they touch only, hints name the mistake, equivalent formulations score full marks.
What every chapter shares (full marks for the reference, zero for the stubs, the quick cases) is in
test_grading.py."""
import functools

import pytest

from autograder.references.solutions import load_reference

from grading_helpers import check_buggy, check_equivalent, failures, grade_in, namespace_of

CH = "04_positional_encoding"
namespace = functools.partial(namespace_of, CH)  # the reference with `src` run on top
grade = functools.partial(grade_in, CH)


# Module sources reuse the reference's table function (it lives in the namespace).
_SPE = '''
class SinusoidalPositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        self.max_len = max_len
        self.d_model = d_model
        {init}
    def forward(self, x):
        L = x.shape[1]
        {check}
        return {ret}
'''


def spe(init="self.register_buffer('pe', sinusoidal_positional_encoding(max_len, d_model))",
        check="if L > self.max_len: raise ValueError('too long')", ret="x + self.pe[:L]"):
    return _SPE.format(init=init, check=check, ret=ret)


_LPE = '''
class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        {init}
    def forward(self, x):
        L = x.shape[1]
        {check}
        return {ret}
'''


def lpe(init="", check="if L > self.max_len: raise ValueError('too long')",
        ret="x + self.embedding(torch.arange(L, device=x.device))"):
    return _LPE.format(init=init, check=check, ret=ret)


# A rotary embedding with the pieces a mistake changes spelled out.
_ROPE = '''
def apply_rotary_embedding(x, base=10000.0):
    L, d = {L}, x.shape[-1]
    theta = {theta}                                                  # (d/2,)
    pos = {pos}                                                      # (L,)
    angle = pos[:, None] * theta                                      # (L, d/2)
    cos, sin = {expand}
    x0, x1 = x[..., 0::2], x[..., 1::2]
    rot = torch.stack([-x1, x0], dim=-1).flatten(-2)                  # (..., L, d)
    return x * cos + rot * {sign}sin
'''


def rope(L="x.shape[-2]", theta="base ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)",
         pos="torch.arange(L, dtype=x.dtype, device=x.device)",
         expand="angle.cos().repeat_interleave(2, -1), angle.sin().repeat_interleave(2, -1)", sign=""):
    return _ROPE.format(L=L, theta=theta, pos=pos, expand=expand, sign=sign)


# (id, exercise, source, words the hint of the first CPU failure must contain, or None)
BUGGY = [
    # --- sinusoidal_positional_encoding
    ("table-sin-cos-swapped", "sinusoidal_positional_encoding", """
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = torch.arange(max_len).unsqueeze(1)
            angle = pos / 10000 ** (torch.arange(0, d_model, 2) / d_model)
            pe = torch.zeros(max_len, d_model)
            pe[:, 0::2] = torch.cos(angle)
            pe[:, 1::2] = torch.sin(angle[:, : d_model // 2])
            return pe
        """, "sin and cos are swapped"),
    ("table-exponent-i-over-d", "sinusoidal_positional_encoding", """
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = torch.arange(max_len).unsqueeze(1)
            angle = pos / 10000 ** (torch.arange((d_model + 1) // 2) / d_model)
            pe = torch.zeros(max_len, d_model)
            pe[:, 0::2] = torch.sin(angle)
            pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
            return pe
        """, "exponent is i/d_model"),
    ("table-column-index-exponent", "sinusoidal_positional_encoding", """
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = torch.arange(max_len).unsqueeze(1)
            angle = pos / 10000 ** (torch.arange(d_model) / d_model)     # (max_len, d_model)
            col = torch.arange(d_model)
            return torch.where(col % 2 == 0, torch.sin(angle), torch.cos(angle))
        """, "same frequency"),
    ("table-concatenated", "sinusoidal_positional_encoding", """
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = torch.arange(max_len).unsqueeze(1)
            angle = pos / 10000 ** (torch.arange(0, d_model, 2) / d_model)
            return torch.cat([torch.sin(angle), torch.cos(angle[:, : d_model // 2])], dim=1)
        """, "interleave"),
    ("table-transposed", "sinusoidal_positional_encoding", """
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = torch.arange(max_len).unsqueeze(0)                     # (1, max_len)
            angle = pos / 10000 ** (torch.arange(0, d_model, 2) / d_model).unsqueeze(1)
            pe = torch.zeros(d_model, max_len)
            pe[0::2] = torch.sin(angle)
            pe[1::2] = torch.cos(angle[: d_model // 2])
            return pe
        """, "transposed"),
    ("table-odd-d-model-breaks", "sinusoidal_positional_encoding", """
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = torch.arange(max_len).unsqueeze(1)
            angle = pos / 10000 ** (torch.arange(0, d_model, 2) / d_model)
            pe = torch.zeros(max_len, d_model)
            pe[:, 0::2] = torch.sin(angle)
            pe[:, 1::2] = torch.cos(angle)
            return pe
        """, "odd d_model"),
    ("table-fixed-float32", "sinusoidal_positional_encoding", """
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
            angle = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
            pe = torch.zeros(max_len, d_model, dtype=torch.float32)
            pe[:, 0::2] = torch.sin(angle)
            pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
            return pe
        """, "default dtype"),
    ("table-numpy", "sinusoidal_positional_encoding", """
        import numpy as np
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = np.arange(max_len)[:, None]
            angle = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
            pe = np.zeros((max_len, d_model))
            pe[:, 0::2] = np.sin(angle)
            pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
            return torch.from_numpy(pe)
        """, "numpy"),
    # --- SinusoidalPositionalEncoding
    ("spe-table-not-a-buffer", "SinusoidalPositionalEncoding",
     spe(init="self.pe = sinusoidal_positional_encoding(max_len, d_model)"), "register_buffer"),
    ("spe-table-with-batch-dim", "SinusoidalPositionalEncoding",
     spe(init="self.register_buffer('pe', sinusoidal_positional_encoding(max_len, d_model).unsqueeze(0))",
         ret="x + self.pe[:, :L]"), "(max_len, d_model) table itself"),
    ("spe-no-length-check", "SinusoidalPositionalEncoding", spe(check="pass"), "raise ValueError"),
    ("spe-length-check-off-by-one", "SinusoidalPositionalEncoding",
     spe(check="if L >= self.max_len: raise ValueError('too long')"), "use >, not >="),
    ("spe-sliced-by-batch-size", "SinusoidalPositionalEncoding", spe(ret="x + self.pe[:x.size(0)]"), None),
    ("spe-scales-x", "SinusoidalPositionalEncoding", spe(ret="x * math.sqrt(self.d_model) + self.pe[:L]"),
     "scaled by sqrt(d_model)"),
    ("spe-returns-table", "SinusoidalPositionalEncoding", spe(ret="self.pe[:L].expand_as(x)"),
     "returns the table alone"),
    ("spe-positions-from-1", "SinusoidalPositionalEncoding", spe(ret="x + self.pe[1:L + 1]"),
     "positions start at 0"),
    ("spe-swapped-table", "SinusoidalPositionalEncoding",
     spe(init="pe = sinusoidal_positional_encoding(max_len, d_model)\n"
              "        pe = torch.stack([pe[:, 1::2], pe[:, 0::2]], -1).flatten(1)\n"
              "        self.register_buffer('pe', pe)"), "sin and cos are swapped"),
    # --- LearnedPositionalEmbedding
    ("lpe-positions-from-1", "LearnedPositionalEmbedding",
     lpe(ret="x + self.embedding(torch.arange(1, L + 1, device=x.device))"), "positions start at 0"),
    ("lpe-returns-embedding", "LearnedPositionalEmbedding",
     lpe(ret="self.embedding(torch.arange(L, device=x.device)).expand_as(x)"), "embedding alone"),
    ("lpe-no-length-check", "LearnedPositionalEmbedding", lpe(check="pass"), "raise ValueError"),
    ("lpe-length-check-off-by-one", "LearnedPositionalEmbedding",
     lpe(check="if L >= self.max_len: raise ValueError('too long')"), "use >, not >="),
    ("lpe-weight-data", "LearnedPositionalEmbedding", lpe(ret="x + self.embedding.weight.data[:L]"),
     None),  # no gradient reaches the embedding
    ("lpe-extra-parameter", "LearnedPositionalEmbedding",
     lpe(init="self.scale = nn.Parameter(torch.ones(1))",
         ret="x + self.scale * self.embedding(torch.arange(L, device=x.device))"), "exactly one layer"),
    # --- apply_rotary_embedding
    ("rope-halves-neox", "apply_rotary_embedding", """
        def apply_rotary_embedding(x, base=10000.0):
            L, d = x.shape[-2], x.shape[-1]
            theta = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
            angle = torch.arange(L, dtype=x.dtype)[:, None] * theta
            a, b = x[..., : d // 2], x[..., d // 2:]
            return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1)
        """, "GPT-NeoX"),
    ("rope-wrong-sign", "apply_rotary_embedding", rope(sign="-"), "wrong way"),
    ("rope-exponent-i-over-d", "apply_rotary_embedding",
     rope(theta="base ** (-torch.arange(d // 2, dtype=x.dtype) / d)"), "exponent is i/d"),
    ("rope-repeat-not-interleave", "apply_rotary_embedding",
     rope(expand="angle.cos().repeat(1, 2), angle.sin().repeat(1, 2)"), "repeat_interleave"),
    ("rope-positions-from-1", "apply_rotary_embedding",
     rope(pos="torch.arange(1, L + 1, dtype=x.dtype)"), "positions start at 0"),
    ("rope-ignores-base", "apply_rotary_embedding",
     rope(theta="10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)"), "`base` argument is ignored"),
    ("rope-length-from-first-axis", "apply_rotary_embedding", rope(L="x.shape[0]"), "batch dimensions"),
    ("rope-in-place", "apply_rotary_embedding", """
        def apply_rotary_embedding(x, base=10000.0):
            L, d = x.shape[-2], x.shape[-1]
            theta = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
            angle = torch.arange(L, dtype=x.dtype)[:, None] * theta
            x0, x1 = x[..., 0::2].clone(), x[..., 1::2].clone()
            x[..., 0::2] = x0 * angle.cos() - x1 * angle.sin()
            x[..., 1::2] = x0 * angle.sin() + x1 * angle.cos()
            return x
        """, None),
]


@pytest.mark.parametrize("name, exercise, src, words", BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_implementation_loses_credit_on_its_exercise_only(name, exercise, src, words):
    check_buggy(CH, exercise, src, words)


@pytest.mark.parametrize("exercise, src", [
    ("SinusoidalPositionalEncoding",   # a fresh table on the default (CPU) device in every forward
     spe(ret="x + sinusoidal_positional_encoding(L, self.d_model).to(x.dtype)")),
    ("apply_rotary_embedding", rope(pos="torch.arange(L).to(x.dtype)")),
])
def test_tensors_made_on_a_fixed_device_lose_only_the_portability_test(exercise, src):
    e = grade(namespace(src))[exercise]
    assert e["cpu"][0] == e["cpu"][1]
    assert e["fake-cuda"][0] < e["fake-cuda"][1]


CORRECT = [
    ("table-exp-log-stack", """
        def sinusoidal_positional_encoding(max_len, d_model):
            pos = torch.arange(max_len, dtype=torch.get_default_dtype()).unsqueeze(1)   # (max_len, 1)
            div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            angle = pos * div                                                           # (max_len, ceil(d/2))
            cos = torch.cat([angle.cos(), torch.zeros_like(angle[:, :1])], 1)[:, : angle.shape[1]]
            return torch.stack([angle.sin(), cos], dim=-1).flatten(1)[:, :d_model]
        """),
    ("spe-own-float32-table-non-persistent-buffer", """
        class SinusoidalPositionalEncoding(nn.Module):
            def __init__(self, d_model, max_len=5000):
                super().__init__()
                pos = torch.arange(max_len).unsqueeze(1).float()
                div = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
                pe = torch.zeros(max_len, d_model)
                pe[:, 0::2] = torch.sin(pos * div)
                pe[:, 1::2] = torch.cos(pos * div)[:, : d_model // 2]
                self.register_buffer("pe", pe, persistent=False)
            def forward(self, x):
                if x.size(1) > self.pe.size(0):
                    raise ValueError("sequence longer than max_len")
                return x + self.pe[: x.size(1)].unsqueeze(0)
        """),
    ("lpe-weight-slice", lpe(ret="x + self.embedding.weight[:L]")),
    ("rope-complex", """
        def apply_rotary_embedding(x, base=10000.0):
            L, d = x.shape[-2], x.shape[-1]
            theta = 1.0 / base ** (torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
            angle = torch.outer(torch.arange(L, dtype=x.dtype, device=x.device), theta)   # (L, d/2)
            xf = x.float() if x.element_size() < 4 else x                   # complex half is patchy
            z = torch.view_as_complex(xf.reshape(*x.shape[:-1], d // 2, 2).contiguous())  # (..., L, d/2)
            rot = torch.polar(torch.ones_like(angle, dtype=xf.dtype), angle.to(xf.dtype))
            return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)
        """),
    ("rope-template-in-x-dtype", rope()),
    ("rope-gptj-rotate-every-two", """
        def apply_rotary_embedding(x, base=10000.0):
            L, d = x.shape[-2], x.shape[-1]
            inv_freq = base ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
            angle = torch.einsum("l,f->lf", torch.arange(L, dtype=x.dtype, device=x.device), inv_freq)
            sin = angle.sin().repeat_interleave(2, dim=-1)
            cos = angle.cos().repeat_interleave(2, dim=-1)
            x1, x2 = x[..., ::2], x[..., 1::2]
            rotated = torch.stack((-x2, x1), dim=-1).reshape(x.shape)
            return x * cos + rotated * sin
        """),
]


@pytest.mark.parametrize("name, src", CORRECT, ids=[c[0] for c in CORRECT])
def test_equivalent_implementations_score_full_marks(name, src):
    check_equivalent(CH, src)


def test_rotary_reference_depends_on_relative_position_only():
    """The property the contract states: <R(q, m), R(k, n)> depends on m - n only."""
    import torch
    rope_fn = load_reference(CH)["apply_rotary_embedding"]
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    seq_q, seq_k = q.expand(12, 8), k.expand(12, 8)
    rq, rk = rope_fn(seq_q), rope_fn(seq_k)
    scores = rq @ rk.T                                              # (12, 12), [m, n]
    for offset in range(-11, 12):
        diag = torch.diagonal(scores, offset)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-10)



# The PyTorch tutorial's PositionalEncoding arithmetic ("Language Modeling with nn.Transformer and
# torchtext"): float32 arange and .float() frequencies, written into a table of the default dtype.
TUTORIAL_TABLE = """
    def sinusoidal_positional_encoding(max_len, d_model):
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)[:, : d_model // 2]
        return pe
    """
FLOAT32_ROUNDING = [
    ("sinusoidal_positional_encoding", TUTORIAL_TABLE),
    ("apply_rotary_embedding", rope(theta="base ** (-torch.arange(0, d, 2, device=x.device).float() / d)",
                                    pos="torch.arange(L, device=x.device).float()")),
]


@pytest.mark.parametrize("exercise, src", FLOAT32_ROUNDING, ids=[f[0] for f in FLOAT32_ROUNDING])
def test_float32_rounding_in_a_float64_case_gets_full_marks_with_a_note(exercise, src):
    from autograder.grading.compare import FLOAT32_NOTE

    e = grade(namespace(src))[exercise]
    assert e["score"] == e["max"], failures(e)
    cpu = [c for t in e["tests"] if t.device == "cpu" for c in t.cases]
    noted = [c for c in cpu if c.note == FLOAT32_NOTE]
    assert noted and all(c.dtype == "float64" for c in noted)
    assert "computed in float32" in FLOAT32_NOTE

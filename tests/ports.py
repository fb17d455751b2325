"""Code written by others, ported to the exercise API the way a student would port it.

Each port keeps its source's numerics and conventions and adapts only names and signatures, then
runs on top of the chapter's reference namespace (tests/grading_helpers.namespace_of), so only
the names it defines change. `mistake` says, in a student's words, what is actually wrong (None
for a correct port), and `words` is what the grader's hint must contain to name it.

The sources are paraphrased from memory of their public code, not copied: annotated-transformer
(Harvard NLP), d2l.ai, the UvA deep-learning notebooks, minGPT and nanoGPT (Karpathy), Meta's
LLaMA reference model, TorchLeet, lucidrains' repositories, alphafold-decoded, the PyTorch
tutorial "Language modeling with nn.Transformer", and the course's own source posts.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Port:
    name: str
    source: str
    chapter: str
    exercise: str
    src: str
    mistake: str | None  # None: a correct port, full marks expected
    words: str | None = None  # what the hint must say (None: no hint required)
    issue_item: int | None = None  # the item of the feedback issue it reproduces


CH1 = "01_intuition"
CH2 = "02_scaled_dot_product_attention"
CH3 = "03_multi_head_attention"
CH4 = "04_positional_encoding"
CH5 = "05_masks"
CH6 = "06_gated_global_attention"

PORTS: list[Port] = []


def port(*args, **kwargs) -> None:
    PORTS.append(Port(*args, **kwargs))


# ----------------------------------------------------------------------------- chapter 1

port("d2l softmax", "d2l.ai 3.6 (softmax from scratch)", CH1, "softmax", """
def softmax(x, dim=-1):
    x_exp = torch.exp(x)
    partition = x_exp.sum(dim, keepdim=True)
    return x_exp / partition
""", "no max subtracted: overflows for large inputs", "subtract")

port("d2l softmax, max subtracted", "d2l.ai, with the max subtracted as its text suggests", CH1, "softmax", """
def softmax(x, dim=-1):
    x = x - x.amax(dim=dim, keepdim=True).detach()
    x_exp = torch.exp(x)
    return x_exp / x_exp.sum(dim, keepdim=True)
""", "an entirely -inf slice gives NaN (-inf - -inf)", "entirely -inf")

# ----------------------------------------------------------------------------- chapter 2

# annotated-transformer's `attention`: masked_fill(mask == 0, -1e9). With a boolean mask this is
# right except for fully masked rows; with an additive float mask it masks the *allowed* keys.
port("annotated-transformer attention", "annotated-transformer `attention`", CH2,
     "scaled_dot_product_attention", """
def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(p_attn, v), p_attn
""", "a float (additive) mask read as a boolean one (mask == 0)", "additive", 3)

port("UvA scaled_dot_product", "UvA DL tutorial 6 `scaled_dot_product`", CH2,
     "scaled_dot_product_attention", """
def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = q.size()[-1]
    attn_logits = torch.matmul(q, k.transpose(-2, -1))
    attn_logits = attn_logits / math.sqrt(d_k)
    if mask is not None:
        attn_logits = attn_logits.masked_fill(mask == 0, -9e15)
    attention = F.softmax(attn_logits, dim=-1)
    values = torch.matmul(attention, v)
    return values, attention
""", "a float (additive) mask read as a boolean one (mask == 0)", "additive", 3)

port("nan_to_num after softmax", "a common fix for NaN rows (TorchLeet-style)", CH2,
     "scaled_dot_product_attention", """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights
""", "nan_to_num after the softmax leaves NaN gradients on fully masked rows", "nan_to_num", 4)

port("d2l DotProductAttention", "d2l.ai 11.3 DotProductAttention (bmm)", CH2,
     "scaled_dot_product_attention", """
def scaled_dot_product_attention(q, k, v, mask=None):
    d = q.shape[-1]
    scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    dead = torch.isneginf(scores).all(-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    return torch.bmm(weights, v), weights
""", "bmm and transpose(1, 2) assume exactly one batch axis", "batch")

# ----------------------------------------------------------------------------- chapter 3

# minGPT / nanoGPT CausalSelfAttention, with the causal buffer replaced by the caller's mask.
port("minGPT CausalSelfAttention", "minGPT model.py CausalSelfAttention", CH3,
     "MultiHeadSelfAttention", """
class MultiHeadSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        assert embed_dim % num_heads == 0
        self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.n_head, self.n_embd = num_heads, embed_dim

    def forward(self, x, mask=None):
        B, T, C = x.size()
        q, k, v = self.qkv_proj(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if mask is not None:
            att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.out_proj(y), att
""", "a float mask read as boolean; fully masked rows give NaN", "additive", 3)

port("LLaMA attention (float32 softmax)", "LLaMA model.py Attention", CH3, "MultiHeadAttention", """
class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.n_heads, self.head_dim, self.dropout = num_heads, embed_dim // num_heads, dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        bsz, seqlen, _ = query.shape
        xq = self.q_proj(query).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        keys = self.k_proj(key).view(bsz, key.shape[1], self.n_heads, self.head_dim).transpose(1, 2)
        values = self.v_proj(value).view(bsz, value.shape[1], self.n_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        dead = torch.isneginf(scores).all(-1, keepdim=True)
        scores = F.softmax(scores.masked_fill(dead, 0.0).float(), dim=-1).type_as(xq).masked_fill(dead, 0.0)
        out = F.dropout(scores, self.dropout, self.training) @ values
        out = out.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.out_proj(out), scores
""", None)  # a float32 softmax in a float64 case: rounding at float32 level is no mistake, values and
#            gradients alike, even where saturated scores amplify it (compare.py's float32 policy)

port("annotated-transformer MultiHeadedAttention (linears list)", "annotated-transformer",
     CH3, "MultiHeadAttention", """
del merge_heads  # this notebook never defines it

class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        assert embed_dim % num_heads == 0
        self.d_k, self.h = embed_dim // num_heads, num_heads
        self.linears = nn.ModuleList([nn.Linear(embed_dim, embed_dim, bias=bias) for _ in range(4)])
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        nbatches = query.size(0)
        query, key, value = [lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linears, (query, key, value))]
        scores = query @ key.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        dead = torch.isneginf(scores).all(-1, keepdim=True)
        p = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
        x = (self.dropout(p) @ value).transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.linears[-1](x), p
""", "parameters named linears.0 ... linears.3 instead of q_proj, k_proj, v_proj, out_proj",
     "q_proj", 1)

port("TorchLeet MHA (attn_mask keyword)", "TorchLeet multi-head attention", CH3,
     "MultiHeadAttention", """
class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.h, self.d = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key=None, value=None, attn_mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = (split_heads(p(t), self.h) for p, t in
                   ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        dead = torch.isneginf(s).all(-1, keepdim=True)
        w = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
        return self.out_proj(merge_heads(w @ v)), w
""", "the mask parameter is called attn_mask, not mask", "mask", 1)

port("LazyLinear projections", "a lucidrains-style module with lazy layers", CH3,
     "MultiHeadAttention", """
class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.h, self.d, self.p = num_heads, embed_dim // num_heads, dropout
        self.q_proj = nn.LazyLinear(embed_dim, bias=bias)
        self.k_proj = nn.LazyLinear(embed_dim, bias=bias)
        self.v_proj = nn.LazyLinear(embed_dim, bias=bias)
        self.out_proj = nn.LazyLinear(embed_dim, bias=bias)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = (split_heads(p(t), self.h) for p, t in
                   ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        dead = torch.isneginf(s).all(-1, keepdim=True)
        w = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
        return self.out_proj(merge_heads(F.dropout(w, self.p, self.training) @ v)), w
""", "nn.LazyLinear: the parameters do not exist after __init__", "__init__", 6)

port("fused qkv as (B, N, H, 3, d_h)", "source post 000 style: heads first, then q/k/v", CH3,
     "MultiHeadSelfAttention", """
class MultiHeadSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.h, self.d = num_heads, embed_dim // num_heads
        self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x, mask=None):
        B, N, E = x.shape
        qkv = self.qkv_proj(x).view(B, N, self.h, 3 * self.d)     # (B, N, H, 3 * d_h)
        q, k, v = qkv.permute(0, 2, 1, 3).chunk(3, dim=-1)      # each (B, H, N, d_h)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        dead = torch.isneginf(s).all(-1, keepdim=True)
        w = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, N, E)), w
""", "fused projection laid out (B, N, H, 3, d_h) instead of (B, N, 3, H, d_h)", "(B, N, 3, H, d_h)", 2)

port("timm Attention", "timm vision_transformer Attention (qkv reshape + permute)", CH3,
     "MultiHeadSelfAttention", """
class MultiHeadSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.num_heads = num_heads
        self.scale = (embed_dim // num_heads) ** -0.5
        self.qkv_proj = nn.Linear(embed_dim, embed_dim * 3, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x, mask=None):
        B, N, C = x.shape
        qkv = self.qkv_proj(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        if mask is not None:
            attn = attn.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else attn + mask
        dead = torch.isneginf(attn).all(-1, keepdim=True)
        attn = attn.masked_fill(dead, 0.0).softmax(dim=-1).masked_fill(dead, 0.0)
        return self.out_proj((attn @ v).transpose(1, 2).reshape(B, N, C)), attn
""", None)

# ----------------------------------------------------------------------------- chapter 4

port("PyTorch tutorial PositionalEncoding table", "PyTorch tutorial (float32 arange, exp/log frequencies)",
     CH4, "sinusoidal_positional_encoding", """
def sinusoidal_positional_encoding(max_len, d_model):
    position = torch.arange(max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe
""", None, None, 5)

port("annotated-transformer PositionalEncoding (1, max_len, d) buffer", "annotated-transformer",
     CH4, "SinusoidalPositionalEncoding", """
class SinusoidalPositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pe = sinusoidal_positional_encoding(max_len, d_model).unsqueeze(0)  # (1, max_len, d)
        self.register_buffer("pe", pe)

    def forward(self, x):
        if x.size(1) > self.pe.size(1):
            raise ValueError("sequence longer than max_len")
        return x + self.pe[:, : x.size(1)].to(x.dtype)
""", "the pe buffer is (1, max_len, d_model), not (max_len, d_model)", "(max_len, d_model)", 9)

port("PyTorch tutorial PositionalEncoding (max_len, 1, d) buffer", "PyTorch tutorial, made batch-first",
     CH4, "SinusoidalPositionalEncoding", """
class SinusoidalPositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pe = sinusoidal_positional_encoding(max_len, d_model).unsqueeze(1)  # (max_len, 1, d)
        self.register_buffer("pe", pe)

    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("sequence longer than max_len")
        return x + self.pe[: x.size(1)].transpose(0, 1).to(x.dtype)
""", "the pe buffer is (max_len, 1, d_model), not (max_len, d_model)", "(max_len, d_model)", 9)

port("GPT-NeoX rotate_half RoPE", "GPT-NeoX / HF rotary (halves, not interleaved pairs)", CH4,
     "apply_rotary_embedding", """
def apply_rotary_embedding(x, base=10000.0):
    L, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError("d must be even")
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d))
    t = torch.arange(L, dtype=torch.float64, device=x.device)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin
""", "pairs taken as the two halves (rotate_half) instead of interleaved (2i, 2i+1)", "interleaved")

port("LLaMA complex RoPE", "LLaMA precompute_freqs_cis / apply_rotary_emb", CH4,
     "apply_rotary_embedding", """
def apply_rotary_embedding(x, base=10000.0):
    L, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError("d must be even")
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d))
    t = torch.arange(L, dtype=torch.float64, device=x.device)
    freqs_cis = torch.polar(torch.ones(L, d // 2, dtype=torch.float64, device=x.device), torch.outer(t, freqs))
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * freqs_cis).flatten(-2).to(x.dtype)
""", None)

# ----------------------------------------------------------------------------- chapter 5

port("annotated-transformer subsequent_mask", "annotated-transformer `subsequent_mask`", CH5,
     "causal_mask", """
def causal_mask(seq_len, device=None):
    attn_shape = (1, seq_len, seq_len)
    subsequent = torch.triu(torch.ones(attn_shape, device=device), diagonal=1).type(torch.uint8)
    return subsequent == 0
""", "an extra leading axis: (1, L, L) instead of (L, L)", "extra leading axis", 7)

# ----------------------------------------------------------------------------- chapter 6

_AF = """
class MultiHeadAttention(MultiHeadAttention):  # a class of its own, as a notebook defines it
    pass


@add_to_class(MultiHeadAttention)
def forward(self, x, bias=None, attention_mask=None):
    q, k, v = self.linear_q(x), self.linear_k(x), self.linear_v(x)
    if self.is_global:
        q, k, v = self.prepare_qkv_global(q, k, v)
    else:
        q, k, v = self.prepare_qkv(q, k, v)
    q = q / math.sqrt(self.c)
    a = torch.einsum("...qc,...kc->...qk", q, k)
    if bias is not None:
        ones = (1,) * (a.dim() - bias.dim())
        a = a + bias.reshape(*bias.shape[:-3], *ones, *bias.shape[-3:])
    if attention_mask is not None:
        a = a + @OFFSET@
    a = torch.softmax(a, dim=-1)
    o = torch.einsum("...qk,...kc->...qc", a, v)
    o = o.transpose(-3, -2)
    o = o.reshape(*o.shape[:-2], self.N_head * self.c).movedim(-2, self.attn_dim)
    if self.gated:
        o = torch.sigmoid(self.linear_g(x)) * o
    return self.linear_o(o)
"""

port("AlphaFold worksheet (-1e8 offset)", "alphafold-decoded / the worksheet", CH6, "MultiHeadAttention",
     _AF.replace("@OFFSET@", "((attention_mask == 0) * -1e8)[..., None, None, :]"),
     "a -1e8 offset gives fully masked queries a uniform average, not zeros", "-1e8", 8)

port("worksheet offset turned into -inf", "the -1e8 version after following a 'use -inf' hint", CH6,
     "MultiHeadAttention",
     _AF.replace("@OFFSET@", "((attention_mask == 0) * float('-inf'))[..., None, None, :]"),
     "0 * -inf is NaN on every kept key", "masked_fill", 8)

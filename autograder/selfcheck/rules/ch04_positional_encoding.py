"""Chapter 4's comparison (the buffer's shape checked in its structure case only) and the hints no
mistake model shows."""
from __future__ import annotations

import dataclasses


def compare(call, student, expected, notes=None):
    """The generic comparison; SinusoidalPositionalEncoding's buffer shape only in its structure case."""
    from ...grading import compare as generic

    if call.exercise == "SinusoidalPositionalEncoding" and call.case != STRUCTURE_CASE \
            and student.params is not None and set(student.params) == set(expected.params or {}):
        student = dataclasses.replace(student, params=expected.params)  # names checked, shapes not here
    return generic.compare(call, student, expected, notes)


STRUCTURE_CASE = "the buffer pe is the (max_len, d_model) table: d_model=8, max_len=20, x (2, 5, 8)"


def _table_args(call):
    args = list(call.args) + [call.kwargs.get("max_len"), call.kwargs.get("d_model")]
    values = [a for a in args if a is not None]
    return int(values[0]), int(values[1])


def _length_hint(call, student, mismatch):
    """The ValueError is missing, or raised for L == max_len too."""
    if mismatch.aspect == "expected-error":
        return ("check the sequence length first: raise ValueError when x.shape[1] > max_len "
                "(x.shape[1] == max_len is allowed)")
    if mismatch.aspect == "error" and mismatch.message.startswith("ValueError"):
        return "L == max_len is allowed: raise ValueError only when L > max_len (use >, not >=)"
    return None


def _table_explain(call, student, expected, mismatch):
    max_len, d_model = _table_args(call)
    if mismatch.aspect == "shape" and student.meta and "shape" in student.meta[0]:
        shape = tuple(student.meta[0]["shape"])
        if shape == (d_model, max_len):
            return "the table is transposed: rows are positions, columns are features (max_len, d_model)"
        if d_model % 2 and shape == (max_len, d_model + 1):
            return ("an odd d_model gives one column too many: build d_model columns, the last one a sine "
                    "(cos fills only the d_model // 2 odd columns)")
        if len(shape) == 3:
            return "return a (max_len, d_model) table without a batch dimension"
    if d_model % 2 and mismatch.about_shapes:
        return ("an odd d_model has one sine column more than cosine columns: "
                "pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])")
    if mismatch.aspect == "dtype":
        return ("the table must have torch's default dtype (torch.get_default_dtype()): do not fix "
                "dtype=torch.float32 or go through numpy")
    return None


def _sinusoidal_module_explain(call, student, expected, mismatch):
    if mismatch.aspect == "params":
        if "no parameter or buffer named pe" in mismatch.message:
            return ("keep the table as a buffer: self.register_buffer('pe', table) in __init__ (so "
                    ".to(device) moves it and it is not a trainable parameter)")
        return ("the buffer `pe` must be the (max_len, d_model) table itself, as "
                "sinusoidal_positional_encoding(max_len, d_model) returns it")
    return _length_hint(call, student, mismatch)


def _learned_explain(call, student, expected, mismatch):
    h = _length_hint(call, student, mismatch)
    if h:
        return h
    if mismatch.aspect == "params":
        return "the module needs exactly one layer, embedding = nn.Embedding(max_len, d_model)"
    return None


def _rope_explain(call, student, expected, mismatch):
    if call.args[0].dim() > 2 and (mismatch.aspect == "shape" or mismatch.about_shapes):
        return ("this fails with leading batch dimensions: positions index the second-to-last axis "
                "(L = x.shape[-2]) and pairs the last one; use ... indexing (x[..., 0::2])")
    return None


EXPLAIN = {"sinusoidal_positional_encoding": _table_explain, "SinusoidalPositionalEncoding": _sinusoidal_module_explain,
           "LearnedPositionalEmbedding": _learned_explain, "apply_rotary_embedding": _rope_explain}

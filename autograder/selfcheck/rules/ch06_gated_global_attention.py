"""Chapter 6's hints that no mistake model shows (which layers, with which biases)."""
from __future__ import annotations


def _params_explain(call, student, expected, mismatch):
    if mismatch.aspect != "params":
        return None
    sp, ep = student.params or {}, expected.params or {}
    init = call.init or {}
    c, H = init.get("c"), init.get("N_head")
    if init.get("is_global") and sp.get("linear_k.weight", [None])[0] == c * H != c:
        return ("with is_global, linear_k and linear_v map c_in to c channels: one key/value head "
                "shared by all N_head query heads")
    if "linear_g.weight" in ep and "linear_g.weight" not in sp:
        return "with gated=True the module needs linear_g = nn.Linear(c_in, c * N_head) (with a bias)"
    if "linear_o.bias" in ep and "linear_o.bias" not in sp:
        return "linear_o always has a bias (only linear_q/k/v follow use_bias_for_embeddings)"
    if "linear_q.bias" in sp and "linear_q.bias" not in ep:
        return "linear_q, linear_k and linear_v have a bias only when use_bias_for_embeddings=True"
    if "linear_q.bias" in ep and "linear_q.bias" not in sp:
        return "with use_bias_for_embeddings=True, linear_q, linear_k and linear_v have a bias"
    return None


EXPLAIN = dict.fromkeys(("prepare_qkv", "prepare_qkv_global", "MultiHeadAttention"), _params_explain)

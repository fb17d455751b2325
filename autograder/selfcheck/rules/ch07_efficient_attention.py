"""Chapter 7's comparison (online_softmax_attention's memory property) and the hints no mistake
model shows."""
from __future__ import annotations

import math

import torch

from ...grading import compare as generic
from ...grading.compare import Mismatch


_CAP_WORDS = "192 MiB (Limits.memory_case)"  # (the student's package has no sandbox/limits.py)
_LIBRARY_WORDS = "numpy, scipy, matplotlib, IPython, pandas, seaborn, sklearn, tqdm, einops, PIL or sympy"
# (runtime/prepare.LIBRARIES: imported before the cap is measured; tests/sandbox/test_memory_case.py
# checks the two agree)


def _scores_size(call) -> str:
    """What all L_q x L_k scores of the call take, in the dtype it runs in."""
    q, k = call.args[0], call.args[1]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n = math.prod(batch) * q.shape[-2] * k.shape[-2] * getattr(torch, call.dtype).itemsize
    return f"the {n / 2**20:.0f} MiB that all L_q x L_k scores take in {call.dtype}"


def _cap_sentence(call) -> str:
    return (f"it may allocate {_CAP_WORDS} beyond what the process held before the notebook's "
            f"cells ran (what they keep counts too, and what they import other than {_LIBRARY_WORDS}), "
            f"less than {_scores_size(call)}.")


def memory_limit(call, expected) -> int:
    """The most elements one tensor may hold while online_softmax_attention runs: the largest
    input, the largest output, or one block of scores (batch x L_q x block_size)."""
    tensors = [t for t in call.args if isinstance(t, torch.Tensor)]
    tensors += [t for t in call.kwargs.values() if isinstance(t, torch.Tensor)]
    sizes = [t.numel() for t in tensors]
    sizes += [math.prod(m["shape"]) for m in expected.meta if "shape" in m]
    out_shape = expected.meta[0]["shape"]  # (..., L_q, d_v): its batch is the broadcast batch
    L_k = call.args[1].shape[-2]
    block = min(call.kwargs.get("block_size", 64), L_k)
    sizes.append(math.prod(out_shape[:-1]) * block)
    return max(sizes)


MEMORY_HINT = ("build the scores of one block of keys at a time (q @ k[..., j:j+block_size, :]^T), "
               "never q @ k^T for all keys at once, nor a mask or softmax over all keys: "
               "the point of the online softmax is that the L_q x L_k matrix never exists")


_OUT_OF_MEMORY = ("allocate", "memory", "MemoryError", "SIGKILL")


def compare(call, student, expected, notes=None):
    m = generic.compare(call, student, expected, notes)
    if m and call.capped_memory and m.aspect in ("error", "crash") and \
            any(w in m.message for w in _OUT_OF_MEMORY):
        m.message = f"the call ran out of memory: {_cap_sentence(call)} {m.message}"
        m.hint = MEMORY_HINT
        return m
    if m and call.capped_memory and m.aspect == "crash":
        m.message = (f"the memory-capped process ended during the call; running out of memory "
                     f"outside torch (in Python itself) can end it so: {_cap_sentence(call)} {m.message}")
        m.hint = MEMORY_HINT
        return m
    if m and call.capped_memory and m.aspect == "error" and "Operation not permitted" in m.message:
        m.message = (f"refused: the memory case runs where shared memory (mmap.mmap(-1, n), memfd, "
                     f"shmget), sockets and new processes (threads are fine) are refused, since "
                     f"memory there would escape the cap of {_CAP_WORDS}. {m.message}")
        m.hint = MEMORY_HINT
        return m
    if m or not (call.measure_memory or call.capped_memory) or call.exercise != "online_softmax_attention":
        return m
    largest = student.largest_tensor
    if largest is None:
        return None
    limit = memory_limit(call, expected)
    if largest[0] > limit:
        k = call.args[1]
        full = math.prod(expected.meta[0]["shape"][:-1]) * k.shape[-2]
        whole = f": {full} elements is the whole L_q x L_k score matrix" if largest[0] >= full else ""
        return Mismatch("memory", f"the values are right, but a tensor of {largest[0]} elements was created "
                        f"({largest[1]}); at most {limit} are allowed here (the largest input, the output or "
                        f"one block of L_q x block_size scores){whole}.",
                        hint=MEMORY_HINT)
    return None


def _explain(call, student, expected, mismatch) -> str | None:
    """Hints the models cannot show: the cache's shape and structure, NaN from the running max."""
    ex = call.exercise
    if ex == "GroupedQueryAttention" and mismatch.aspect == "shape" and mismatch.output in (2, 3) \
            and call.init and student.meta[mismatch.output].get("shape", [0, 0])[1] == call.init["num_heads"] \
            != call.init["num_kv_heads"]:
        return ("the returned cache has num_heads heads: return the keys and values before repeat_kv, "
                "with num_kv_heads heads (that is what makes the cache small)")
    if ex == "GroupedQueryAttention" and mismatch.aspect == "returned":
        return "return (output, weights, (k, v)): the cache as a pair of tensors, each (B, H_kv, L_past + L, d_h)"
    if ex == "repeat_kv" and call.args[0].dim() != 4 and (mismatch.aspect in ("error", "shape")):
        return ("repeat_kv takes any number of leading axes, (..., H_kv, L, d), not only 4-D (B, H_kv, L, d) "
                "tensors: index from the end, e.g. x.repeat_interleave(n_rep, dim=-3), not x[:, :, None, :, :]")
    if ex == "alibi_bias" and call.expect_error == "ValueError":
        return ("raise ValueError unless num_heads is a power of two: the contract's slopes 2 ** (-8 (h+1) / H) "
                "are defined for those only (the paper's code interpolates slopes for other head counts; this "
                "contract does not)")
    if ex == "repeat_kv" and mismatch.aspect == "shape":
        return ("repeat along the head axis (dim=-3, the third from last): (..., H_kv, L, d) becomes "
                "(..., H_kv * n_rep, L, d)")
    if ex == "online_softmax_attention" and mismatch.aspect == "nonfinite":
        return ("a NaN or inf where the reference is finite: subtract a finite stand-in (0) where the running "
                "maximum is still -inf, and give a fully masked query a zero output")
    return None


EXPLAIN = dict.fromkeys(("online_softmax_attention", "repeat_kv", "GroupedQueryAttention", "sliding_window_mask",
                         "alibi_bias"), _explain)

"""Chapter 8's comparison (FeedForward's and TransformerBlock's training-mode dropout, graded by
properties; chapter 3's rule for the rest) and the hints no mistake model shows.

The properties compare with what the mistake-free models compute on the call (`probe`): the
grader computes it there (`cases.ch08_transformer.dropout_probe`), the self-check reads it from its
data, so no model is needed here."""
from __future__ import annotations

import math

from ...grading.compare import Mismatch, compare_meta
from ..hint_engine import model_hint, with_spec
from .ch03_multi_head_attention import EXPLAIN as CH03_EXPLAIN
from .ch03_multi_head_attention import compare as ch03_compare


def compare(call, student, expected, notes=None, probe=None):
    """Chapter 3's comparison (training-mode dropout of MultiHeadAttention graded by properties),
    and FeedForward's and TransformerBlock's training-mode dropout by their own properties."""
    if call.exercise == "FeedForward" and call.train and (call.init or {}).get("dropout"):
        return ff_dropout_properties(call, student, expected, probe["eval_out"])
    if call.exercise == "TransformerBlock" and call.train and (call.init or {}).get("dropout"):
        return block_dropout_properties(call, student, expected, probe["options"], probe["ff"])
    return ch03_compare(call, student, expected, notes)


def block_dropout_properties(call, student, expected, options, ff_of):
    """TransformerBlock in training mode with p > 0, on a probe of one position per sequence
    (L=1, one head): the attention has one key, so its dropout keeps that weight (scaled to
    1/(1-p)) or drops it, and h = x + a is one of two vectors, `options` (dropped, kept), with
    ff(ln_2(h)) / (1-p) of each in `ff_of`. What holds whatever the random stream: (1) shape,
    dtype and device as the reference's, finite values; (2) for every sequence, out - h for one
    of the two is, element by element, 0 or ff(ln_2(h)) / (1-p): dropout acts on the attention
    weights and on fc2's output, nowhere else (not on the residual branches, nor after the
    activation); (3) the shares dropped, of attention weights and of feed-forward outputs,
    within 5 standard deviations of p. The reference's own draw must pass, or it is a grader bug."""
    m = compare_meta(call, student, expected)
    if m:
        return m
    p = float(call.init["dropout"])
    rtol, atol = (1e-5, 1e-7) if call.dtype == "float64" else (1e-3, 1e-4)

    def violation(outcome):
        out = outcome.outputs[0].double()
        if not out.isfinite().all():
            return Mismatch("nonfinite", "in training mode the output contains NaN or inf.", output=0)
        attn_dropped, ff_dropped, ff_total = 0, 0, 0
        for b in range(out.shape[0]):
            fits = []
            for kept, h in enumerate(options):
                d = out[b] - h[b]
                zero = d.abs() <= atol
                if bool((zero | d.isclose(ff_of[kept][b], rtol=rtol, atol=atol)).all()):
                    fits.append((kept, int(zero.sum())))
            if not fits:
                return Mismatch("values", f"in training mode with dropout={p}, sequence {b}'s output is not x + a + "
                                "ff(ln_2(x + a)) with dropout on the attention weights and on the feed-forward output "
                                "only: dropout acts inside the attention (on its weights) and in FeedForward (on fc2's "
                                "output), not on the residual branches, the input or after the activation.",
                                output=0, where=[b])
            kept, zeros = fits[0]
            attn_dropped += 1 - kept
            ff_dropped, ff_total = ff_dropped + zeros, ff_total + out[b].numel()
        for what, dropped, n in (("attention weights", attn_dropped, out.shape[0]),
                                 ("feed-forward outputs", ff_dropped, ff_total)):
            if abs(dropped / n - p) > 5 * math.sqrt(p * (1 - p) / n):
                return Mismatch("values", f"in training mode with dropout={p}, {dropped} of {n} {what} were "
                                f"dropped (expected about {p:.0%}): dropout must act on them in training mode, "
                                "with p the probability of dropping.", output=0)
        return None

    if violation(expected) is not None:
        return Mismatch("grader", "the reference fails its own training-mode dropout check; "
                        "please report this to your instructor.")
    return violation(student)


def ff_dropout_properties(call, student, expected, eval_out):
    """FeedForward in training mode with p > 0, graded by what holds whatever the random stream:
    (1) shape, dtype and device as the reference's; (2) every output element is 0 (dropped) or
    the eval-mode output / (1-p): dropout acts once, on fc2's output; (3) the share dropped is
    within 5 standard deviations of p. The reference's own draw must pass, or it is a grader bug."""
    m = compare_meta(call, student, expected)
    if m:
        return m
    p = float(call.init["dropout"])

    def violation(outcome):
        out = outcome.outputs[0].double()
        if not out.isfinite().all():
            return Mismatch("nonfinite", "in training mode the output contains NaN or inf.", output=0)
        rtol, atol = (1e-5, 1e-7) if call.dtype == "float64" else (1e-3, 1e-4)
        dropped = out.abs() <= atol
        kept = out.isclose(eval_out / (1 - p), rtol=rtol, atol=atol)
        bad = ~(dropped | kept)
        if bad.any():
            idx = tuple(int(i) for i in bad.nonzero()[0])
            return Mismatch("values", f"in training mode with dropout={p}, each output element is either 0 "
                            f"(dropped) or the eval-mode value divided by (1 - p) = {1 - p}; at index {idx} it is "
                            f"{out[idx].item():.6g} (eval-mode value {eval_out[idx].item():.6g}): dropout acts once, "
                            "on fc2's output (not after the activation, nor twice).", output=0, where=list(idx))
        n = out.numel()
        share, sd = float(dropped.double().mean()), (p * (1 - p) / n) ** 0.5
        if abs(share - p) > 5 * sd:
            return Mismatch("values", f"in training mode with dropout={p}, {share:.0%} of the output was dropped "
                            f"(expected about {p:.0%}): pass p as the drop probability, not the keep one.", output=0)
        return None

    if violation(expected) is not None:
        return Mismatch("grader", "the reference fails its own training-mode dropout check; "
                        "please report this to your instructor.")
    return violation(student)


@with_spec
def _explain_tiny(call, student, expected, mismatch, spec):
    if mismatch.aspect == "params" and "head.weight" not in (student.params or {}) \
            and "tok_emb.weight" in (student.params or {}):
        return ("the output head is tied to the token embedding (head.weight = tok_emb.weight, or logits = "
                "x @ tok_emb.weight.T, as GPT-2 does): this model's head = nn.Linear(embed_dim, vocab_size) has "
                "a weight of its own, and a bias")
    if call.train and (call.init or {}).get("dropout") and mismatch.aspect == "values" and mismatch.output == 0 \
            and model_hint(spec, call, student, expected) is None:
        return ("dropout acts outside the blocks (on the embeddings as GPT-2 and nanoGPT do, on the residual "
                "stream, or after ln_f): in this model it acts only inside each block, on the attention weights "
                "and on the feed-forward output")
    if call.expect_error == "ValueError":
        return "raise ValueError in forward when the sequence is longer than max_len"
    if mismatch.aspect == "returned" and (student.returned or "").startswith("tuple(Tensor, Tensor"):
        return ("return (logits, weights) with weights the list of every block's weights, first block "
                "first, not only the last block's")
    return None


EXPLAIN = {"MultiHeadAttention": CH03_EXPLAIN["MultiHeadAttention"], "TinyTransformer": _explain_tiny}

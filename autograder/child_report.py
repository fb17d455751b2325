"""What a chapter's child reports, checked before the grader believes any of it.

The child is untrusted: every field is checked for type, strings are capped, and only plain
tensors (the `wire` decoder's own) are accepted.
"""
from __future__ import annotations

from dataclasses import fields

import torch

from .calls import Outcome

_OUTCOME_FIELDS = {f.name for f in fields(Outcome)}
_MAX_TEXT = 20_000  # longest string accepted in an Outcome from the child


def _text(x, limit: int = _MAX_TEXT) -> str:
    if not isinstance(x, str):
        raise TypeError("expected a string")
    return x if len(x) <= limit else x[:limit] + " …"


def plain_error(err) -> dict | None:
    if err is None:
        return None
    if not isinstance(err, dict):
        return {"type": "Error", "message": "(unreadable error)", "where": ""}
    out = {}
    for key in ("type", "message", "where"):
        value = err.get(key, "")
        out[key] = value[:_MAX_TEXT] if isinstance(value, str) else ""
    mro = err.get("mro")
    if isinstance(mro, list) and all(isinstance(m, str) for m in mro):
        out["mro"] = [m[:200] for m in mro[:50]]
    return out


def _tensor_or_none(x):
    if x is None:
        return None
    if type(x) is not torch.Tensor:  # decode makes plain tensors; anything else is forged
        raise TypeError("expected a tensor")
    return x


def validated(d) -> Outcome | None:
    """An Outcome built from the child's plain data, or None when it is not well formed.

    The child is untrusted: every field is checked for type, strings are capped, and only
    plain tensors (the wire decoder's own) are accepted.
    """
    try:
        if not isinstance(d, dict) or not set(d) <= _OUTCOME_FIELDS:
            return None
        out = Outcome()
        if d.get("error") is not None:
            out.error = plain_error(d["error"])
        out.returned = _text(d.get("returned", ""), 500)
        outputs = d.get("outputs", [])
        meta = d.get("meta", [])
        if not isinstance(outputs, list) or not isinstance(meta, list) or len(outputs) > 1000:
            return None
        out.outputs = [_tensor_or_none(x) for x in outputs]
        for m in meta:
            if not isinstance(m, dict):
                return None
            clean = {}
            for k, v in m.items():
                if k == "shape":
                    if not (isinstance(v, list) and all(isinstance(s, int) for s in v)):
                        return None
                    clean[k] = v
                elif k in ("dtype", "device", "type"):
                    clean[k] = _text(v, 200)
            out.meta.append(clean)
        grads = d.get("grads", {})
        if not isinstance(grads, dict):
            return None
        out.grads = {_text(k, 500): _tensor_or_none(v) for k, v in grads.items()}
        params = d.get("params")
        if params is not None:
            if not isinstance(params, dict):
                return None
            out.params = {}
            for k, v in params.items():
                if not (isinstance(v, list) and all(isinstance(s, int) for s in v)):
                    return None
                out.params[_text(k, 500)] = v
        if d.get("load_error") is not None:
            out.load_error = _text(d["load_error"])
        for key in ("inputs_modified", "forbidden", "called"):
            value = d.get(key, [])
            if not isinstance(value, list):
                return None
            setattr(out, key, [_text(v, 500) for v in value[:100]])
        seconds = d.get("seconds", 0.0)
        out.seconds = float(seconds) if isinstance(seconds, (int, float)) else 0.0
        largest = d.get("largest_tensor")
        if largest is not None:
            if not (isinstance(largest, list) and len(largest) == 2 and type(largest[0]) is int):
                return None
            out.largest_tensor = [largest[0], _text(largest[1], 200)]
        return out
    except (TypeError, ValueError, AttributeError):
        return None

"""What a chapter's child reports, checked before the grader believes any of it.

The child is untrusted: every field is checked for type, strings are capped, and only plain
tensors (the `wire` decoder's own) are accepted. What it says about the notebook's code is
checked against the notebook's own parse (`source.submission.ParsedSubmission`, the one the
grader's other checks read).
"""
from __future__ import annotations

import re
from dataclasses import fields

import torch

from ..shared.calls import Outcome
from ..source.submission import ParsedSubmission

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
    if err.get("stub") is True:  # (`execute.stub_raise`: believed only where it fails the student's cases)
        out["stub"] = True
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
        out.meta = [_meta_entry(m) for m in meta]
        grads = d.get("grads", {})
        if not isinstance(grads, dict):
            return None
        out.grads = {_text(k, 500): _tensor_or_none(v) for k, v in grads.items()}
        params = d.get("params")
        if params is not None:
            out.params = _params(params)
        if d.get("load_error") is not None:
            out.load_error = _text(d["load_error"])
        for key in ("inputs_modified", "forbidden", "called", "transient"):
            value = d.get(key, [])
            if not isinstance(value, list):
                return None
            setattr(out, key, [_text(v, 500) for v in value[:100]])
        seconds = d.get("seconds", 0.0)
        out.seconds = float(seconds) if isinstance(seconds, (int, float)) else 0.0
        out.device_note = _text(d.get("device_note", ""), 300)
        largest = d.get("largest_tensor")
        if largest is not None:
            if not (isinstance(largest, list) and len(largest) == 2 and type(largest[0]) is int):
                return None
            out.largest_tensor = [largest[0], _text(largest[1], 200)]
        return out
    except (TypeError, ValueError, AttributeError):
        return None


class _Malformed(ValueError):
    """Raised by `validated`'s helpers on data that is not well formed (`validated` returns None)."""


def _shape(v) -> list:
    if not (isinstance(v, list) and all(isinstance(s, int) for s in v)):
        raise _Malformed
    return v


def _meta_entry(m) -> dict:
    """One output's meta: its shape (a list of ints), and dtype, device and type as capped text;
    any other key is dropped."""
    if not isinstance(m, dict):
        raise _Malformed
    clean = {}
    for k, v in m.items():
        if k == "shape":
            clean[k] = _shape(v)
        elif k in ("dtype", "device", "type"):
            clean[k] = _text(v, 200)
    return clean


def _params(params) -> dict:
    """The module's parameter shapes by (capped) name."""
    if not isinstance(params, dict):
        raise _Malformed
    clean = {}
    for k, v in params.items():
        shape = _shape(v)
        clean[_text(k, 500)] = shape
    return clean


_CELL_FRAME = re.compile(r"^<cell (\d+)>, line (\d+), in [^:]*: (.*)$")


def traceback_in_source(error: dict | None, cells) -> bool:
    """Whether an error's traceback (`execute.student_frames`: "<cell N>, line L, in f: text")
    could have come from the notebook the grader sent: every frame it places in a cell names a
    line that exists there with that text. A forged error that cites code the student never
    wrote is refused (the child is believed about nothing the grader can check itself).
    cells: the cells as they run, or their `ParsedSubmission`."""
    if not error or not error.get("where"):
        return True
    for line in error["where"].splitlines():
        m = _CELL_FRAME.match(line)
        if not m:
            continue
        number, lineno, text = int(m[1]), int(m[2]), m[3].strip()
        if not 1 <= number <= len(cells):
            return False
        source = cells[number - 1].splitlines()
        if not 1 <= lineno <= len(source) or source[lineno - 1].strip() != text:
            return False
    return True


def _innermost_cell_frame(where: str) -> tuple[int, str] | None:
    frames = [m for m in map(_CELL_FRAME.match, where.splitlines()) if m]
    return (int(frames[-1][1]), frames[-1][3].strip()) if frames else None


def _is_a(type_name: str, expected: str, classes: dict, depth: int = 0) -> bool:
    """Whether the exception class `type_name` is (a subclass of) `expected`, judged from
    Python's own built-in classes and the notebook's class definitions, never from the mro the
    child claims."""
    import builtins

    if type_name == expected:
        return True
    builtin = getattr(builtins, type_name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        return expected in [c.__name__ for c in builtin.__mro__]
    if depth > 8 or type_name not in classes:
        return False
    return any(_is_a(base, expected, classes, depth + 1) for base in classes[type_name])


def _definition_span(source: ParsedSubmission, name: str) -> tuple[int, int, int] | None:
    """(cell number, first line, last line) of the notebook's last top-level definition of
    `name` (cells run top to bottom: the last one is what is graded)."""
    found = source.definitions.get(name)
    if found is None:
        return None
    number, node = found
    return number, node.lineno, node.end_lineno or node.lineno


def expected_error_credible(error: dict, expected: str, cells, target: str | None = None) -> bool:
    """Whether an error the case asks for (`Call.expect_error`) was raised by the student's own
    code, as far as the grader can tell from the notebook it sent: the traceback names lines
    of the notebook (`traceback_in_source`), the innermost of them is a `raise` of that
    exception's class, and that class is `expected` or a subclass (Python's built-ins, or a
    class the notebook defines), and one of its lines lies in the definition of `target` (the
    graded function or class). A child that only claims the error fails the case.
    cells: the notebook's `ParsedSubmission` (or its cells as they run)."""
    source = ParsedSubmission.of(cells)
    where = error.get("where") or ""
    frame = _innermost_cell_frame(where)
    type_name = str(error.get("type", ""))
    if frame is None or not traceback_in_source(error, source):
        return False
    _, text = frame
    # (a `raise` anywhere on the line: `if h % n: raise ValueError(...)` is a raise too)
    if not (re.search(r"\braise\b", text) and re.search(rf"\b{re.escape(type_name)}\b", text)):
        return False
    if not _is_a(type_name, expected, source.class_bases):
        return False
    if target is None:
        return True
    span = _definition_span(source, target)
    frames = [(int(m[1]), int(m[2])) for m in map(_CELL_FRAME.match, where.splitlines()) if m]
    return span is not None and any(n == span[0] and span[1] <= line <= span[2] for n, line in frames)

"""In-place changes of a graded function's inputs, found in its source without running it.

In-place changes of inputs (`ExerciseFindings.inplace`). Only in the function that the grader
calls (the function; for a module its `forward`, or `__call__` where the notebook's class
defines one; for a method exercise that method) and only for the parameters that receive a
tensor in the grader's cases (`tensor_params_from_cases`). A parameter counts while it (or a
name bound to it or to a view of it: `y = x`, `y = x.view(...)`, `y = x[0]`) has not been
bound to anything else earlier in the function (by position in the source; any assignment,
augmented assignment to a non-alias, for target, with-as, walrus, import, del): then these are
changes of the input:

- a call of an in-place tensor method on it or on a view of it: `x.masked_fill_(...)`,
  `x.mul_(2)`, `x.data.zero_()`, `x[0].add_(1)`, `x.view(-1).copy_(y)` (any attribute ending
  in one underscore that `torch.Tensor` has, except `requires_grad_`, `detach_`,
  `share_memory_` and `rename_`, which change no values), also `x.__setitem__`, `x.__iadd__`;
- a torch function that writes into its argument: `torch.Tensor.mul_(x, 2)`, `torch.relu_(x)`,
  `F.relu_(x)`, `nn.init.zeros_(x)`, `F.relu(x, inplace=True)` (dropout with inplace=True is
  not flagged: in eval mode it changes nothing), `torch.add(a, b, out=x)`;
- an augmented assignment `x += ...`, `x *= ...` (the operators `torch.Tensor` does in place),
  `x[...] += ...`;
- an item or `.data` assignment: `x[...] = ...`, `x.data = ...`, `x.T[0] = ...`.

Deliberately not flagged (a false finding would cost an honest student points, so anything
uncertain is left to the run-time check): code reached only through dynamic dispatch (names
built at run time, `globals()[...]`, `sys.modules[__name__]`, objects passed in), a method
of a class that nothing in the scope names, changes made inside helper functions or nested
functions, changes through views whose sharing is not certain (`reshape`, `contiguous`,
`to`, advanced indexing such as `x[idx].mul_()` with a non-constant index, which copies),
in-place changes after any rebinding of the name, `exec` of non-constant strings, and
definitions hidden behind a statement that raises (every cell is assumed to run to the end).
Code that never runs is skipped: branches whose test is a false constant (`if False:`) or a
top-level flag only ever set to one (`DEBUG = False` ... `if DEBUG:`), and annotations.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable

import torch

from ..shared.calls import Call
from .symbols import Notebook, COMPREHENSIONS, comprehension_targets, graded_function, local_names, parameter_names, stored_names
from .submission import ParsedSubmission


@dataclass(frozen=True)
class InPlaceChange:
    """One statement that changes an input tensor of the graded call in place.

    param: the parameter (of the student's signature) whose tensor is changed.
    how: the operation ("masked_fill_", "+=", "[...] =", ".data =", "out=", "inplace=True").
    method: the method checked (None: the function, or a module's forward/__call__).
    """

    param: str
    how: str
    cell: int
    line: int
    code: str
    method: str | None = None

    def describe(self) -> str:
        return (f"cell {self.cell}, line {self.line}: `{self.code}` changes the input "
                f"`{self.param}` in place ({self.how})")


# Tensor methods that change no values although they end in "_".
_NOT_CHANGING = frozenset({"requires_grad_", "detach_", "share_memory_", "rename_"})
# torch functions ending in "_" that do not write into their first argument's values.
_NOT_WRITING = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_"})
_DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                       "feature_alpha_dropout"})
_AUG_DUNDER = {
    ast.Add: "__iadd__", ast.Sub: "__isub__", ast.Mult: "__imul__", ast.Div: "__itruediv__",
    ast.FloorDiv: "__ifloordiv__", ast.Mod: "__imod__", ast.Pow: "__ipow__",
    ast.LShift: "__ilshift__", ast.RShift: "__irshift__", ast.BitOr: "__ior__",
    ast.BitXor: "__ixor__", ast.BitAnd: "__iand__", ast.MatMult: "__imatmul__",
}
_AUG_SYMBOL = {
    ast.Add: "+=", ast.Sub: "-=", ast.Mult: "*=", ast.Div: "/=", ast.FloorDiv: "//=", ast.Mod: "%=",
    ast.Pow: "**=", ast.LShift: "<<=", ast.RShift: ">>=", ast.BitOr: "|=", ast.BitXor: "^=",
    ast.BitAnd: "&=", ast.MatMult: "@=",
}
_INPLACE_DUNDERS = frozenset({"__setitem__"} | {d for d in _AUG_DUNDER.values() if hasattr(torch.Tensor, d)})
# Results that share the storage of the tensor they are taken from, always.
_VIEW_ATTRS = frozenset({"data", "T", "mT", "H", "mH", "real"})
_VIEW_METHODS = frozenset({
    "view", "view_as", "transpose", "permute", "unsqueeze", "squeeze", "narrow", "select",
    "diagonal", "detach", "t", "movedim", "moveaxis", "swapaxes", "swapdims", "as_strided",
})
# Tuples of views: one of their items (x.chunk(2)[0]) is a view.
_SPLITS = frozenset({"split", "chunk", "unbind", "tensor_split", "hsplit", "vsplit", "dsplit",
                     "split_with_sizes"})


def _is_inplace_method(name: str) -> bool:
    return (name.endswith("_") and not name.endswith("__") and not name.startswith("_")
            and name not in _NOT_CHANGING and hasattr(torch.Tensor, name))


def _writes_first_argument(name: str) -> bool:
    """A torch function (torch.*, torch.Tensor.*, F.*, nn.init.*) that writes into its first
    argument."""
    if name in _INPLACE_DUNDERS:
        return True
    if not name.endswith("_") or name.endswith("__") or name.startswith("_"):
        return False
    if name in _NOT_CHANGING or name in _NOT_WRITING:
        return False
    return any(hasattr(m, name) for m in (torch.Tensor, torch, torch.nn.functional, torch.nn.init))


def _basic_index(index) -> bool:
    """An index that certainly selects a view (constants, slices, ..., None), never a copy."""
    if isinstance(index, ast.Tuple):
        return all(_basic_index(e) for e in index.elts)
    if isinstance(index, ast.Slice):
        return True
    if isinstance(index, ast.Constant):
        return index.value is None or index.value is Ellipsis or (
            isinstance(index.value, int) and not isinstance(index.value, bool))
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
        return isinstance(index.operand, ast.Constant) and isinstance(index.operand.value, int)
    return False


def _chain_root(expr) -> str | None:
    """The name whose tensor `expr` certainly shares storage with: x, x.data, x[0], x.T,
    x.view(-1), x.detach(), x.chunk(2)[0], ... (None when not certain)."""
    for _ in range(200):
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.Attribute) and expr.attr in _VIEW_ATTRS:
            expr = expr.value
        elif isinstance(expr, ast.Subscript) and _basic_index(expr.slice):
            expr = expr.value
            if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
                    and expr.func.attr in _SPLITS):
                expr = expr.func.value
        elif (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
              and expr.func.attr in _VIEW_METHODS):
            expr = expr.func.value
        else:
            return None
    return None


@dataclass
class _Event:
    time: tuple
    bind: bool
    name: str
    src: str | None = None  # bind: the name whose tensor the new value is a view of
    how: str = ""
    line: int = 0


class _InPlace:
    """Events (bindings and in-place changes) of one function body, in source order."""

    def __init__(self, nb: Notebook, fn):
        self.nb, self.fn = nb, fn
        self.events: list[_Event] = []
        self.local_imports: dict[str, str] = {}
        self.locals = local_names(fn)

    def bind(self, name: str, node, src: str | None = None, at_end: bool = True) -> None:
        time = ((node.end_lineno or 0, node.end_col_offset or 0) if at_end
                else (node.lineno, node.col_offset))
        self.events.append(_Event(time, True, name, src))

    def change(self, name: str | None, node, how: str, shadow: frozenset) -> None:
        if name is not None and name not in shadow:
            self.events.append(_Event((node.lineno, node.col_offset), False, name, how=how, line=node.lineno))

    def collect(self) -> None:
        body = self.fn.body if isinstance(self.fn.body, list) else [self.fn.body]
        stack = [(n, frozenset()) for n in body]
        while stack:
            node, shadow = stack.pop()
            stack.extend(self._visit(node, shadow))

    def _visit(self, node, shadow: frozenset) -> list:
        """Records what one node binds or changes; returns the (node, shadow) pairs to visit
        next, in the order they go on the stack. Nested definitions and lambdas are not entered;
        the body of a branch that is never taken (`if DEBUG:` with DEBUG false) is skipped."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.bind(node.name, node, at_end=False)
            return []
        if isinstance(node, ast.Lambda):
            return []
        if isinstance(node, COMPREHENSIONS):
            inner = shadow | comprehension_targets(node)
            return [(c, inner) for c in ast.iter_child_nodes(node)]
        if (isinstance(node, (ast.If, ast.While, ast.IfExp))
                and self.nb.is_false(node.test, lambda n: n in self.locals)):
            orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
            return [(node.test, shadow), *((s, shadow) for s in orelse)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            return self._assign(node, shadow)
        if isinstance(node, ast.AugAssign):
            self._aug_assign(node, shadow)
            return [(node.value, shadow)]
        if isinstance(node, (ast.For, ast.AsyncFor)):
            for name in stored_names(node.target):
                self.bind(name, node.target)
            return [(node.iter, shadow), *((s, shadow) for s in [*node.body, *node.orelse])]
        if isinstance(node, (ast.With, ast.AsyncWith)):
            return self._with(node, shadow)
        if isinstance(node, ast.NamedExpr):
            if isinstance(node.target, ast.Name):
                self.bind(node.target.id, node, src=_chain_root(node.value))
            return [(node.value, shadow)]
        self._record(node, shadow)
        return [(c, shadow) for c in ast.iter_child_nodes(node)]

    def _assign(self, node, shadow: frozenset) -> list:
        if node.value is None:  # a bare annotation binds nothing
            return []
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        single = len(targets) == 1 and isinstance(targets[0], ast.Name)
        src = _chain_root(node.value) if single else None
        for t in targets:
            self._target(t, node, src if single else None, shadow)
        return [(node.value, shadow)]

    def _aug_assign(self, node: ast.AugAssign, shadow: frozenset) -> None:
        """`x += ...` changes x in place where a tensor has the in-place operator; `x[...] += ...`
        and `x.data += ...` change x."""
        t = node.target
        symbol = _AUG_SYMBOL.get(type(node.op), "op=")
        if isinstance(t, ast.Name):
            if hasattr(torch.Tensor, _AUG_DUNDER.get(type(node.op), "")):
                self.change(t.id, node, symbol, shadow)
            self.bind(t.id, node, src=t.id)  # x += ... keeps x's tensor
        elif isinstance(t, ast.Subscript):
            self.change(_chain_root(t.value), node, f"[...] {symbol}", shadow)
        elif isinstance(t, ast.Attribute) and t.attr == "data":
            self.change(_chain_root(t.value), node, f".data {symbol}", shadow)

    def _with(self, node, shadow: frozenset) -> list:
        visit = []
        for item in node.items:
            visit.append((item.context_expr, shadow))
            if item.optional_vars is not None:
                for name in stored_names(item.optional_vars):
                    self.bind(name, item.optional_vars)
        return visit + [(s, shadow) for s in node.body]

    def _record(self, node, shadow: frozenset) -> None:
        """What any other node binds (except, import, del, global, match patterns), or a call's changes."""
        if isinstance(node, ast.ExceptHandler):
            if node.name:
                self.bind(node.name, node, at_end=False)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    continue
                name = alias.asname or alias.name.split(".")[0]
                self.bind(name, node, at_end=False)
                if isinstance(node, ast.Import):
                    self.local_imports[name] = alias.name if alias.asname else name
                elif node.module and not node.level:
                    self.local_imports[name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.bind(t.id, node, at_end=False)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                self.events.append(_Event((0, 0), True, name))
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            self.bind(node.name, node, at_end=False)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            self.bind(node.rest, node, at_end=False)
        elif isinstance(node, ast.Call):
            self._call(node, shadow)

    def _target(self, t, stmt, src: str | None, shadow: frozenset) -> None:
        if isinstance(t, ast.Name):
            self.bind(t.id, stmt, src=src)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._target(e, stmt, None, shadow)
        elif isinstance(t, ast.Starred):
            self._target(t.value, stmt, None, shadow)
        elif isinstance(t, ast.Subscript):
            self.change(_chain_root(t.value), t, "[...] =", shadow)
        elif isinstance(t, ast.Attribute) and t.attr == "data":
            self.change(_chain_root(t.value), t, ".data =", shadow)

    def _torch_path(self, expr) -> str | None:
        """The dotted torch name a function expression certainly is (torch.Tensor.mul_,
        F.relu, zeros_ from `from torch.nn.init import zeros_`), else None."""
        parts = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        if expr.id in self.local_imports:
            path = self.local_imports[expr.id]
        elif expr.id in self.locals:
            return None
        else:
            b = self.nb.resolve(expr.id)
            if b is None or b.kind != "import":
                return None
            path = b.path or ""
        if path.split(".")[0] != "torch":
            return None
        return ".".join([path, *reversed(parts)])

    def _call(self, node: ast.Call, shadow: frozenset) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and (_is_inplace_method(f.attr) or f.attr in _INPLACE_DUNDERS):
            root = _chain_root(f.value)
            if root is not None:
                self.change(root, node, f.attr, shadow)
        path = self._torch_path(f)
        if path is None:
            return
        last = path.rsplit(".", 1)[-1]
        if _writes_first_argument(last) and node.args:
            self.change(_chain_root(node.args[0]), node, last, shadow)
        for kw in node.keywords:
            if kw.arg == "out":
                outs = kw.value.elts if isinstance(kw.value, (ast.Tuple, ast.List)) else [kw.value]
                for o in outs:
                    self.change(_chain_root(o), node, "out=", shadow)
            elif (kw.arg == "inplace" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                  and last not in _DROPOUTS and node.args):
                self.change(_chain_root(node.args[0]), node, "inplace=True", shadow)

    def changes(self, watched: list[str]) -> list[tuple[str, str, int]]:
        """(parameter, how, line) of each change of a watched parameter's tensor."""
        alias = {p: p for p in watched}
        tainted: set = set()
        out = []
        for e in sorted(self.events, key=lambda e: (e.time, not e.bind)):
            if e.bind:
                if e.name in tainted:
                    continue
                if e.src is not None and e.src in alias:
                    alias[e.name] = alias[e.src]
                else:
                    alias.pop(e.name, None)
                    tainted.add(e.name)
            elif e.name in alias:
                out.append((alias[e.name], e.how, e.line))
        return out


def inplace_findings(nb: Notebook, target: str, is_class: bool, method: str | None,
                      tensor_names: set) -> list[InPlaceChange]:
    got = graded_function(nb, target, is_class, method)
    if got is None:
        return []
    fn, cell, skip_first = got
    positional, keywordable = parameter_names(fn, skip_first)
    params = set(positional) | keywordable
    watched = sorted(p for p in params if p in tensor_names)
    if not watched:
        return []
    walker = _InPlace(nb, fn)
    walker.collect()
    seen, out = set(), []
    for param, how, line in walker.changes(watched):
        if (param, line, how) not in seen:
            seen.add((param, line, how))
            out.append(InPlaceChange(param, how, cell, line, nb.code(cell, line), method))
    return out


# ------------------------------------------------------------------------------------ the API


def tensor_params_from_cases(calls: Iterable[Call], cells) -> dict[str, dict[str | None, set[str]]]:
    """exercise -> method (None: the function, or a module's forward) -> the parameters of the
    student's signature that receive a tensor in the given Calls (positional arguments by
    position, after `self` for a method; keyword arguments by name). `cells`: the notebook's
    `submission.ParsedSubmission`, or its code cells as they run. Never raises."""
    out: dict = {}
    try:
        nb = ParsedSubmission.of(cells).symbols
        signatures: dict = {}
        for call in calls:
            try:
                if getattr(call, "answer", False):
                    continue
                names = out.setdefault(call.exercise, {}).setdefault(call.method, set())
                key = (call.target, call.init is not None, call.method)
                if key not in signatures:
                    got = graded_function(nb, *key)
                    signatures[key] = parameter_names(got[0], got[2]) if got else None
                if signatures[key] is None:
                    continue
                positional, keywordable = signatures[key]
                for i, value in enumerate(call.args or ()):
                    if i < len(positional) and isinstance(value, torch.Tensor):
                        names.add(positional[i])
                for k, value in (call.kwargs or {}).items():
                    if k in keywordable and isinstance(value, torch.Tensor):
                        names.add(k)
            except Exception:
                continue
    except Exception:
        pass
    return out

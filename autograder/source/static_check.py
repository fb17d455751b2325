"""Static checks of a submission's source: forbidden built-ins and in-place changes of inputs.

Two graded properties are also measured at run time inside the student's process (execute.py:
the `_Recorder` TorchFunctionMode for forbidden functions, the comparison of inputs before and
after a call), which the student controls: emptying the forbidden-op table or disabling the
comparison there changes what that process reports. The grader has the notebook's source, so it
checks the same properties here, in its own process, where the student cannot reach.

Pure and cheap (a few milliseconds per notebook): nothing is executed, imported or written.
Every public function never raises; on input it cannot make sense of it reports nothing.

How a notebook is read. Each code cell is parsed on its own with `ast` (a cell with IPython
syntax that does not parse as it is gets `notebook.to_python` first, as the grader runs it; a
cell that still does not parse is skipped: it defines nothing when the grader runs it either).
The cells' top-level bindings (def, class, import, assignment, ...) are taken in order, so a
name means what its *last* binding made it, as the graded namespace holds it once every cell
has run; expressions evaluated when a definition runs (decorators, default values, base
classes) see the bindings made before it.

Forbidden built-ins (`ExerciseFindings.forbidden`). The scope of an exercise is its target
(a top-level function; for a module, the methods that a call can run: `forward`, `__init__`
and every other dunder, and for a "method" exercise that method instead of `forward`; plus
any method of the class or its notebook base classes that reached code names as an attribute
or a string, e.g. `self._attend(...)`, and methods attached later with `@add_to_class(Cls)`,
`Cls.name = f` or `setattr(Cls, "name", f)`), together with every top-level function or class
that the scope refers to by name, transitively (`builds_on` exercises included, because the
code calls them). In it, these count, for the names of the exercise's `Forbidden` rule (its ops
and functions, plus the classes that run them: `MultiheadAttention` and the `Transformer*`
layers for attention, `Softmax`/`LogSoftmax`/`Softmax2d` for the softmax):

- an attribute of that name, on anything: `F.scaled_dot_product_attention`,
  `torch.nn.functional.softmax`, `x.softmax(-1)`, `nn.MultiheadAttention`,
  `torch.ops.aten._softmax`, `torch._C._nn.scaled_dot_product_attention` (except `self.name`
  where the student's own classes define `name`);
- a name bound by an import from torch, `from torch.nn.functional import
  scaled_dot_product_attention as sdpa` (also a star import from torch), wherever that import
  is in the notebook, when the name still means it where it is used; a top-level alias
  (`sdpa = F.scaled_dot_product_attention`, a lambda, `functools.partial(...)`) that the
  scope uses;
- a string naming one in `getattr(obj, "...")`, `obj.__getattribute__("...")`,
  `operator.attrgetter/methodcaller("...")`, `obj.__dict__["..."]`, `vars(obj)["..."]`
  (for a name the notebook itself defines, e.g. chapter 2's own `scaled_dot_product_attention`,
  only when `obj` is torch's), and code in a constant string given to `eval`/`exec`.

Calling the student's own function by its bare name (`scaled_dot_product_attention(q, k, v)`
in chapter 2, `softmax(scores)` in chapter 1) is not a use: the name resolves to their def.

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
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import torch

from ..shared.calls import Call
from ..shared.contract import Chapter, Forbidden

__all__ = [
    "ExerciseFindings", "ForbiddenUse", "InPlaceChange", "Notebook", "findings", "forbidden_names",
    "parse", "tensor_params_from_cases",
]

# ----------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ForbiddenUse:
    """One place where the exercise's scope reaches a forbidden built-in.

    name: the forbidden name as the code reaches it ("scaled_dot_product_attention",
        "MultiheadAttention", "softmax").
    cell: the code cell, counted from 1 as the grader numbers them ("<cell 3>").
    line: the line within that cell. code: that line, stripped (at most 120 characters).
    """

    name: str
    cell: int
    line: int
    code: str

    def describe(self) -> str:
        return f"cell {self.cell}, line {self.line}: `{self.code}` uses {self.name}"


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


@dataclass(frozen=True)
class ExerciseFindings:
    """What the static check found for one exercise (falsy when nothing)."""

    forbidden: tuple = ()  # ForbiddenUse, sorted by cell and line
    inplace: tuple = ()    # InPlaceChange, sorted by cell and line

    def __bool__(self) -> bool:
        return bool(self.forbidden or self.inplace)

    @property
    def forbidden_names(self) -> frozenset:
        return frozenset(f.name for f in self.forbidden)

    @property
    def modified_params(self) -> frozenset:
        return frozenset(c.param for c in self.inplace)

    def describe(self) -> list[str]:
        """One line of text per finding, forbidden uses first."""
        return [f.describe() for f in self.forbidden] + [c.describe() for c in self.inplace]


EMPTY = ExerciseFindings()

# ------------------------------------------------------------------------------- name tables

# Classes whose forward runs a forbidden function, by the function they stand for.
_ATTENTION_CLASSES = frozenset({
    "MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder",
    "TransformerEncoderLayer", "TransformerDecoderLayer",
})
_SOFTMAX_CLASSES = frozenset({"Softmax", "LogSoftmax", "Softmax2d",
                              "softmin", "Softmin"})  # (softmin(x) is softmax(-x))
# The torch namespaces code under a Forbidden rule may use (issue 27.4: an allow-list, so that
# PyTorch's attention or softmax under another name counts): the names and their whole
# sub-packages in _ALLOWED_TREES, and these names only (not their sub-packages, e.g. not
# torch.nn.attention's flex_attention). Elsewhere (torch.onnx's attention op and its
# decomposition, torch._decomp, torch._refs, torch._prims, torch.func, torch.library, ...) the
# computation is PyTorch's, not the student's.
_ALLOWED_NAMESPACES = frozenset({"torch", "torch.nn"})
_ALLOWED_TREES = ("torch.nn.functional", "torch.nn.init", "torch.nn.modules", "torch.nn.parameter",
                  "torch.nn.utils", "torch.nn.common_types", "torch.linalg", "torch.special", "torch.fft",
                  "torch.autograd", "torch.random", "torch.cuda", "torch.backends", "torch.testing",
                  "torch.types", "torch.utils", "torch.distributions", "torch.amp", "torch.jit",
                  "torch.func", "torch.compiler", "torch.profiler")
_TORCH_DIR = Path(torch.__file__).parent


@lru_cache(maxsize=4096)
def _is_torch_module(path: str) -> bool:
    """Whether a dotted name under torch is one of its modules (from the files: nothing imported)."""
    where = _TORCH_DIR.joinpath(*path.split(".")[1:])
    return (where / "__init__.py").is_file() or where.with_suffix(".py").is_file()


def foreign_namespace(path: str | None) -> str | None:
    """The first torch module on a dotted path ("torch.onnx.ops.attention") that is outside the
    allow-list ("torch.onnx"), or None."""
    if not path or path.split(".")[0] != "torch":
        return None
    parts = path.split(".")
    for n in range(2, len(parts) + 1):
        prefix = ".".join(parts[:n])
        if not _is_torch_module(prefix):
            return None  # an attribute, not a module: the namespace is the one before it
        if prefix in _ALLOWED_NAMESPACES:
            continue
        if any(prefix == t or prefix.startswith(t + ".") for t in _ALLOWED_TREES):
            return None
        return prefix
    return None
# `nn.Transformer.generate_square_subsequent_mask(L)` uses the class, not its attention.
_HARMLESS_MEMBERS = frozenset({
    "generate_square_subsequent_mask", "__name__", "__qualname__", "__doc__", "__module__",
})


def forbidden_names(rule: Forbidden) -> frozenset:
    """The names the static check looks for under one rule: its ops and functions, and the
    torch classes that run them."""
    names = set(rule.ops) | set(rule.functions)
    if {"multi_head_attention_forward", "scaled_dot_product_attention"} & names:
        names |= _ATTENTION_CLASSES
    if {"softmax", "log_softmax"} & names:
        names |= _SOFTMAX_CLASSES
    return frozenset(names)


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
# Calls whose result is (a wrapper of) their argument: an alias of a function.
_WRAPPERS = frozenset({"partial", "partialmethod", "compile", "script", "trace", "no_grad",
                       "enable_grad", "inference_mode", "wraps", "vmap", "checkpoint"})
_GETATTR = frozenset({"getattr", "getattr_static"})
_GETATTR_METHODS = frozenset({"__getattribute__", "__getattr__"})
_NAME_ONLY = frozenset({"attrgetter", "methodcaller"})
_STANDARD_ENTRIES = frozenset({"forward", "_call_impl", "_wrapped_call_impl"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_INF = float("inf")  # "call time": a name means its last binding


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


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


# --------------------------------------------------------------------------- reading cells


@dataclass(eq=False)
class _Binding:
    """One top-level binding of a name. kind: "def" (node: FunctionDef), "class" (node:
    _ClassInfo), "import" (path: the dotted name imported; node: the statement), "value"
    (node: the assigned expression), "other" (anything else that rebinds), "del"."""

    order: int
    name: str
    kind: str
    node: Any
    cell: int
    path: str | None = None


@dataclass(eq=False)
class _Member:
    name: str
    order: int
    node: Any  # FunctionDef, Lambda, or an expression (a class attribute's value)
    cell: int
    kind: str  # "def", "lambda", "value"


@dataclass(eq=False)
class _ClassInfo:
    node: ast.ClassDef
    order: int
    cell: int
    bases: list = field(default_factory=list)    # notebook classes among its bases
    members: dict = field(default_factory=dict)  # name -> [_Member] in order (last one counts)


class Notebook:
    """A notebook's code cells, parsed once (see `parse`)."""

    def __init__(self, cells: Iterable[str]):
        self.lines: list[list[str]] = []        # per cell (index = cell number - 1)
        self.trees: list[ast.Module | None] = []
        self.bindings: dict[str, list[_Binding]] = {}
        self.stars: list[_Binding] = []
        self.classes: list[_ClassInfo] = []
        self.attached: set[int] = set()          # ids of functions attached to a class
        self.member_names: set[str] = set()      # what the student's classes define
        self.false_names: frozenset = frozenset()  # top-level flags only ever set to False
        self._order = 0
        for number, source in enumerate(cells if cells is not None else (), 1):
            tree, lines = _parse_cell(source)
            self.trees.append(tree)
            self.lines.append(lines)
            if tree is not None:
                try:
                    for stmt in _statements(tree.body):
                        self._bind(stmt, number)
                except (RecursionError, MemoryError):
                    pass
        self.false_names = self._false_names()

    # -- bindings ------------------------------------------------------------------------------
    def _add(self, name: str, kind: str, node, cell: int, order: int, path: str | None = None):
        self.bindings.setdefault(name, []).append(_Binding(order, name, kind, node, cell, path))

    def resolve(self, name: str, before: float = _INF) -> _Binding | None:
        """The binding `name` has just before `before` (an order), or at the end."""
        found = None
        for b in reversed(self.bindings.get(name, ())):
            if b.order < before:
                found = b
                break
        for star in reversed(self.stars):
            if found is not None and star.order <= found.order:
                break
            if star.order < before and _star_exports(star.path, name):
                return _Binding(star.order, name, "import", star.node, star.cell, f"{star.path}.{name}")
        return found

    def _bind(self, stmt, cell: int) -> None:
        self._order += 1
        order = self._order
        add = lambda name, kind, node=None, path=None: self._add(name, kind, node, cell, order, path)  # noqa: E731
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in stmt.decorator_list:
                if isinstance(dec, ast.Call):
                    for arg in [*dec.args, *(k.value for k in dec.keywords)]:
                        info = self._class_named(arg, order)
                        if info is not None:
                            self._attach(info, stmt.name, stmt, order, cell)
            add(stmt.name, "def", stmt)
        elif isinstance(stmt, ast.ClassDef):
            info = self._class(stmt, order, cell)
            add(stmt.name, "class", info)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    add(alias.asname, "import", stmt, alias.name)
                else:
                    first = alias.name.split(".")[0]
                    add(first, "import", stmt, first)
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if stmt.level or not stmt.module:
                    if alias.name != "*":
                        add(alias.asname or alias.name, "other")
                elif alias.name == "*":
                    self.stars.append(_Binding(order, "*", "star", stmt, cell, stmt.module))
                else:
                    add(alias.asname or alias.name, "import", stmt, f"{stmt.module}.{alias.name}")
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = stmt.value
            if value is not None:
                for t in targets:
                    if isinstance(t, ast.Name):
                        add(t.id, "value", value)
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                        info = self._class_named(t.value, order)
                        if info is not None:
                            self._attach(info, t.attr, value, order, cell)
                    else:
                        for name in _stored_names(t):
                            add(name, "other")
        elif isinstance(stmt, ast.AugAssign):
            for name in _stored_names(stmt.target):
                add(name, "other")
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            for name in _stored_names(stmt.target):
                add(name, "other")
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    for name in _stored_names(item.optional_vars):
                        add(name, "other")
        elif isinstance(stmt, ast.ExceptHandler):
            if stmt.name:
                add(stmt.name, "other")
        elif isinstance(stmt, ast.match_case):
            for name in _pattern_names(stmt.pattern):
                add(name, "other")
        elif isinstance(stmt, ast.Delete):
            for t in stmt.targets:
                for name in _stored_names(t):
                    add(name, "del")
        elif isinstance(stmt, ast.Expr):
            call = stmt.value
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "setattr"
                    and len(call.args) == 3):
                info = self._class_named(call.args[0], order)
                name = _const_str(call.args[1])
                if info is not None and name:
                    self._attach(info, name, call.args[2], order, cell)
        for expr in _header_exprs(stmt):  # walrus targets at top level
            for node in ast.walk(expr):
                if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                    add(node.target.id, "other")

    def _false_names(self) -> frozenset:
        """Names whose every top-level binding is a false constant (DEBUG = False) and that no
        function declares global: `if DEBUG:` blocks never run."""
        declared = set()
        for tree in self.trees:
            if tree is not None:
                for node in ast.walk(tree):
                    if isinstance(node, (ast.Global, ast.Nonlocal)):
                        declared.update(node.names)
        return frozenset(
            name for name, bs in self.bindings.items()
            if name not in declared and all(b.kind == "value" and _is_false(b.node) for b in bs))

    def is_false(self, test, local=lambda name: False) -> bool:
        """A test that is certainly false: a false constant, or such a flag."""
        return _is_false(test) or (isinstance(test, ast.Name) and test.id in self.false_names
                                    and not local(test.id))

    def _class_named(self, expr, order: int) -> _ClassInfo | None:
        if isinstance(expr, ast.Name):
            b = self.resolve(expr.id, order)
            if b is not None and b.kind == "class":
                return b.node
        return None

    def _attach(self, info: _ClassInfo, name: str, node, order: int, cell: int) -> None:
        kind = "def" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
            "lambda" if isinstance(node, ast.Lambda) else "value"
        info.members.setdefault(name, []).append(_Member(name, order, node, cell, kind))
        self.member_names.add(name)
        if kind != "value":
            self.attached.add(id(node))
            self._self_attributes(node)

    def _class(self, stmt: ast.ClassDef, order: int, cell: int) -> _ClassInfo:
        info = _ClassInfo(stmt, order, cell)
        for base in stmt.bases:
            found = self._class_named(base, order)
            if found is not None:
                info.bases.append(found)
        for s in _statements(stmt.body):
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info.members.setdefault(s.name, []).append(_Member(s.name, order, s, cell, "def"))
                self.member_names.add(s.name)
                self._self_attributes(s)
            elif isinstance(s, (ast.Assign, ast.AnnAssign)) and s.value is not None:
                for t in (s.targets if isinstance(s, ast.Assign) else [s.target]):
                    if isinstance(t, ast.Name):
                        kind = "lambda" if isinstance(s.value, ast.Lambda) else "value"
                        info.members.setdefault(t.id, []).append(_Member(t.id, order, s.value, cell, kind))
                        self.member_names.add(t.id)
            elif isinstance(s, ast.ClassDef):
                self.member_names.add(s.name)
        self.classes.append(info)
        return info

    def _self_attributes(self, fn) -> None:
        """Attributes a method sets on its first parameter (self.softmax = ...)."""
        first = _first_param(fn)
        if first is None:
            return
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == first):
                self.member_names.add(node.attr)

    # -- locations -----------------------------------------------------------------------------
    def code(self, cell: int, line: int) -> str:
        try:
            text = self.lines[cell - 1][line - 1].strip()
        except (IndexError, TypeError):
            return ""
        return text if len(text) <= 120 else text[:117] + "..."


def parse(cells: Iterable[str]) -> Notebook:
    """The notebook's code cells (as `notebook.notebook_cells` gives them; raw cells work too),
    parsed once for `findings` and `tensor_params_from_cases`. Never raises."""
    try:
        return Notebook(list(cells) if cells is not None else [])
    except Exception:
        return Notebook([])


def _parse_cell(source) -> tuple[ast.Module | None, list[str]]:
    if not isinstance(source, str):
        return None, []
    for attempt in (0, 1):
        text = source
        if attempt:
            try:
                from .notebook import to_python

                text = to_python(source)
            except Exception:
                return None, []
            if text == source:
                return None, []
        try:
            return ast.parse(text), text.splitlines()
        except Exception:  # SyntaxError, ValueError (null bytes), RecursionError, MemoryError
            continue
    return None, []


def _is_false(test) -> bool:
    return isinstance(test, ast.Constant) and not test.value and test.value is not Ellipsis


def _is_true(test) -> bool:
    return isinstance(test, ast.Constant) and bool(test.value)


def _nested_statements(stmt) -> list:
    """The statements nested in a compound statement that run in the same scope, in order
    (an `if False:` body is left out)."""
    if isinstance(stmt, ast.If):
        if _is_false(stmt.test):
            return list(stmt.orelse)
        if _is_true(stmt.test):
            return list(stmt.body)
        return [*stmt.body, *stmt.orelse]
    if isinstance(stmt, ast.While):
        return list(stmt.orelse) if _is_false(stmt.test) else [*stmt.body, *stmt.orelse]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [*stmt.body, *stmt.orelse]
    if isinstance(stmt, (ast.With, ast.AsyncWith, ast.ExceptHandler, ast.match_case)):
        return list(stmt.body)
    if isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
        return [*stmt.body, *stmt.handlers, *stmt.orelse, *stmt.finalbody]
    if isinstance(stmt, ast.Match):
        return list(stmt.cases)
    return []


def _statements(body: list):
    """Every statement of a block in source order, nested blocks of the same scope included
    (not the bodies of functions and classes). Iterative: deep nesting cannot overflow."""
    stack = [iter(body)]
    while stack:
        try:
            stmt = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        yield stmt
        nested = _nested_statements(stmt)
        if nested:
            stack.append(iter(nested))


def _header_exprs(stmt) -> list:
    """The expressions a statement evaluates itself (not its nested statements)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    if isinstance(stmt, (ast.If, ast.While)):
        return [stmt.test]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.iter]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [i.context_expr for i in stmt.items]
    if isinstance(stmt, ast.Match):
        return [stmt.subject]
    if isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try), ast.ExceptHandler, ast.match_case)):
        return []
    return [stmt]


def _stored_names(target) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _pattern_names(pattern) -> list[str]:
    names = []
    for n in ast.walk(pattern):
        if isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            names.append(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.append(n.rest)
    return names


def _first_param(fn) -> str | None:
    if not isinstance(fn, _FUNCTIONS):
        return None
    args = [*fn.args.posonlyargs, *fn.args.args]
    return args[0].arg if args else None


def _is_static(fn) -> bool:
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        (isinstance(d, ast.Name) and d.id == "staticmethod")
        or (isinstance(d, ast.Attribute) and d.attr == "staticmethod") for d in fn.decorator_list)


def _star_exports(module: str | None, name: str) -> bool:
    """Whether `from <module> import *` binds `name` (torch modules only; never imports)."""
    if not module or module.split(".")[0] != "torch":
        return False
    mod = sys.modules.get(module)
    if mod is None:
        return False
    public = getattr(mod, "__all__", None)
    if public is not None:
        try:
            return name in public
        except Exception:
            return False
    return not name.startswith("_") and hasattr(mod, name)


def _const_str(node, depth: int = 0) -> str | None:
    """A string constant, also one written as "soft" + "max"."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and depth < 20:
        left, right = _const_str(node.left, depth + 1), _const_str(node.right, depth + 1)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.JoinedStr) and depth < 20:
        parts = []
        for v in node.values:
            s = _const_str(v, depth + 1)
            if s is None:
                return None
            parts.append(s)
        return "".join(parts)
    return None


def _local_names(fn) -> frozenset:
    """The names a function (or lambda) binds in its own scope: parameters and every name it
    assigns, imports, defines or deletes, less those it declares global."""
    a = fn.args
    names = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    if a.vararg:
        names.add(a.vararg.arg)
    if a.kwarg:
        names.add(a.kwarg.arg)
    declared_global = set()
    stack = list(fn.body) if isinstance(fn.body, list) else [fn.body]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            stack.extend(node.decorator_list)
            if not isinstance(node, ast.ClassDef):
                stack.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
            else:
                stack.extend(node.bases)
            continue
        if isinstance(node, ast.Lambda):
            stack.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
            continue
        if isinstance(node, _COMPREHENSIONS):
            for sub in ast.walk(node):  # only a walrus binds in the enclosing scope
                if isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
                    names.add(sub.target.id)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif isinstance(node, ast.Global):
            declared_global.update(node.names)
        stack.extend(ast.iter_child_nodes(node))
    return frozenset(names - declared_global)


def _comprehension_targets(node) -> frozenset:
    return frozenset(n for g in node.generators for n in _stored_names(g.target))


def _root_name(expr) -> str | None:
    """The leftmost name of an attribute chain (torch.nn.functional.softmax -> "torch")."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


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


# ------------------------------------------------------------------------ forbidden built-ins


@dataclass(frozen=True)
class _Env:
    scopes: tuple          # the enclosing functions' local names (frozensets)
    time: float            # resolve names as bound before this order (_INF: at call time)
    self_name: str | None  # the method's first parameter, where the code is a method's
    cell: int
    reach: bool = True     # whether names of notebook classes bring the class into scope


class _Scope:
    """Walks an exercise's scope (see the module docstring) and records forbidden uses."""

    def __init__(self, nb: Notebook, names: frozenset):
        self.nb, self.names = nb, names
        self.found: dict = {}
        self.done: set = set()
        self.queue: list = []
        self.classes: dict = {}  # id(_ClassInfo) -> [info, entry names]
        self.attrs: set = set()  # attribute names (and identifier strings) reached code uses
        self.skip: set = set()   # ids of attribute nodes not to flag

    # -- entry points ----------------------------------------------------------------------------
    def start(self, target: str, kind: str, method: str | None) -> None:
        b = self.nb.resolve(target)
        if b is None:
            return
        if b.kind == "class":
            self._reach(b.node, {method} if kind == "method" and method else _STANDARD_ENTRIES)
        else:
            self._binding(b, None, b.cell)

    def run(self) -> list[ForbiddenUse]:
        for _ in range(10000):
            while self.queue:
                job = self.queue.pop()
                job[0](*job[1:])
            if not self._expand():
                break
        return sorted(self.found.values(), key=lambda f: (f.cell, f.line, f.name))

    # -- units -----------------------------------------------------------------------------------
    def _once(self, node) -> bool:
        if id(node) in self.done:
            return False
        self.done.add(id(node))
        return True

    def _function_unit(self, fn, cell: int, def_time: float, self_name: str | None) -> None:
        if self._once(fn):
            self.queue.append((self._function, fn, cell, def_time, self_name))

    def _expr_unit(self, expr, cell: int, time: float) -> None:
        if self._once(expr):
            self.queue.append((self._walk, expr, _Env((), time, None, cell)))

    def _function(self, fn, cell: int, def_time: float, self_name: str | None) -> None:
        stack: list = []
        self._push_function(fn, _Env((), def_time, None, cell), stack, self_name)
        self._walk_stack(stack)

    def _push_function(self, fn, env: _Env, stack: list, self_name: str | None) -> None:
        """Push what defining and calling `fn` evaluates: decorators and defaults when it is
        defined (env), its body when it is called."""
        if not isinstance(fn, ast.Lambda):
            for dec in fn.decorator_list:  # @add_to_class(Cls) names the class it extends
                stack.append((dec, _Env(env.scopes, env.time, env.self_name, env.cell, False)))
        for d in [*fn.args.defaults, *fn.args.kw_defaults]:
            if d is not None:
                stack.append((d, env))
        body_env = _Env(env.scopes + (_local_names(fn),), _INF, self_name, env.cell)
        for node in (fn.body if isinstance(fn.body, list) else [fn.body]):
            stack.append((node, body_env))

    def _binding(self, b: _Binding, site, cell: int) -> None:
        """A name of the scope means binding `b`: bring what it names into scope."""
        if b.kind == "def":
            self._function_unit(b.node, b.cell, b.order,
                                _first_param(b.node) if id(b.node) in self.nb.attached else None)
        elif b.kind == "class":
            self._reach(b.node, _STANDARD_ENTRIES)
        elif b.kind == "import":
            if self._forbidden_path(b.path):
                where = site if site is not None else b.node
                name = foreign_namespace(b.path) or b.path.rsplit(".", 1)[-1]
                self._found(name, cell if site is not None else b.cell, where)
        elif b.kind == "value":
            if self._alias_like(b.node):
                self._expr_unit(b.node, b.cell, b.order)

    def _forbidden_path(self, path: str | None) -> bool:
        if not path:
            return False
        parts = path.split(".")
        return parts[0] == "torch" and (parts[-1] in self.names or foreign_namespace(path) is not None)

    @staticmethod
    def _alias_like(value) -> bool:
        if isinstance(value, (ast.Lambda, ast.Name, ast.Attribute)):
            return True
        if isinstance(value, ast.Call):
            f = value.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in _WRAPPERS:
                return True
            if isinstance(f, ast.Call):  # torch.no_grad()(f)
                return _Scope._alias_like(f)
        return False

    def _reach(self, info: _ClassInfo, entries) -> bool:
        entry = self.classes.get(id(info))
        if entry is None:
            self.classes[id(info)] = [info, set(entries)]
            stack = [(e, _Env((), info.order, None, info.cell, False))
                     for e in [*info.node.decorator_list, *info.node.bases, *(k.value for k in info.node.keywords)]]
            self.queue.append((self._walk_stack, stack))
            return True
        if set(entries) - entry[1]:
            entry[1] |= set(entries)
            return True
        return False

    def _expand(self) -> bool:
        """Bring into scope the members of reached classes that can now run."""
        changed = False
        for info, entries in list(self.classes.values()):
            for base in info.bases:
                changed |= self._reach(base, entries)
            for name, members in info.members.items():
                if not (name in entries or _dunder(name) or name in self.attrs):
                    continue
                m = members[-1]
                if id(m.node) in self.done:
                    continue
                changed = True
                if m.kind == "def":
                    self._function_unit(m.node, m.cell, m.order, None if _is_static(m.node) else _first_param(m.node))
                elif m.kind == "lambda":
                    self._function_unit(m.node, m.cell, m.order, _first_param(m.node))
                else:
                    self._expr_unit(m.node, m.cell, m.order)
        return changed

    # -- the walk --------------------------------------------------------------------------------
    def _walk(self, node, env: _Env) -> None:
        self._walk_stack([(node, env)])

    def _walk_stack(self, stack: list) -> None:
        while stack:
            node, env = stack.pop()
            if isinstance(node, _FUNCTIONS):
                inner = _local_names(node)
                self_name = env.self_name if env.self_name not in inner else None
                self._push_function(node, env, stack, self_name)
                continue
            if isinstance(node, ast.ClassDef):  # a class inside a function
                for e in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
                    stack.append((e, env))
                body_names = frozenset(n for s in node.body for n in _stored_names(s)
                                       if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)))
                inner_env = _Env(env.scopes + (body_names,), env.time, env.self_name, env.cell)
                stack.extend((s, inner_env) for s in node.body)
                continue
            if isinstance(node, _COMPREHENSIONS):
                inner_env = _Env(env.scopes + (_comprehension_targets(node),), env.time, env.self_name,
                                 env.cell, env.reach)
                stack.extend((c, inner_env) for c in ast.iter_child_nodes(node))
                continue
            if (isinstance(node, (ast.If, ast.While, ast.IfExp))
                    and self.nb.is_false(node.test, lambda n, env=env: self._local(n, env))):
                stack.append((node.test, env))
                orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
                stack.extend((s, env) for s in orelse)
                continue
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    self._name(node, env)
                continue
            if isinstance(node, ast.Attribute):
                self._attribute(node, env)
            elif isinstance(node, ast.Call):
                self._call(node, env, stack)
            elif isinstance(node, ast.Subscript):
                self._subscript(node, env)
            elif isinstance(node, ast.ImportFrom):
                self._local_import(node, env)
            elif isinstance(node, ast.Constant):
                if isinstance(node.value, str) and len(node.value) < 100 and node.value.isidentifier():
                    self.attrs.add(node.value)
                continue
            stack.extend((c, env) for c in ast.iter_child_nodes(node))

    def _local(self, name: str, env: _Env) -> bool:
        return any(name in s for s in env.scopes)

    def _name(self, node: ast.Name, env: _Env) -> None:
        if self._local(node.id, env):
            return
        b = self.nb.resolve(node.id, env.time)
        if b is None:
            return
        if b.kind == "class" and not env.reach:
            return
        if b.kind == "import" and id(node) in self.skip:  # Transformer.generate_square_subsequent_mask
            return
        self._binding(b, node, env.cell)

    def _attribute(self, node: ast.Attribute, env: _Env) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        self.attrs.add(node.attr)
        if node.attr in _HARMLESS_MEMBERS:
            self.skip.add(id(node.value))
        if node.attr in self.names and id(node) not in self.skip and not self._own_member(node, env):
            self._found(node.attr, env.cell, node)
        foreign = foreign_namespace(self._torch_path(node, env))
        if foreign:
            self._found(foreign, env.cell, node)

    def _torch_path(self, node: ast.Attribute, env: _Env) -> str | None:
        """The dotted torch name an attribute chain stands for (`F.x` -> "torch.nn.functional.x"
        after `import torch.nn.functional as F`), or None where its root is not a torch import."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or not self._is_torch(node.id, env):
            return None
        b = self.nb.resolve(node.id, env.time)
        return ".".join([b.path, *reversed(attrs)])

    def _own_member(self, node: ast.Attribute, env: _Env) -> bool:
        """self.name where the student's classes define `name` (a method or an attribute)."""
        v = node.value
        return (env.self_name is not None and isinstance(v, ast.Name) and v.id == env.self_name
                and node.attr in self.nb.member_names)

    def _call(self, node: ast.Call, env: _Env, stack: list) -> None:
        f = node.func
        fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        obj = name_node = None
        if fname in _GETATTR and len(node.args) >= 2:
            obj, name_node = node.args[0], node.args[1]
        elif fname in _GETATTR_METHODS and isinstance(f, ast.Attribute) and node.args:
            obj, name_node = (node.args[0], node.args[1]) if len(node.args) >= 2 else (f.value, node.args[0])
        elif fname in _NAME_ONLY and node.args:
            name_node = node.args[0]
        if name_node is not None:
            name = _const_str(name_node)
            if name is not None:
                self.attrs.add(name)
                if name in self.names and self._string_counts(obj, name, env):
                    self._found(name, env.cell, node)
        if (isinstance(f, ast.Name) and f.id in ("eval", "exec") and not self._local(f.id, env)
                and node.args):
            code = _const_str(node.args[0])
            if code is not None and len(code) <= 100_000:
                tree = None
                for mode in (("eval", "exec") if f.id == "eval" else ("exec",)):
                    try:
                        tree = ast.parse(code, mode=mode)
                        break
                    except Exception:
                        continue
                if tree is not None:
                    for sub in ast.walk(tree):
                        if hasattr(sub, "lineno"):
                            sub.lineno, sub.col_offset = node.lineno, node.col_offset
                    stack.append((tree, env))

    def _subscript(self, node: ast.Subscript, env: _Env) -> None:
        name = _const_str(node.slice)
        if name is None or name not in self.names:
            return
        v = node.value
        if isinstance(v, ast.Attribute) and v.attr == "__dict__":
            obj = v.value
        elif (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "vars"
              and v.args):
            obj = v.args[0]
        else:
            return
        if self._string_counts(obj, name, env):
            self._found(name, env.cell, node)

    def _string_counts(self, obj, name: str, env: _Env) -> bool:
        """Whether a string naming `name`, looked up on `obj`, reaches torch's."""
        if obj is not None and self._globals_like(obj):
            return False
        own = name in self.nb.bindings or name in self.nb.member_names
        if not own:
            return True
        root = _root_name(obj) if obj is not None else None
        return root is not None and self._is_torch(root, env)

    def _globals_like(self, obj) -> bool:
        """globals(), vars(), sys.modules[...], __import__("__main__"): the notebook itself."""
        if isinstance(obj, ast.Call) and isinstance(obj.func, (ast.Name, ast.Attribute)):
            fname = obj.func.id if isinstance(obj.func, ast.Name) else obj.func.attr
            if fname in ("globals", "locals", "vars") and not obj.args:
                return True
            if fname in ("__import__", "import_module") and obj.args and _const_str(obj.args[0]) == "__main__":
                return True
        if isinstance(obj, ast.Subscript) and isinstance(obj.value, ast.Attribute) and obj.value.attr == "modules":
            return True
        return False

    def _is_torch(self, name: str, env: _Env) -> bool:
        if self._local(name, env):
            return False
        b = self.nb.resolve(name, env.time)
        return b is not None and b.kind == "import" and (b.path or "").split(".")[0] == "torch"

    def _local_import(self, node: ast.ImportFrom, env: _Env) -> None:
        if node.level or not node.module or node.module.split(".")[0] != "torch":
            return
        for alias in node.names:
            foreign = foreign_namespace(f"{node.module}.{alias.name}")
            if foreign:
                self._found(foreign, env.cell, node)
            if alias.name == "*":
                for name in sorted(self.names):
                    if _star_exports(node.module, name):
                        self._found(name, env.cell, node)
                        break
            elif alias.name in self.names:
                self._found(alias.name, env.cell, node)

    def _found(self, name: str, cell: int, node) -> None:
        line = getattr(node, "lineno", 0) or 0
        key = (cell, line, name)
        if key not in self.found:
            self.found[key] = ForbiddenUse(name, cell, line, self.nb.code(cell, line))


# ----------------------------------------------------------------------------- in-place changes


def _graded_function(nb: Notebook, target: str, is_class: bool, method: str | None):
    """(function node, cell, whether its first parameter is self) for what a call runs:
    the function `target`, or a method of the class `target` (None: __call__ where the
    notebook's class defines one, else forward). None when the notebook does not define it."""
    b = _follow(nb, nb.resolve(target))
    if b is None:
        return None
    if not is_class:
        if method is not None:
            return None
        if b.kind == "def":
            return b.node, b.cell, False
        if b.kind == "value" and isinstance(b.node, ast.Lambda):
            return b.node, b.cell, False
        return None
    if b.kind != "class":
        return None
    for name in ([method] if method else ["__call__", "forward"]):
        m = _lookup(b.node, name)
        if m is None:
            continue
        if m.kind == "def":
            return m.node, m.cell, not _is_static(m.node)
        if m.kind == "lambda":
            return m.node, m.cell, True
        if isinstance(m.node, ast.Name):
            fb = _follow(nb, nb.resolve(m.node.id, m.order))
            if fb is not None and fb.kind == "def":
                return fb.node, fb.cell, True
        return None
    return None


def _follow(nb: Notebook, b: _Binding | None) -> _Binding | None:
    """Through top-level aliases (softmax = my_softmax)."""
    for _ in range(10):
        if b is None or not (b.kind == "value" and isinstance(b.node, ast.Name)):
            return b
        b = nb.resolve(b.node.id, b.order)
    return None


def _lookup(info: _ClassInfo, name: str, depth: int = 0) -> _Member | None:
    members = info.members.get(name)
    if members:
        return members[-1]
    if depth > 50:
        return None
    for base in info.bases:
        found = _lookup(base, name, depth + 1)
        if found is not None:
            return found
    return None


def _params(fn, skip_first: bool) -> tuple[list[str], set[str]]:
    """(positional parameter names, names a keyword argument can fill)."""
    a = fn.args
    positional = [p.arg for p in [*a.posonlyargs, *a.args]]
    keywordable = {p.arg for p in [*a.args, *a.kwonlyargs]}
    if skip_first and positional:
        keywordable.discard(positional[0])
        positional = positional[1:]
    return positional, keywordable


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
        self.locals = _local_names(fn)

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
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bind(node.name, node, at_end=False)
                continue
            if isinstance(node, ast.Lambda):
                continue
            if isinstance(node, _COMPREHENSIONS):
                inner = shadow | _comprehension_targets(node)
                stack.extend((c, inner) for c in ast.iter_child_nodes(node))
                continue
            if (isinstance(node, (ast.If, ast.While, ast.IfExp))
                    and self.nb.is_false(node.test, lambda n: n in self.locals)):
                stack.append((node.test, shadow))
                stack.extend((s, shadow) for s in (node.orelse if isinstance(node.orelse, list) else [node.orelse]))
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if node.value is None:  # a bare annotation binds nothing
                    continue
                single = len(targets) == 1 and isinstance(targets[0], ast.Name)
                src = _chain_root(node.value) if single else None
                for t in targets:
                    self._target(t, node, src if single else None, shadow)
                stack.append((node.value, shadow))
                continue
            if isinstance(node, ast.AugAssign):
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
                stack.append((node.value, shadow))
                continue
            if isinstance(node, (ast.For, ast.AsyncFor)):
                for name in _stored_names(node.target):
                    self.bind(name, node.target)
                stack.append((node.iter, shadow))
                stack.extend((s, shadow) for s in [*node.body, *node.orelse])
                continue
            if isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    stack.append((item.context_expr, shadow))
                    if item.optional_vars is not None:
                        for name in _stored_names(item.optional_vars):
                            self.bind(name, item.optional_vars)
                stack.extend((s, shadow) for s in node.body)
                continue
            if isinstance(node, ast.NamedExpr):
                if isinstance(node.target, ast.Name):
                    self.bind(node.target.id, node, src=_chain_root(node.value))
                stack.append((node.value, shadow))
                continue
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
            stack.extend((c, shadow) for c in ast.iter_child_nodes(node))

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


def _inplace_findings(nb: Notebook, target: str, is_class: bool, method: str | None,
                      tensor_names: set) -> list[InPlaceChange]:
    got = _graded_function(nb, target, is_class, method)
    if got is None:
        return []
    fn, cell, skip_first = got
    positional, keywordable = _params(fn, skip_first)
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
    code cells or a `Notebook` from `parse`. Never raises."""
    out: dict = {}
    try:
        nb = cells if isinstance(cells, Notebook) else parse(cells)
        signatures: dict = {}
        for call in calls:
            try:
                if getattr(call, "answer", False):
                    continue
                names = out.setdefault(call.exercise, {}).setdefault(call.method, set())
                key = (call.target, call.init is not None, call.method)
                if key not in signatures:
                    got = _graded_function(nb, *key)
                    signatures[key] = _params(got[0], got[2]) if got else None
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


def findings(cells, chapter: Chapter, tensor_params: dict | None = None) -> dict[str, ExerciseFindings]:
    """exercise name -> ExerciseFindings, for every exercise of `chapter`.

    cells: the notebook's code cells (as `notebook.notebook_cells` gives them) or a `Notebook`
        from `parse`.
    tensor_params: exercise -> method (None for a function / a module's forward) -> the
        parameters that receive tensors (`tensor_params_from_cases`); exercises it leaves out
        get no in-place check.
    Never raises: an exercise whose check fails internally gets no findings.
    """
    out: dict = {}
    try:
        exercises = list(chapter.exercises)
    except Exception:
        return out
    try:
        nb = cells if isinstance(cells, Notebook) else parse(cells)
    except Exception:
        nb = Notebook([])
    if not isinstance(tensor_params, dict):
        tensor_params = {}
    for ex in exercises:
        try:
            out[ex.name] = _exercise(nb, ex, tensor_params.get(ex.name) or {})
        except Exception:
            out[ex.name] = EMPTY
    return out


def _exercise(nb: Notebook, ex, tensor_params: dict) -> ExerciseFindings:
    if ex.kind == "answer":
        return EMPTY
    forbidden: list = []
    names = forbidden_names(ex.forbidden) if ex.forbidden else frozenset()
    if names:
        scope = _Scope(nb, names)
        try:
            scope.start(ex.target, ex.kind, ex.name if ex.kind == "method" else None)
            forbidden = scope.run()
        except Exception:  # RecursionError included: keep what was certain so far
            forbidden = sorted(scope.found.values(), key=lambda f: (f.cell, f.line, f.name))
    inplace: list = []
    is_class = ex.kind in ("module", "method")
    try:
        methods = sorted(tensor_params.items(), key=lambda kv: kv[0] or "")
    except Exception:  # not a dict of method -> names: no in-place check
        methods = []
    for method, params in methods:
        try:
            if params and (method is None or isinstance(method, str)):
                inplace.extend(_inplace_findings(nb, ex.target, is_class, method,
                                                 {p for p in params if isinstance(p, str)}))
        except Exception:
            continue
    inplace.sort(key=lambda c: (c.cell, c.line, c.param))
    return ExerciseFindings(tuple(forbidden), tuple(inplace))

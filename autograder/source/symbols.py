"""A submission's code as a symbol table (`Notebook`), built from its one parse. It holds what
each top-level name means once every cell has run, the classes and their members, and the
graded function of an exercise; the forbidden-use and in-place checks read it (`forbidden.py`,
`in_place.py`).

How a notebook is read. The cells' syntax trees come from `submission.ParsedSubmission` (one
parse per cell, of the code the grader runs; a cell that does not parse has none: it defines
nothing when the grader runs it either). The cells' top-level bindings (def, class, import,
assignment, ...) are taken in order, so a name means what its *last* binding made it, as the
graded namespace holds it once every cell has run; expressions evaluated when a definition runs
(decorators, default values, base classes) see the bindings made before it."""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
INF = float("inf")  # "call time": a name means its last binding


# --------------------------------------------------------------------------- reading cells


@dataclass(eq=False)
class Binding:
    """One top-level binding of a name. kind: "def" (node: FunctionDef), "class" (node:
    ClassInfo), "import" (path: the dotted name imported; node: the statement), "value"
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
class ClassInfo:
    node: ast.ClassDef
    order: int
    cell: int
    bases: list = field(default_factory=list)    # notebook classes among its bases
    members: dict = field(default_factory=dict)  # name -> [_Member] in order (last one counts)


class Notebook:
    """The symbol table of a notebook's cells (`submission.ParsedSubmission.symbols`)."""

    def __init__(self, trees: Sequence[ast.Module | None], lines: Sequence[list[str]]):
        """trees: each cell's syntax tree (None: it does not parse); lines: each cell's lines."""
        self.lines: list[list[str]] = list(lines)  # per cell (index = cell number - 1)
        self.trees: list[ast.Module | None] = list(trees)
        self.bindings: dict[str, list[Binding]] = {}
        self.stars: list[Binding] = []
        self.classes: list[ClassInfo] = []
        self.attached: set[int] = set()          # ids of functions attached to a class
        self.member_names: set[str] = set()      # what the student's classes define
        self.false_names: frozenset = frozenset()  # top-level flags only ever set to False
        self._order = 0
        for number, tree in enumerate(self.trees, 1):
            if tree is not None:
                try:
                    for stmt in _statements(tree.body):
                        self._bind(stmt, number)
                except (RecursionError, MemoryError):
                    pass
        self.false_names = self._false_names()

    # -- bindings ------------------------------------------------------------------------------
    def _add(self, name: str, kind: str, node, cell: int, order: int, path: str | None = None):
        self.bindings.setdefault(name, []).append(Binding(order, name, kind, node, cell, path))

    def resolve(self, name: str, before: float = INF) -> Binding | None:
        """The binding `name` has just before `before` (an order), or at the end."""
        found = None
        for b in reversed(self.bindings.get(name, ())):
            if b.order < before:
                found = b
                break
        for star in reversed(self.stars):
            if found is not None and star.order <= found.order:
                break
            if star.order < before and star_exports(star.path, name):
                return Binding(star.order, name, "import", star.node, star.cell, f"{star.path}.{name}")
        return found

    def _bind(self, stmt, cell: int) -> None:
        self._order += 1
        order = self._order
        add = lambda name, kind, node=None, path=None: self._add(name, kind, node, cell, order, path)  # noqa: E731
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._bind_decorated(stmt, order, cell)
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
            self._bind_import_from(stmt, order, cell, add)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            self._bind_assign(stmt, order, cell, add)
        elif isinstance(stmt, ast.Delete):
            for t in stmt.targets:
                for name in stored_names(t):
                    add(name, "del")
        elif isinstance(stmt, ast.Expr):
            self._bind_setattr(stmt.value, order, cell)
        else:
            for name in _other_bound_names(stmt):
                add(name, "other")
        for expr in _header_exprs(stmt):  # walrus targets at top level
            for node in ast.walk(expr):
                if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                    add(node.target.id, "other")

    def _bind_decorated(self, stmt, order: int, cell: int) -> None:
        """A function passed to a class by a decorator call (`@register(Cls)`) becomes a member of it."""
        for dec in stmt.decorator_list:
            if isinstance(dec, ast.Call):
                for arg in [*dec.args, *(k.value for k in dec.keywords)]:
                    info = self._class_named(arg, order)
                    if info is not None:
                        self._attach(info, stmt.name, stmt, order, cell)

    def _bind_import_from(self, stmt: ast.ImportFrom, order: int, cell: int, add) -> None:
        """`from m import x`: x is an import of m.x; a relative import binds an unknown ("other");
        `from m import *` is kept aside, resolved by `resolve`."""
        for alias in stmt.names:
            if stmt.level or not stmt.module:
                if alias.name != "*":
                    add(alias.asname or alias.name, "other")
            elif alias.name == "*":
                self.stars.append(Binding(order, "*", "star", stmt, cell, stmt.module))
            else:
                add(alias.asname or alias.name, "import", stmt, f"{stmt.module}.{alias.name}")

    def _bind_assign(self, stmt, order: int, cell: int, add) -> None:
        """`name = value` binds a value; `Cls.attr = value` makes a member of the class;
        any other target binds its names as "other"."""
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        value = stmt.value
        if value is None:
            return
        for t in targets:
            if isinstance(t, ast.Name):
                add(t.id, "value", value)
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                info = self._class_named(t.value, order)
                if info is not None:
                    self._attach(info, t.attr, value, order, cell)
            else:
                for name in stored_names(t):
                    add(name, "other")

    def _bind_setattr(self, call, order: int, cell: int) -> None:
        """`setattr(Cls, "name", value)` at top level makes a member of the class."""
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "setattr"
                and len(call.args) == 3):
            info = self._class_named(call.args[0], order)
            name = const_str(call.args[1])
            if info is not None and name:
                self._attach(info, name, call.args[2], order, cell)

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

    def _class_named(self, expr, order: int) -> ClassInfo | None:
        if isinstance(expr, ast.Name):
            b = self.resolve(expr.id, order)
            if b is not None and b.kind == "class":
                return b.node
        return None

    def _attach(self, info: ClassInfo, name: str, node, order: int, cell: int) -> None:
        kind = "def" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
            "lambda" if isinstance(node, ast.Lambda) else "value"
        info.members.setdefault(name, []).append(_Member(name, order, node, cell, kind))
        self.member_names.add(name)
        if kind != "value":
            self.attached.add(id(node))
            self._self_attributes(node)

    def _class(self, stmt: ast.ClassDef, order: int, cell: int) -> ClassInfo:
        info = ClassInfo(stmt, order, cell)
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
        first = first_param(fn)
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


def stored_names(target) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _pattern_names(pattern) -> list[str]:
    names = []
    for n in ast.walk(pattern):
        if isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            names.append(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.append(n.rest)
    return names


def _other_bound_names(stmt) -> list[str]:
    """The names a statement binds to something the symbol table does not follow: augmented
    assignment, for and with targets, `except ... as`, match patterns."""
    if isinstance(stmt, ast.AugAssign):
        return stored_names(stmt.target)
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return stored_names(stmt.target)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [name for item in stmt.items if item.optional_vars is not None
                for name in stored_names(item.optional_vars)]
    if isinstance(stmt, ast.ExceptHandler):
        return [stmt.name] if stmt.name else []
    if isinstance(stmt, ast.match_case):
        return _pattern_names(stmt.pattern)
    return []


def first_param(fn) -> str | None:
    if not isinstance(fn, FUNCTIONS):
        return None
    args = [*fn.args.posonlyargs, *fn.args.args]
    return args[0].arg if args else None


def is_static(fn) -> bool:
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        (isinstance(d, ast.Name) and d.id == "staticmethod")
        or (isinstance(d, ast.Attribute) and d.attr == "staticmethod") for d in fn.decorator_list)


def star_exports(module: str | None, name: str) -> bool:
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


def const_str(node, depth: int = 0) -> str | None:
    """A string constant, also one written as "soft" + "max"."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and depth < 20:
        left, right = const_str(node.left, depth + 1), const_str(node.right, depth + 1)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.JoinedStr) and depth < 20:
        parts = []
        for v in node.values:
            s = const_str(v, depth + 1)
            if s is None:
                return None
            parts.append(s)
        return "".join(parts)
    return None


def local_names(fn) -> frozenset:
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
        if isinstance(node, COMPREHENSIONS):
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


def comprehension_targets(node) -> frozenset:
    return frozenset(n for g in node.generators for n in stored_names(g.target))


# ----------------------------------------------------------------------------- in-place changes


def graded_function(nb: Notebook, target: str, is_class: bool, method: str | None):
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
            return m.node, m.cell, not is_static(m.node)
        if m.kind == "lambda":
            return m.node, m.cell, True
        if isinstance(m.node, ast.Name):
            fb = _follow(nb, nb.resolve(m.node.id, m.order))
            if fb is not None and fb.kind == "def":
                return fb.node, fb.cell, True
        return None
    return None


def _follow(nb: Notebook, b: Binding | None) -> Binding | None:
    """Through top-level aliases (softmax = my_softmax)."""
    for _ in range(10):
        if b is None or not (b.kind == "value" and isinstance(b.node, ast.Name)):
            return b
        b = nb.resolve(b.node.id, b.order)
    return None


def _lookup(info: ClassInfo, name: str, depth: int = 0) -> _Member | None:
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


def parameter_names(fn, skip_first: bool) -> tuple[list[str], set[str]]:
    """(positional parameter names, names a keyword argument can fill)."""
    a = fn.args
    positional = [p.arg for p in [*a.posonlyargs, *a.args]]
    keywordable = {p.arg for p in [*a.args, *a.kwonlyargs]}
    if skip_first and positional:
        keywordable.discard(positional[0])
        positional = positional[1:]
    return positional, keywordable

"""Forbidden built-ins in a submission's source, found without running it.

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
in chapter 2, `softmax(scores)` in chapter 1) is not a use: the name resolves to their def."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ..shared.contract import Forbidden
from .symbols import Notebook, Binding, COMPREHENSIONS, ClassInfo, FUNCTIONS, INF, comprehension_targets, const_str, first_param, is_static, local_names, star_exports, stored_names

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
# Calls whose result is (a wrapper of) their argument: an alias of a function.
_WRAPPERS = frozenset({"partial", "partialmethod", "compile", "script", "trace", "no_grad",
                       "enable_grad", "inference_mode", "wraps", "vmap", "checkpoint"})
_GETATTR = frozenset({"getattr", "getattr_static"})
_GETATTR_METHODS = frozenset({"__getattribute__", "__getattr__"})
_NAME_ONLY = frozenset({"attrgetter", "methodcaller"})
_STANDARD_ENTRIES = frozenset({"forward", "_call_impl", "_wrapped_call_impl"})


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _root_name(expr) -> str | None:
    """The leftmost name of an attribute chain (torch.nn.functional.softmax -> "torch")."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


# ------------------------------------------------------------------------ forbidden built-ins


@dataclass(frozen=True)
class _Env:
    scopes: tuple          # the enclosing functions' local names (frozensets)
    time: float            # resolve names as bound before this order (INF: at call time)
    self_name: str | None  # the method's first parameter, where the code is a method's
    cell: int
    reach: bool = True     # whether names of notebook classes bring the class into scope


class ForbiddenScope:
    """Walks an exercise's scope (see the module docstring) and records forbidden uses."""

    def __init__(self, nb: Notebook, names: frozenset):
        self.nb, self.names = nb, names
        self.found: dict = {}
        self.done: set = set()
        self.queue: list = []
        self.classes: dict = {}  # id(ClassInfo) -> [info, entry names]
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
        body_env = _Env(env.scopes + (local_names(fn),), INF, self_name, env.cell)
        for node in (fn.body if isinstance(fn.body, list) else [fn.body]):
            stack.append((node, body_env))

    def _binding(self, b: Binding, site, cell: int) -> None:
        """A name of the scope means binding `b`: bring what it names into scope."""
        if b.kind == "def":
            self._function_unit(b.node, b.cell, b.order,
                                first_param(b.node) if id(b.node) in self.nb.attached else None)
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
                return ForbiddenScope._alias_like(f)
        return False

    def _reach(self, info: ClassInfo, entries) -> bool:
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
                    self._function_unit(m.node, m.cell, m.order, None if is_static(m.node) else first_param(m.node))
                elif m.kind == "lambda":
                    self._function_unit(m.node, m.cell, m.order, first_param(m.node))
                else:
                    self._expr_unit(m.node, m.cell, m.order)
        return changed

    # -- the walk --------------------------------------------------------------------------------
    def _walk(self, node, env: _Env) -> None:
        self._walk_stack([(node, env)])

    def _walk_stack(self, stack: list) -> None:
        while stack:
            node, env = stack.pop()
            if isinstance(node, FUNCTIONS):
                inner = local_names(node)
                self_name = env.self_name if env.self_name not in inner else None
                self._push_function(node, env, stack, self_name)
                continue
            if isinstance(node, ast.ClassDef):  # a class inside a function
                for e in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
                    stack.append((e, env))
                body_names = frozenset(n for s in node.body for n in stored_names(s)
                                       if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)))
                inner_env = _Env(env.scopes + (body_names,), env.time, env.self_name, env.cell)
                stack.extend((s, inner_env) for s in node.body)
                continue
            if isinstance(node, COMPREHENSIONS):
                inner_env = _Env(env.scopes + (comprehension_targets(node),), env.time, env.self_name,
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
            name = const_str(name_node)
            if name is not None:
                self.attrs.add(name)
                if name in self.names and self._string_counts(obj, name, env):
                    self._found(name, env.cell, node)
        if (isinstance(f, ast.Name) and f.id in ("eval", "exec") and not self._local(f.id, env)
                and node.args):
            code = const_str(node.args[0])
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
        name = const_str(node.slice)
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
            if fname in ("__import__", "import_module") and obj.args and const_str(obj.args[0]) == "__main__":
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
                    if star_exports(node.module, name):
                        self._found(name, env.cell, node)
                        break
            elif alias.name in self.names:
                self._found(alias.name, env.cell, node)

    def _found(self, name: str, cell: int, node) -> None:
        line = getattr(node, "lineno", 0) or 0
        key = (cell, line, name)
        if key not in self.found:
            self.found[key] = ForbiddenUse(name, cell, line, self.nb.code(cell, line))

"""Copies found the way instructors find them: code compared after normalisation.

`normalised(node)`: an exercise's definition with its docstrings dropped and its local names
(parameters, assigned names, loop and comprehension variables, nested definitions) renamed to
v0, v1, ... in the order the tree holds them; comments and formatting are not in the AST at all.
A copy whose variables were renamed or whose comments were rewritten normalises to the same
tree, so `class_report.identical_to_solutions` flags it.

`fingerprints(todo)`: each exercise's normalised code as a token stream (node types, names that
are not local such as torch or an attribute, constants), from a student's notebooks read as data
(never run). `pairs(students)` compares every two students per exercise by the Jaccard index of
their token k-grams (the shingles of MOSS-like tools) and lists the pairs at or above THRESHOLD,
for the instructor to look at: it changes no score. Very short code (fewer than MIN_TOKENS
tokens) and code equal to the released exercise stub are not compared: independent work looks
alike there; nor is code equal to the published solution (flagged as that already).
"""
from __future__ import annotations

import ast
import hashlib
from collections import defaultdict
from functools import lru_cache

from ..shared.contract import CHAPTERS
from ..source.submission import ParsedSubmission, parsed

THRESHOLD = 0.9   # Jaccard index of the token 4-grams at or above which a pair is listed
SHINGLE = 4
MIN_TOKENS = 40   # (a one-line exercise: everyone's right answer looks the same)
MAX_TOKENS = 20_000  # kept of one exercise (a student's huge cell must not make grading.json huge)

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


class Definitions:
    """A notebook's top-level definitions as a run of every cell leaves them, each with its
    place (cell, line): `last`, name -> the last `def` or `class` of that name; `attached`,
    class name -> method name -> the last function decorated `@add_to_class(that class)` (set on
    the class when defined, whatever the name is bound to later)."""

    def __init__(self, notebook):
        parsed = ParsedSubmission.of(notebook)
        self.last = {name: ((cell, node.lineno), node) for name, (cell, node) in parsed.definitions.items()}
        self.attached: dict[str, dict] = defaultdict(dict)
        for number, tree in enumerate(parsed.trees, 1):
            for node in tree.body if tree is not None else ():
                if isinstance(node, _FUNCTIONS):
                    for cls in filter(None, map(_attached_to, node.decorator_list)):
                        self.attached[cls][node.name] = ((number, node.lineno), node)


def definitions(notebook) -> Definitions:
    """The `Definitions` of a notebook's `ParsedSubmission` (or of its cells as they run)."""
    return Definitions(notebook)


def exercise_node(defs: Definitions, ex):
    """The exercise's own definition, or None: a method's function, in its class's body or
    attached to it afterwards with `@add_to_class(Cls)` (as chapter 6's notebook writes its
    methods, one cell each); a class with the methods so attached, as it runs. An attachment
    made before the class's last definition went with the class it was made to."""
    where, node = defs.last.get(ex.target, (None, None))
    attached = {} if where is None else {
        name: _as_method(fn) for name, (at, fn) in defs.attached.get(ex.target, {}).items() if at > where}
    if ex.kind == "method":
        if ex.name in attached:
            return attached[ex.name]
        return None if not isinstance(node, ast.ClassDef) else next(
            (n for n in node.body if isinstance(n, _FUNCTIONS) and n.name == ex.name), None)
    if isinstance(node, ast.ClassDef) and attached:
        body = [n for n in node.body if not (isinstance(n, _FUNCTIONS) and n.name in attached)]
        node = _with(node, body=body + list(attached.values()))
    return node


def _with(node, **fields):
    """A shallow copy of `node` with `fields` replaced (every field copied: a node built with
    some left out dumps differently on some Pythons, 3.12's `type_params`)."""
    return node.__class__(**{**{f: getattr(node, f, None) for f in node._fields}, **fields})


def _as_method(fn):
    """An attached function as the same method written in the class's body: without the
    `@add_to_class` decorator."""
    return _with(fn, decorator_list=[d for d in fn.decorator_list if _attached_to(d) is None])


def _attached_to(decorator) -> str | None:
    """The class `@add_to_class(Cls)` names, or None for another decorator."""
    if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name)
            and decorator.func.id == "add_to_class" and len(decorator.args) == 1
            and isinstance(decorator.args[0], ast.Name)):
        return decorator.args[0].id
    return None


def _local_names(root) -> set[str]:
    """Names bound inside the functions of `root`: parameters, assignment and loop targets,
    `as` names, nested definitions. A class's own attributes and methods are not locals (other
    code reaches them by name), nor are the names the code only reads (torch, F, math)."""
    local: set[str] = set()
    for fn in (n for n in ast.walk(root) if isinstance(n, _SCOPES)):
        a = fn.args
        local |= {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
        body = [fn.body] if isinstance(fn, ast.Lambda) else fn.body
        for stmt in body:
            for n in ast.walk(stmt):
                if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                    local.add(n.id)
                elif isinstance(n, ast.ExceptHandler) and n.name:
                    local.add(n.name)
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not fn:
                    local.add(n.name)
                elif isinstance(n, (ast.Global, ast.Nonlocal)):
                    local -= set(n.names)
    return local


def _copy(node):
    """A copy of the tree `node` (its fields, not its positions: `ast.dump` and `tokens` read
    none), as `copy.deepcopy` makes it, about ten times faster."""
    new = node.__class__.__new__(node.__class__)
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            value = _copy(value)
        elif isinstance(value, list):
            value = [_copy(v) if isinstance(v, ast.AST) else v for v in value]
        setattr(new, name, value)
    return new


def normalised(node):
    """A copy of the definition `node` without docstrings and with its locals renamed (see the
    module's docstring); None where it cannot be (a tree too deep to copy)."""
    try:
        node = _copy(node)
    except (RecursionError, MemoryError):
        return None
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body \
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant) \
                and isinstance(n.body[0].value.value, str):
            n.body = n.body[1:] or [ast.Pass()]
    local = _local_names(node)
    names: dict[str, str] = {}

    def new(name: str) -> str:
        return names.setdefault(name, f"v{len(names)}")

    for n in _preorder(node):  # (the same tree shape gives the same order, whatever the names)
        if isinstance(n, ast.Name) and n.id in local:
            n.id = new(n.id)
        elif isinstance(n, ast.arg) and n.arg in local:
            n.arg = new(n.arg)
        elif isinstance(n, ast.ExceptHandler) and n.name in local:
            n.name = new(n.name)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not node \
                and n.name in local:
            n.name = new(n.name)
    return node


def _preorder(node):
    """The tree's nodes in source order (an explicit stack: no recursion limit to hit)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


@lru_cache(maxsize=64)
def _normalised_once(node):
    """`normalised(node)` made once for `dump` and `tokens`, which both read it, never change
    it, and are asked for the same definition by the identical-code flag and then the
    similarity fingerprints, which empties it (an AST node hashes by identity, and the cache
    holds it: no other node can take its key). A class with attached methods is built anew by
    each `exercise_node`, so it is normalised once by each of the two."""
    return normalised(node)


def dump(node) -> str | None:
    """The normalised definition as text, for comparing two of them; None if it cannot be made."""
    n = _normalised_once(node) if node is not None else None
    if n is None:
        return None
    try:
        return ast.dump(n)
    except (RecursionError, MemoryError):
        return None


def tokens(node) -> list[str]:
    """The normalised definition as a token stream: each node's type, with its name, attribute
    or constant where it has one."""
    n = _normalised_once(node) if node is not None else None
    if n is None:
        return []
    out = []
    for x in _preorder(n):
        if len(out) >= MAX_TOKENS:
            break
        kind = type(x).__name__
        label = (x.id if isinstance(x, ast.Name) else x.arg if isinstance(x, (ast.arg, ast.keyword))
                 else x.attr if isinstance(x, ast.Attribute) else repr(x.value)[:40] if isinstance(x, ast.Constant)
                 else getattr(x, "name", None) if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 else None)
        if isinstance(x, (ast.Load, ast.Store, ast.Del)):
            continue
        out.append(f"{kind}:{label}" if label is not None else kind)
    return out


def compared(ex) -> bool:
    """Exercises whose code is compared: those the student writes from scratch (the task's
    `similarity_compared`). Not a written answer (a right answer is the solution's value) nor a
    find-the-bug fix (a right fix of the given code is usually the solution's)."""
    return ex.task.similarity_compared


@lru_cache(maxsize=None)
def solution_dumps(chapter: str) -> dict:
    """exercise -> the published solution's normalised code (`dump`)."""
    import json

    from ..references.solutions import reference_cells, solutions_dir

    with open(solutions_dir() / f"{chapter}.ipynb", encoding="utf-8") as f:
        defs = definitions(reference_cells(json.load(f)))
    return {ex.name: dump(exercise_node(defs, ex)) for ex in CHAPTERS[chapter].exercises if compared(ex)}


@lru_cache(maxsize=None)
def _stubs(chapter: str) -> dict:
    """exercise -> the released stub's token stream (the exercise notebook's), where it is here."""
    import json

    from ..references.solutions import REPO_DIR, reference_cells

    path = REPO_DIR / "exercises" / f"{chapter}.ipynb"
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        defs = definitions(reference_cells(json.load(f)))
    return {ex.name: tokens(exercise_node(defs, ex)) for ex in CHAPTERS[chapter].exercises if compared(ex)}


def fingerprints(todo) -> dict[str, str]:
    """"chapter: exercise" -> the exercise's token stream (space-separated) for every compared
    exercise of the student's notebooks (`todo`: (chapter id, notebook) pairs, a notebook being
    its `ParsedSubmission`, its path or None) that is long enough, not the released stub and not
    the published solution (flagged as such on its own: every copy of it would pair with every
    other). Reads the notebooks as data; a notebook it cannot read gives nothing."""
    out = {}
    for chapter, notebook in todo:
        if notebook is None or chapter not in CHAPTERS:
            continue
        try:
            defs = definitions(parsed(notebook))
            stubs = _stubs(chapter)
            solution = solution_dumps(chapter)
        except Exception:  # (an unreadable notebook: its grading says why)
            continue
        for ex in CHAPTERS[chapter].exercises:
            if not compared(ex):
                continue
            node = exercise_node(defs, ex)
            stream = tokens(node)
            if len(stream) >= MIN_TOKENS and stream != stubs.get(ex.name) \
                    and (node is None or dump(node) != solution.get(ex.name)):
                out[f"{chapter}: {ex.name}"] = " ".join(stream)
    _normalised_once.cache_clear()  # (it would keep this student's trees alive: a cell may be 100 kB)
    return out


def _shingles(stream: str) -> frozenset:
    t = stream.split(" ")
    return frozenset(hashlib.blake2b(" ".join(t[i:i + SHINGLE]).encode(), digest_size=8).digest()
                     for i in range(max(1, len(t) - SHINGLE + 1)))


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def pairs(code: dict[str, dict], threshold: float = THRESHOLD) -> list[dict]:
    """Pairs of students whose code of some exercise is at least `threshold` alike (code:
    student -> `fingerprints`), most shared exercises first: {"students": (a, b), "exercises":
    [(column, similarity)], ...}."""
    by_exercise: dict[str, list] = defaultdict(list)
    for student, streams in sorted(code.items()):
        for column, stream in (streams or {}).items():
            if isinstance(stream, str) and stream:
                by_exercise[column].append((student, _shingles(stream)))
    found: dict[tuple, list] = defaultdict(list)
    for column, entries in by_exercise.items():
        for i, (a, sa) in enumerate(entries):
            for b, sb in entries[i + 1:]:
                s = jaccard(sa, sb)
                if s >= threshold:
                    found[(a, b)].append((column, s))
    return [{"students": k, "exercises": v} for k, v in
            sorted(found.items(), key=lambda kv: (-len(kv[1]), -max(s for _, s in kv[1]), kv[0]))]

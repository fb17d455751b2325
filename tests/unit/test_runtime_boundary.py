"""The trust boundary, drawn by the folders: what runs beside student code is `autograder/shared/`
(plain data both sides speak) and `autograder/runtime/` (the processes in the sandbox), and the
sandbox stages exactly those two folders (`sandbox.visibility.RUNTIME_PACKAGES`). Every file there
imports, from the package, only files there (else the child fails to start, or a grader-side
module holding cases, hints or solutions would have to be staged beside student code); `shared/`
imports nothing from `runtime/`; and nothing is staged that nothing uses."""
from __future__ import annotations

import ast
from pathlib import Path

from autograder.sandbox.visibility import PACKAGE_DIR, RUNTIME_PACKAGES, stage_runtime

# Used although no staged module imports them: the modules the sandbox starts by name.
ENTRY_POINTS = {"runtime/child.py", "runtime/warm.py", "runtime/zygote.py"}


def _module_file(dotted: str) -> str:
    """'autograder.shared.wire' -> 'shared/wire.py' ('autograder.shared' -> 'shared/__init__.py')."""
    parts = dotted.split(".")[1:]
    if (PACKAGE_DIR.joinpath(*parts)).is_dir():
        return "/".join(parts + ["__init__.py"]) if parts else "__init__.py"
    return "/".join(parts) + ".py"


def _package_imports(path: Path, package: str) -> set[str]:
    """The package files that `path` (a module of dotted `package`) imports, relative to the
    package root: `from . import x`, `from ..x import y`, `import autograder.x.y`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "autograder" or module.startswith("autograder."):
                for alias in node.names:  # `from . import x` names a module; `from .x import y` a name
                    sub = f"{module}.{alias.name}"
                    is_module = (PACKAGE_DIR.joinpath(*sub.split(".")[1:]).with_suffix(".py").exists()
                                 or PACKAGE_DIR.joinpath(*sub.split(".")[1:]).is_dir())
                    targets.append(sub if is_module else module)
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("autograder")]
        found |= {_module_file(t) for t in targets}
    return found


def _runtime_files() -> dict[str, Path]:
    return {f"{folder}/{f.name}": f for folder in RUNTIME_PACKAGES
            for f in sorted((PACKAGE_DIR / folder).glob("*.py"))}


def _imports_of(rel: str, path: Path) -> set[str]:
    package = "autograder." + rel.rsplit("/", 1)[0].replace("/", ".")
    return _package_imports(path, package) - {"__init__.py"}


def test_the_runtime_imports_only_what_is_staged():
    staged = set(_runtime_files())
    assert staged, "no runtime files found: the guard would pass vacuously"
    for rel, path in _runtime_files().items():
        outside = _imports_of(rel, path) - staged
        assert not outside, f"{rel} imports {sorted(outside)}, which the sandbox does not stage"


def test_shared_does_not_import_the_runtime():
    for rel, path in _runtime_files().items():
        if rel.startswith("shared/"):
            assert not {m for m in _imports_of(rel, path) if m.startswith("runtime/")}, rel


def test_nothing_is_staged_that_the_runtime_does_not_use():
    used = set(ENTRY_POINTS)
    for rel, path in _runtime_files().items():
        used |= _imports_of(rel, path)
    unused = {r for r in _runtime_files() if not r.endswith("__init__.py")} - used
    assert not unused, sorted(unused)


def test_the_stage_holds_exactly_the_runtime_folders():
    root = stage_runtime() / "autograder"
    staged = {f.relative_to(root).as_posix() for f in root.rglob("*.py")}
    assert staged == set(_runtime_files()) | {"__init__.py"}


def test_the_guard_sees_an_import_from_outside(tmp_path):
    """The check itself can fail: a runtime module importing a grader-side one is found."""
    f = tmp_path / "m.py"
    f.write_text("from ..references import solutions\nfrom ..shared.calls import Call\n"
                 "from ..grading.grader import Grader\nimport autograder.cases\n")
    assert _package_imports(f, "autograder.runtime") == {
        "references/solutions.py", "shared/calls.py", "grading/grader.py", "cases/__init__.py"}

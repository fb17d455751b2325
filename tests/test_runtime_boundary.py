"""What runs beside student code is exactly what the sandbox stages (sandbox.RUNTIME_MODULES):
every staged module imports, from the package, only staged modules (else the child fails to
start, or a grader-side module with secrets would have to be staged), and nothing is staged
that no staged module needs."""
from __future__ import annotations

import ast

from autograder.sandbox import PACKAGE_DIR, RUNTIME_MODULES

# Staged although no staged module imports them: the package marker, and the modules the
# sandbox starts by name (`python -m autograder.worker`, the zygote).
ENTRY_POINTS = {"__init__.py", "worker.py", "zygote.py"}


def _package_imports(path) -> set[str]:
    """The package modules a file imports (`from . import x`, `from .x import y`), as file names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0] + ".py")
            else:
                found |= {alias.name + ".py" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograder."):
            found.add(node.module.split(".")[1] + ".py")
    return found


def test_the_runtime_imports_only_what_is_staged():
    staged = set(RUNTIME_MODULES)
    for name in sorted(staged):
        outside = _package_imports(PACKAGE_DIR / name) - staged
        assert not outside, f"{name} imports {sorted(outside)}, which the sandbox does not stage"


def test_nothing_is_staged_that_the_runtime_does_not_use():
    used = set(ENTRY_POINTS)
    for name in RUNTIME_MODULES:
        used |= _package_imports(PACKAGE_DIR / name)
    assert set(RUNTIME_MODULES) <= used, sorted(set(RUNTIME_MODULES) - used)


def test_the_guard_sees_an_import_from_outside(tmp_path):
    """The check itself can fail: a runtime module importing a grader-side one is found."""
    f = tmp_path / "m.py"
    f.write_text("from . import references\nfrom .calls import Call\n")
    assert _package_imports(f) == {"references.py", "calls.py"}

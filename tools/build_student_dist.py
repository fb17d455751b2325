#!/usr/bin/env python
"""Build what students of a course that does not publish its solutions install: the exercise
notebooks and the student package, and nothing that works an exercise out.

    python tools/build_student_dist.py OUT     # OUT/exercises/, OUT/autograder/, OUT/pyproject.toml
    cd OUT && pip install .                    # (torch first, as tools/install.sh installs it)

The student package is the part of `autograder/` that the self-check runs on, found by following
its imports from `autograder/selfcheck/` (`student_files`): the self-check, its hint engine and
chapter rules (no mistake model), its data (expected outcomes and the mistake models' predictions
on the public quick cases, `python -m autograder selfcheck-data`), the comparison rule and what it
needs of `shared/` and `runtime/`. The grader's cases, mistake models, references, sandbox and
reports stay with the instructor; the exercise notebooks import `autograder.selfcheck` as they
do with the whole package. `tests/course/test_student_package.py` checks that nothing shipped
imports the grader's side and that nothing shipped scores an exercise in full.
"""
from __future__ import annotations

import argparse
import ast
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "autograder"
ENTRY = "selfcheck"   # the folder the self-check lives in; all of it ships
DATA = ["data/selfcheck.agw"]

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "attention-course-student"
version = "{version}"
description = "Attention mechanisms course: the self-check the exercise notebooks call (no solutions)"
requires-python = ">=3.10"
dependencies = ["{torch}"]

[tool.setuptools.packages.find]
include = ["autograder", "autograder.*"]

[tool.setuptools.package-data]
autograder = ["data/*"]
"""


def _imports(path: Path) -> set[str]:
    """The package files (relative to autograder/) that `path` imports, anywhere in it."""
    package = ["autograder"] + list(path.relative_to(PACKAGE).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [f"{module}.{a.name}" for a in node.names] + [module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == "autograder" or name.startswith("autograder."):
                found |= _files_of(name.split(".")[1:])
    return found


def _files_of(parts: list[str]) -> set[str]:
    """A dotted name's file (a module, or a package's __init__.py), with the __init__.py of every
    package above it; nothing for a name that is not a module (`from .x import name`)."""
    target = PACKAGE.joinpath(*parts)
    if target.is_dir():
        files = {"/".join(parts + ["__init__.py"])}
    elif target.with_suffix(".py").exists():
        files = {"/".join(parts) + ".py"}
    else:
        return set()
    return files | {"/".join(parts[:i] + ["__init__.py"]) for i in range(len(parts))}


def student_files() -> set[str]:
    """Every file of the student package, relative to autograder/: all of `selfcheck/` (its chapter
    rules are imported by name), what those import, transitively, and the self-check's data."""
    todo = {str(p.relative_to(PACKAGE)) for p in (PACKAGE / ENTRY).rglob("*.py")} | {"__init__.py"}
    seen: set[str] = set()
    while todo:
        rel = todo.pop()
        seen.add(rel)
        todo |= _imports(PACKAGE / rel) - seen
    return seen | set(DATA)


def build(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    for rel in sorted(student_files()):
        (out / "autograder" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PACKAGE / rel, out / "autograder" / rel)
    shutil.copytree(REPO / "exercises", out / "exercises")
    main = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"', main, re.M).group(1)
    torch = re.search(r'^ *"(torch==[^"]+)"', main, re.M).group(1)
    (out / "pyproject.toml").write_text(PYPROJECT.format(version=version, torch=torch), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write (replaced if it exists)")
    args = parser.parse_args(argv)
    build(args.out)
    print(f"wrote {args.out}: exercises/ and the student package ({len(student_files())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

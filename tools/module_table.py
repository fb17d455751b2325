"""Print docs/grading.md's table of the package: every folder and module, its lines, and the
first sentence of its docstring (so the table says what the code says of itself).

    python tools/module_table.py > /tmp/table.md   # then paste it over the table in docs/grading.md
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "autograder"
ORDER = ["shared", "runtime", "sandbox", "session", "source", "references", "cases", "grading", "batch",
         "report", "lms", "integrations"]


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = re.sub(r"\s+", " ", doc.split("\n\n")[0]).strip()
    sentence = re.split(r"(?<=[.])\s", text)[0]
    if len(sentence) > 180:  # a long one: its head, up to its first colon or semicolon
        sentence = re.split(r"[:;]\s", sentence)[0]
    return sentence.rstrip(":.").replace("|", "/")


def rows():
    yield "| folder / module | lines | what it holds |"
    yield "|---|---|---|"
    for f in sorted(ROOT.glob("*.py")):
        if f.name != "__init__.py":
            yield f"| `{f.name}` | {len(f.read_text(encoding='utf-8').splitlines())} | {first_sentence(f)} |"
    for folder in ORDER:
        yield f"| **`{folder}/`** | | {first_sentence(ROOT / folder / '__init__.py')} |"
        for f in sorted((ROOT / folder).glob("*.py")):
            if f.name != "__init__.py":
                lines = len(f.read_text(encoding="utf-8").splitlines())
                yield f"| `{folder}/{f.name}` | {lines} | {first_sentence(f)} |"


if __name__ == "__main__":
    print("\n".join(rows()))

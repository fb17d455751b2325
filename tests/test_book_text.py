"""The book quotes the autograder's hints word for word; these quotes must stay true when a hint
is reworded (the build would not notice)."""
import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
QUOTE = re.compile(r'grader (?:says|reports|answers) "([^"]+)"')


def _normalise(text: str) -> str:
    return " ".join(text.split())


def hint_texts() -> list[str]:
    """Every string literal of the chapter case modules (where the hints are written)."""
    texts = []
    for path in sorted((REPO / "autograder" / "cases").glob("ch*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(_normalise(node.value))
    return texts


def book_quotes() -> list[tuple[str, str]]:
    quotes = []
    for page in sorted((REPO / "book").glob("*.md")):
        for q in QUOTE.findall(_normalise(page.read_text())):
            quotes.append((page.name, q))
    return quotes


def test_the_book_quotes_some_hints():
    assert len(book_quotes()) >= 2  # the pattern still finds the quotes the pages make


@pytest.mark.parametrize("page,quote", book_quotes())
def test_every_quoted_hint_is_one_the_grader_gives(page, quote):
    assert any(quote in text for text in hint_texts()), (
        f'{page} quotes the grader as saying "{quote}", but no hint in autograder/cases says that')

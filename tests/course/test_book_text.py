"""The book quotes the autograder's hints word for word; these quotes must stay true when a hint
is reworded (the build would not notice)."""
import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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


# --------------------------------------------------------------------------- the book as one book
CHAPTER_PAGES = sorted((REPO / "book").glob("0[0-9]_*.md"))


def _h2(page: Path) -> list[str]:
    """The page's level-2 headings, outside code cells."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [m.group(1).strip() for m in re.finditer(r"^## (.+)$", text, flags=re.M)]


def test_there_are_eight_chapters():
    from autograder.shared.contract import CHAPTERS

    assert [p.stem for p in CHAPTER_PAGES] == list(CHAPTERS) and len(CHAPTER_PAGES) == 8


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=[p.stem for p in CHAPTER_PAGES])
def test_every_chapter_has_the_same_section_order(page):
    """Motivation first; Common mistakes, then Exercise, last."""
    heads = _h2(page)
    assert heads[0].startswith("Motivation"), heads
    assert heads[-2:] == ["Common mistakes", "Exercise"], heads


def test_the_pages_that_tie_the_book_together_cover_every_chapter():
    from autograder.shared.contract import CHAPTERS

    index = (REPO / "book" / "index.md").read_text()
    for chapter in CHAPTERS:
        assert f"]({chapter}.md)" in index, chapter  # a row of the path table
    assert "chapters 1 to 8" in (REPO / "book" / "summary.md").read_text()
    further = (REPO / "book" / "further_reading.md").read_text()
    for n in range(1, 9):
        assert re.search(rf"\bchapters? (?:\d and )?{n}\b|chapters \d to {n}\b|chapters {n} to", further), n
    for work in ("ALiBi", "Longformer", "Mistral", "FlashAttention-2", "Xiong", "GPT-2", "nanoGPT"):
        assert work in further, work


def test_the_api_page_names_every_written_answer_and_find_the_bug_exercise():
    from autograder.shared.contract import CHAPTERS

    api = (REPO / "book" / "exercise_api.md").read_text()
    for ch in CHAPTERS.values():
        for ex in ch.exercises:
            if ex.kind == "answer" or ex.name.startswith("fixed_"):
                assert f"`{ex.name}" in api, ex.name


def test_the_notation_table_declares_the_symbols_of_chapters_7_and_8():
    api = (REPO / "book" / "exercise_api.md").read_text()
    table = api[api.index("(notation)="):]
    for symbol in ("$H_{kv}$", "$w$", "\\operatorname{lse}", "$m_h$", "\\ell", "$t$"):
        assert symbol in table, symbol


def test_every_page_says_what_each_attention_returns():
    """The conventions on the index and the API page list the exceptions to (output, weights)."""
    for page in ("index.md", "exercise_api.md"):
        text = _normalise((REPO / "book" / page).read_text())
        for words in ("(output, lse)", "(output, weights, present_kv)", "(logits, weights)"):
            assert words in text, (page, words)


def test_the_float16_claim_is_what_torch_does():
    """masked_fill with -1e9 on float16 raises (it does not give -inf); the pages say so."""
    import torch

    with pytest.raises(RuntimeError, match="c10::Half without overflow"):
        torch.zeros(2).half().masked_fill(torch.tensor([True, False]), -1e9)
    for page in ("05_masks.md", "summary.md"):
        text = _normalise((REPO / "book" / page).read_text())
        assert "becomes $-\\infty$ anyway" not in text and "raises" in text, page

"""Student text reaches the instructor's terminal, browser and gradebook only as text: a student
whose exception message holds ANSI escapes and a fake "Total: 13 / 13" line (before: it erased
the report's lines and printed that total, while the JSON said 0), who prints escapes and bidi
overrides, and whose folder and notebook names hold escapes, graded through the real grader."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.report.untrusted_text import printable

REPO = Path(__file__).resolve().parents[2]

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
FAKE_TOTAL = "\x1b[2K\x1b[1A\x1b[2K\rTotal: 13 / 13  (graded in 0.1 s)\n\x1b[8m"
FORGER = [
    'print("\\x1b]0;pwned\\x07\\x1b[31mred\\u202eevil\\x9b2J\\x7f")',
    'raise RuntimeError("cell \\x1b[2K\\r\\u2066hidden")',
    f'''def attention_pool(query, keys, values):
    raise ValueError({FAKE_TOTAL!r})
''',
]
FOLDER = "mallory\x1b[2K"
NOTEBOOK = "\x1b[1Amy_01_intuition.ipynb"


def test_printable_shows_every_control_character_escaped():
    assert printable("a\x1b[2Kb\tc\nd") == "a\\x1b[2Kb\tc\nd"
    assert printable("\x00\r\x7f\x85\x9b") == "\\x00\\x0d\\x7f\\x85\\x9b"
    assert printable("abc\u202eevil\u2066x\u2069") == "abc\\u202eevil\\u2066x\\u2069"
    assert printable("é ✓ 中文 \u200b") == "é ✓ 中文 \u200b"  # printable text is left as it is
    assert printable(printable("\x1b")) == printable("\x1b")
    assert not CONTROL.search(printable("".join(map(chr, range(0x3000)))))


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


def _clean(text: str, where: str) -> None:
    bad = CONTROL.search(text)
    assert bad is None, (where, text[max(0, bad.start() - 80): bad.end() + 80])


@pytest.mark.needs_bwrap
def test_no_control_character_reaches_a_report(tmp_path):
    klass = tmp_path / "class"
    nb = nbformat.read(REPO / "solutions" / "01_intuition.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(src) for src in FORGER]
    (klass / FOLDER).mkdir(parents=True)
    nbformat.write(nb, klass / FOLDER / NOTEBOOK)

    def autograder(*args):
        r = subprocess.run([sys.executable, "-m", "autograder", *map(str, args), "--device", "cpu"],
                           capture_output=True, text=True, timeout=600, cwd=REPO)
        assert r.returncode == 0, r.stderr
        return r

    graded = autograder("grade", klass / FOLDER, "--json", tmp_path / "results.json",
                        "--html", tmp_path / "feedback.html", "--verbose")
    batch = autograder("batch", klass, "--no-progress", "--csv", tmp_path / "grades.csv",
                       "--out", tmp_path / "reports")

    text = graded.stdout
    _clean(text + graded.stderr + batch.stdout + batch.stderr, "terminal")
    assert "\\x1b[2K" in text and "Total: 13 / 13" in text  # shown, escaped, inside the message
    totals = [line for line in text.splitlines() if line.startswith("Total")]
    assert len(totals) == 1 and totals[0].startswith("Total: 8 / 13"), totals
    assert "\\x1b[1Amy_01_intuition.ipynb" in text  # the notebook's name, escaped

    for path in [tmp_path / "feedback.html", *(tmp_path / "reports").rglob("feedback.html")]:
        html = path.read_text(encoding="utf-8")
        _clean(html, path.name)
        assert "\\x1b[31mred\\u202eevil" in html  # the notebook's output, shown escaped
    for path in [tmp_path / "results.json", *(tmp_path / "reports").rglob("results.json")]:
        raw = path.read_text(encoding="utf-8")
        report = json.loads(raw)
        for s in _strings(report):
            _clean(s, path.name)
        pool = [t for t in report["tests"] if t["extra_data"]["exercise"] == "attention_pool"]
        assert pool and all(t["score"] == 0 for t in pool), pool
        assert report["score"] == pytest.approx(8.0)
        assert any("RuntimeError: cell \\x1b[2K\\x0d\\u2066hidden" in line for line in report["output"].splitlines())
    csv_text = (tmp_path / "grades.csv").read_text(encoding="utf-8")
    _clean(csv_text, "grades.csv")
    assert "mallory\\x1b[2K" in csv_text
    assert [p.name for p in (tmp_path / "reports").iterdir() if p.is_dir()] == [FOLDER]
    class_page = (tmp_path / "reports" / "class_report.html").read_text(encoding="utf-8")
    _clean(class_page, "class_report.html")
    assert "mallory\\x1b[2K" in class_page  # the student's folder, shown escaped

"""The class report (`batch --out` writes DIR/class_report.html; report/class_report.py): its
numbers are the CSV's, hints are counted per student with examples, code identical to the
published solutions is flagged, regrading one student (`batch --only`) updates the CSV and the
report, `merge --out` builds it too, student text is escaped, and it shows in a real browser."""
from __future__ import annotations

import csv
import html as htmllib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.batch.grade_class import grade_class
from autograder.grading.grader import Grader
from autograder.report import class_report
from autograder.shared.contract import CHAPTERS
from grading_helpers import REPO, read_gradebook

CH1 = "01_intuition"
SCALED = "the dot products are scaled by 1/sqrt(d)"
HOSTILE = "<img src=x onerror=alert(1)>\x1b[2K"  # a student folder's name is the student's text


def _mistake(dest: Path) -> None:
    """Chapter 1's solution with one mistake: attention_pool scales the scores by 1/sqrt(d)."""
    nb = json.loads((REPO / "solutions" / f"{CH1}.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if "weights = softmax(scores, dim=-1)" in src:
            cell["source"] = src.replace("weights = softmax(scores, dim=-1)",
                                         "weights = softmax(scores / query.shape[-1] ** 0.5, dim=-1)")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{CH1}.ipynb").write_text(json.dumps(nb))


def _copy(src: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / src / f"{CH1}.ipynb", dest)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A class of five graded on chapter 1: the solutions, the stub, two with the same mistake,
    and a stub in a folder whose name is HTML with an escape sequence."""
    root = tmp_path_factory.mktemp("class_report")
    cls = root / "class"
    _copy("solutions", cls / "sol")
    _copy("exercises", cls / "stub")
    _mistake(cls / "mia")
    _mistake(cls / "noah")
    _copy("exercises", cls / HOSTILE)
    grade_class(cls, Grader(device="cpu"), jobs=1, out_dir=root / "out", csv_path=root / "grades.csv",
                chapters=[CH1], progress=False)
    return root


def _page(out: Path) -> str:
    return (out / class_report.PAGE).read_text(encoding="utf-8")


def _table(page: str, table_id: str) -> list[list[str]]:
    """The cells of a table of the page, as text."""
    body = re.search(rf"<table id='{table_id}'>(.*?)</table>", page, re.S).group(1)
    return [[htmllib.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)][1:]


def test_the_reports_numbers_are_the_csvs(graded):
    rows = read_gradebook(graded / "grades.csv")
    page = _page(graded / "out")
    students = {r[1]: r for r in _table(page, "students")}
    assert set(students) == {r["ID"] for r in rows.values()}
    for sid, r in rows.items():
        assert students[sid][2] == r["Total"] and students[sid][3] == r["Status"]
    exercises = {r[1]: r for r in _table(page, "exercises")}
    for ex in ("softmax", "attention_pool", "predict_softmax_large", "fixed_softmax_rows"):
        column = [float(r[f"{CH1}: {ex}"]) for r in rows.values()]
        with open(graded / "grades.csv", newline="") as f:
            table = list(csv.reader(f))
        most = float(table[1][table[0].index(f"{CH1}: {ex}")])
        full = sum(v >= most - 1e-9 for v in column)
        assert exercises[ex][2] == f"{statistics.fmean(column):.2f}", ex
        assert exercises[ex][4] == f"{full} of {len(column)}", ex
        assert exercises[ex][5] == f"{100 * full / len(column):.0f}%", ex
    totals = [float(r["Total"]) for r in rows.values()]
    assert f"<span id='mean-total'>{statistics.fmean(totals):.2f}</span>" in page
    assert float(rows["mia"]["Total"]) < float(rows["sol"]["Total"])


def test_hints_are_counted_per_student_with_examples(graded):
    hints = [r for r in _table(_page(graded / "out"), "hints") if SCALED in r[3]]
    assert len(hints) == 1, _table(_page(graded / "out"), "hints")
    students, cases, exercise, _, examples = hints[0]
    assert students == "2" and int(cases) >= 2 and exercise == f"{CH1}: attention_pool"
    assert examples == "mia, noah"


def test_code_identical_to_the_published_solutions_is_flagged(graded):
    flags = {(r[0], r[1]): r[2] for r in _table(_page(graded / "out"), "flags")}
    same = "identical to the published solution"
    assert flags[("sol", same)] == f"{CH1}: softmax, {CH1}: attention_pool"
    assert flags[("mia", same)] == f"{CH1}: softmax"  # (their attention_pool differs)
    assert not any(name == "stub" for name, _ in flags)
    # a flag, not a penalty: the solutions keep full marks
    assert read_gradebook(graded / "grades.csv")["sol"]["Status"] == "ok"


def test_a_notebook_that_could_not_be_read_is_flagged(tmp_path):
    """A corrupt upload scores zero for its chapter; the instructor, who may take it again, sees it
    among the flags (before: only in the exercise's counts)."""
    cls = tmp_path / "class"
    _copy("solutions", cls / "sol")
    (cls / "zoe").mkdir()
    (cls / "zoe" / f"{CH1}.ipynb").write_text('{"cells": [', encoding="utf-8")
    grade_class(cls, Grader(device="cpu"), jobs=1, out_dir=tmp_path / "out", csv_path=tmp_path / "grades.csv",
                chapters=[CH1], progress=False)
    flags = {(r[0], r[1]): r[2] for r in _table(_page(tmp_path / "out"), "flags")}
    assert flags[("zoe", "notebook not read")].startswith(f"{CH1}: "), flags
    assert not any(name == "sol" and what == "notebook not read" for name, what in flags)


def test_reformatted_code_is_still_identical_and_a_changed_one_is_not(tmp_path):
    nb = json.loads((REPO / "solutions" / f"{CH1}.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if src.startswith("def softmax("):
            body = "\n".join(line.split("  #")[0] for line in src.splitlines() if not line.strip().startswith("#"))
            cell["source"] = "# my own work\n\n" + body.replace('"""Numerically', '"""My numerically')
    (tmp_path / f"{CH1}.ipynb").write_text(json.dumps(nb))
    assert class_report.identical_to_solutions([(CH1, tmp_path / f"{CH1}.ipynb")]) == \
        [[CH1, "softmax"], [CH1, "attention_pool"]]
    _mistake(tmp_path / "m")
    assert [CH1, "attention_pool"] not in class_report.identical_to_solutions([(CH1, tmp_path / "m" / f"{CH1}.ipynb")])


def test_student_text_is_escaped(graded):
    page = _page(graded / "out")
    assert HOSTILE not in page and "<img src=x" not in page and "\x1b" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;\\x1b[2K" in page


def test_regrading_one_student_updates_the_csv_and_the_report(graded, tmp_path):
    cls, out, grades = tmp_path / "class", tmp_path / "out", tmp_path / "grades.csv"
    shutil.copytree(graded / "class", cls)
    shutil.copytree(graded / "out", out)
    shutil.copy(graded / "grades.csv", grades)
    before = read_gradebook(grades)
    _copy("solutions", cls / "mia")  # mia hands in a corrected notebook
    r = subprocess.run([sys.executable, "-m", "autograder", "batch", str(cls), "--only", "mia", "--chapters", "01",
                        "--device", "cpu", "--csv", str(grades), "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr
    after = read_gradebook(grades)
    assert float(after["mia"]["Total"]) == float(after["sol"]["Total"]) > float(before["mia"]["Total"])
    assert {k: v for k, v in after.items() if k != "mia"} == {k: v for k, v in before.items() if k != "mia"}
    with open(grades, newline="") as f:
        assert [row[0] for row in list(csv.reader(f))[2:]] == sorted(before)  # every row once, in order
    page = _page(out)
    students = {row[1]: row for row in _table(page, "students")}
    assert students["mia"][2] == after["mia"]["Total"]
    hint = next(row for row in _table(page, "hints") if SCALED in row[3])
    assert hint[0] == "1" and hint[4] == "noah"
    flags = {(row[0], row[2]) for row in _table(page, "flags")}
    assert ("mia", f"{CH1}: softmax, {CH1}: attention_pool") in flags


def test_regrading_one_student_with_another_seed_is_refused(graded, tmp_path):
    """`--only` with a seed (or devices) other than the class's: that student's hidden inputs
    would not be the class's. Before: accepted without a word."""
    out = tmp_path / "out"
    shutil.copytree(graded / "out", out)
    other = Grader(device="cpu").seed + 1
    with pytest.raises(ValueError, match="graded with another seed or other devices: grade with the class's --seed"):
        grade_class(graded / "class", Grader(device="cpu", seed=other), only=["mia"], out_dir=out,
                    csv_path=tmp_path / "grades.csv", chapters=[CH1], progress=False)
    assert not (tmp_path / "grades.csv").exists()


def test_regrading_one_student_of_a_csv_alone_with_another_seed_is_refused(graded, tmp_path):
    """The same without `--out`: nothing but the CSV recorded the class's run, so a regrade with
    another seed went through. Now `grades.csv.run` beside it says how it was graded."""
    from autograder.batch.grades_csv import read_run, run_path

    csv_path = tmp_path / "grades.csv"
    shutil.copy(graded / "grades.csv", csv_path)
    shutil.copy(run_path(graded / "grades.csv"), run_path(csv_path))
    grader = Grader(device="cpu")
    assert read_run(csv_path) == class_report.run_of(grader.seed, grader.devices)
    before = csv_path.read_text()
    with pytest.raises(ValueError, match=r"grades.csv was graded with another seed or other devices \(its grades.csv.run"):
        grade_class(graded / "class", Grader(device="cpu", seed=grader.seed + 1), only=["mia"],
                    csv_path=csv_path, chapters=[CH1], progress=False)
    assert csv_path.read_text() == before
    grade_class(graded / "class", grader, only=["mia"], csv_path=csv_path, chapters=[CH1], progress=False)
    assert read_run(csv_path) == class_report.run_of(grader.seed, grader.devices)


def test_shards_graded_with_another_seed_are_not_merged(graded, tmp_path):
    from autograder.batch.grades_csv import merge_csvs, read_run, run_path, write_run

    grader = Grader(device="cpu")
    with open(graded / "grades.csv", newline="") as f:
        lines = list(csv.reader(f))
    shards = []
    for i, rows in enumerate((lines[2:4], lines[4:])):
        shard = tmp_path / f"grades-{i}.csv"
        with open(shard, "w", newline="") as f:
            csv.writer(f).writerows(lines[:2] + rows)
        write_run(shard, class_report.run_of(grader.seed + i, grader.devices))
        shards.append(shard)
    with pytest.raises(ValueError, match="were graded with another seed or other devices"):
        merge_csvs(shards, tmp_path / "grades.csv")
    assert not (tmp_path / "grades.csv").exists()
    write_run(shards[1], read_run(shards[0]))
    assert merge_csvs(shards, tmp_path / "grades.csv") == len(lines) - 2
    assert read_run(tmp_path / "grades.csv") == read_run(shards[0])
    run_path(shards[1]).unlink()  # (a shard of an older grader: taken as it is, and nothing said of the whole)
    assert merge_csvs(shards, tmp_path / "merged.csv") == len(lines) - 2
    assert read_run(tmp_path / "merged.csv") is None


def test_a_regrade_stopped_between_a_students_files_leaves_no_older_grade_beside_them(graded, tmp_path, monkeypatch):
    """A run stopped after a student's feedback was written and before their grading.json: the
    class report and `export` read grading.json, so the earlier run's stayed beside the new
    feedback and was read as the student's grade. Now it goes first."""
    from autograder.batch import grade_class as batch_module

    cls, out = tmp_path / "class", tmp_path / "out"
    shutil.copytree(graded / "class", cls)
    shutil.copytree(graded / "out", out)
    _copy("solutions", cls / "mia")
    assert (out / "mia" / class_report.SAVED).is_file()

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(batch_module.class_report, "save", stopped)
    with pytest.raises(KeyboardInterrupt):
        grade_class(cls, Grader(device="cpu"), only=["mia"], out_dir=out, csv_path=tmp_path / "grades.csv",
                    chapters=[CH1], progress=False, in_process=True)
    assert json.loads((out / "mia" / "results.json").read_text())["score"] == CHAPTERS[CH1].points  # (this run's)
    assert not (out / "mia" / class_report.SAVED).exists()
    students, problems = class_report.load(out)
    assert "mia" not in students
    assert any(p.startswith("mia: no grading.json (a regrade that was stopped") for p in problems), problems


def test_only_names_a_student_folder(graded):
    with pytest.raises(ValueError, match="no student folder 'zoe'"):
        grade_class(graded / "class", Grader(device="cpu"), only=["zoe"], chapters=[CH1], progress=False)


def test_merge_builds_the_class_report(graded, tmp_path):
    from autograder.cli import main

    shards = [tmp_path / "r1", tmp_path / "r2"]
    for i, folder in enumerate(sorted(p for p in (graded / "out").iterdir() if p.is_dir())):
        shutil.copytree(folder, shards[i % 2] / folder.name)
    assert main(["merge", str(graded / "grades.csv"), "--csv", str(tmp_path / "g.csv"),
                 "--reports", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0
    assert _table(_page(tmp_path / "merged"), "students") == _table(_page(graded / "out"), "students")


def test_the_class_report_in_a_browser(graded):
    """Chromium shows both plots (decoded, naturalWidth > 0) and the CSV's totals."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    chromium = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        pytest.skip(f"no browser at {chromium}")
    rows = read_gradebook(graded / "grades.csv")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            requests = []
            page.on("request", lambda req: requests.append(req.url))
            page.goto((graded / "out" / class_report.PAGE).as_uri())
            images = page.evaluate("[...document.images].map(i => ({id: i.id, alt: i.alt, w: i.naturalWidth, "
                                   "h: i.naturalHeight, shown: i.getBoundingClientRect().width}))")
            assert {i["id"] for i in images} == {"histogram", "pass-rates"}
            assert all(i["w"] > 0 and i["h"] > 0 and i["shown"] > 0 and i["alt"] for i in images), images
            totals = page.evaluate("Object.fromEntries([...document.querySelectorAll('#students tr')].slice(1)"
                                   ".map(r => [r.cells[1].innerText, r.cells[2].innerText]))")
            assert totals == {sid: r["Total"] for sid, r in rows.items()}
            assert all(u.startswith(("file:", "data:")) for u in requests), requests  # nothing from the network
        finally:
            browser.close()

"""The class report: one self-contained HTML page on how the whole class did.

`batch --out DIR` keeps each student's full results in DIR/<student>/grading.json (`save`:
every case result and hint, the names the gradebook shows, and which exercises are identical to
the published solutions) and builds DIR/class_report.html from every such file (`write`), so
the page can be rebuilt from the folder alone: after `batch --only` regrades a student, and
after `merge` joins the shards' folders.

The page: the score distribution (a histogram), per-exercise mean scores and pass rates (a bar
chart and a table), per-case pass rates (each exercise's cases, the hardest first), the hints
most students got (with counts and up to three example students), the students (totals as in
the CSV, each with a link to their feedback page), and flags for the instructor: exercise code
identical to the published solution's (`identical_to_solutions`; a flag to look at, never a
change of score) and grading that could not finish. Every score it shows comes from
`gradebook.rows`, the CSV's own rows. Plots are matplotlib PNGs embedded as data URIs (no
network); every text is escaped for HTML and through `untrusted_text.printable`.
"""
from __future__ import annotations

import base64
import io
import json
import statistics
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote

from . import atomic
from ..runtime.device_check import DEVICE_CHECKS
from ..shared.contract import CHAPTERS
from ..grading.results import SubmissionResult
from .untrusted_text import printable
from . import flags as instructor_flags
from . import gradebook, similarity
from .html import CSS, _e
from .text import META_NOTE, plural

FORMAT = "attention-autograder-student/1"
SAVED = "grading.json"       # DIR/<student>/grading.json
PAGE = "class_report.html"   # DIR/class_report.html
TOP_HINTS = 20


# ----------------------------------------------------------------------------- identical code
compared = similarity.compared


def identical_to_solutions(todo) -> list[list[str]]:
    """[chapter, exercise] for each exercise whose code in the student's notebooks (`todo`:
    (chapter id, notebook) pairs, as `Grader.plan` or `Grader.graded_sources` gives them: a
    notebook's path, its `ParsedSubmission` or None) equals the published
    solution's once comments, docstrings, formatting and the names of local variables are set
    aside (`similarity.normalised`). Reads the notebooks as data (never runs them); a notebook
    it cannot read flags nothing."""
    from ..source.submission import parsed

    out = []
    for chapter, notebook in todo:
        if notebook is None:
            continue
        try:
            solution = similarity.solution_dumps(chapter)
            defs = similarity.definitions(parsed(notebook))
        except Exception:  # (an unreadable notebook: its grading says why)
            continue
        for ex in CHAPTERS[chapter].exercises:
            if compared(ex) and solution.get(ex.name) is not None \
                    and similarity.dump(similarity.exercise_node(defs, ex)) == solution[ex.name]:
                out.append([chapter, ex.name])
    return out


# ----------------------------------------------------------------------------- saved results
IMPORT_KEYS = ("lms", "id_kind", "lms_id", "email", "notes")  # of students.csv, for the exports


def run_of(seed: int, devices) -> dict:
    """What a student's grading.json records of how they were graded, for `batch --only` to
    compare: the devices, and the seed's digest (not the seed: it decides the hidden inputs)."""
    import hashlib

    digest = hashlib.sha256(f"attention-autograder-seed\0{seed}".encode()).hexdigest()[:16]
    return {"seed_sha256": digest, "devices": list(devices)}


def other_runs(out_dir, run: dict, students) -> list[str]:
    """The students saved in DIR (other than `students`) graded otherwise than `run` says (another
    seed or other devices); those saved before the record was kept are taken as they are."""
    differ = []
    for path in sorted(Path(out_dir).glob(f"*/{SAVED}")) if Path(out_dir).is_dir() else ():
        if path.parent.name in students:
            continue
        try:
            saved = json.loads(path.read_text(encoding="utf-8")).get("run")
        except (OSError, ValueError, AttributeError):
            continue  # (the report says so when it is rebuilt)
        if isinstance(saved, dict) and saved != run:
            differ.append(path.parent.name)
    return differ


def save(out_dir, student: str, result: SubmissionResult, class_dir=None, identical=(), code=None,
         run: dict | None = None) -> Path:
    """DIR/<student>/grading.json: what the class report and `export` need of one student:
    the result, the names and LMS ids `import` recorded, the flags, `code` (exercise ->
    normalised token stream, `similarity.fingerprints`) for comparing students, and `run`
    (`run_of`: how they were graded)."""
    name, lms_id = gradebook._students(class_dir).get(student, (student, student))
    imported = gradebook.imported(class_dir).get(student) or {}
    if code is None:  # (the notebooks graded, read again as data)
        code = similarity.fingerprints([(ch.chapter, ch.notebook) for ch in result.chapters])
    plain = result.to_plain()
    for ch in plain["chapters"]:
        for t in ch["tests"]:
            for c in t["cases"]:
                c["figure"] = None  # (the feedback page has them; the class report does not)
    data = {"format": FORMAT, "student": student, "name": name, "id": lms_id,
            "class": Path(class_dir).name if class_dir else "", "identical_to_solutions": [list(x) for x in identical],
            "import": {k: imported.get(k) or "" for k in IMPORT_KEYS}, "code": code or {}, "result": plain}
    if run is not None:
        data["run"] = run
    path = Path(out_dir) / student / SAVED
    atomic.write_text(path, json.dumps(data))  # (whole or not at all)
    return path


def load(out_dir) -> tuple[dict, list[str]]:
    """student -> saved data (with "result" a SubmissionResult) for every DIR/<student>/grading.json,
    and a note for each that could not be read."""
    students, problems = {}, []
    for folder in sorted(p for p in Path(out_dir).iterdir() if p.is_dir()):
        path = folder / SAVED
        if not path.is_file():
            if (folder / "feedback.html").is_file() or (folder / "results.json").is_file():
                problems.append(f"{folder.name}: no {SAVED} (a regrade that was stopped or ran out of disk "
                                "before it, or an older grader); this student is left out (grade them again)")
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} file")
            data["result"] = SubmissionResult.from_plain(data["result"])
            students[folder.name] = data
        except Exception as e:
            problems.append(f"{folder.name}/{SAVED}: could not be read ({type(e).__name__}: {e}); "
                            "this student is left out (grade them again)")
    return students, problems


# ----------------------------------------------------------------------------- statistics
def _float(cell: str) -> float | None:
    return float(cell) if cell not in ("", None) else None


def statistics_of(students: dict) -> dict:
    """Every figure of the report, from the saved students (`load`)."""
    results = {s: d["result"] for s, d in students.items()}
    names = {s: (d.get("name") or s, d.get("id") or s) for s, d in students.items()}
    imports = {s: d.get("import") or {} for s, d in students.items()}
    table = gradebook.rows(results, names=names, imports=imports)
    header, possible, body = table[0], table[1], table[2:]
    col = {h: i for i, h in enumerate(header)}
    by_id = {gradebook.cell(names[s][1]): s for s in students}  # (the CSV's own cell)
    total_max = sum(float(possible[col[c]]) for c in header if c in CHAPTERS)
    totals = [_float(r[col["Total"]]) for r in body if r[col["Status"]] == "ok" and r[col["Total"]] != ""]
    per_case, top = _case_and_hint_statistics(results)
    return {"header": header, "possible": possible, "rows": body, "by_id": by_id, "col": col,
            "totals": totals, "total_max": total_max, "exercises": _exercise_statistics(header, possible, body, col),
            "cases": per_case,
            "hints": [{"chapter": c, "exercise": e, "hint": h, "students": [names[s][0] for s in v["students"]],
                       "count": len(v["students"]), "cases": v["cases"]} for (c, e, h), v in top],
            "flags": _flags(students, results, imports, body, col, by_id),
            "similar": _similar(students, body, col, by_id),
            "meta": any(t.device in DEVICE_CHECKS for r in results.values() for ch in r.chapters
                        for t in ch.tests)}


def _exercise_statistics(header: list, possible: list, body: list, col: dict) -> list[dict]:
    """Per exercise column of the gradebook: its mean, how many students scored full marks."""
    exercises = []
    for c in (h for h in header if ": " in h):
        chapter, exercise = c.split(": ", 1)
        most = float(possible[col[c]])
        values = [v for v in (_float(r[col[c]]) for r in body) if v is not None]
        exercises.append({"chapter": chapter, "exercise": exercise, "column": c, "max": most, "n": len(values),
                          "mean": statistics.fmean(values) if values else None,
                          "full": sum(v >= most - 1e-9 for v in values),
                          "pass_rate": sum(v >= most - 1e-9 for v in values) / len(values) if values else None})
    return exercises


def _case_and_hint_statistics(results: dict) -> tuple[dict, list]:
    """(chapter, exercise) -> its cases' pass rates, hardest first; and the TOP_HINTS hints
    given to the most students, as ((chapter, exercise, hint), {"students", "cases"})."""
    cases: dict = defaultdict(lambda: [0, 0, 0])  # (chapter, exercise, device, case) -> [passed, run, order]
    hints: dict = defaultdict(lambda: {"students": [], "cases": 0})
    for s, r in sorted(results.items()):
        if r.error:
            continue
        for ch in r.chapters:
            for t in ch.tests:
                for c in t.cases:
                    entry = cases[(ch.chapter, t.exercise, t.device, c.case)]
                    entry[0] += c.passed
                    entry[1] += 1
                    entry[2] = entry[2] or len(cases)
                for hint, count in t.hints():
                    h = hints[(ch.chapter, t.exercise, hint)]
                    if s not in h["students"]:
                        h["students"].append(s)
                    h["cases"] += count
    per_case = defaultdict(list)
    for (chapter, exercise, device, case), (passed, run, order) in cases.items():
        per_case[(chapter, exercise)].append({"device": device, "case": case, "passed": passed, "run": run,
                                              "rate": passed / run, "order": order})
    for rows in per_case.values():
        rows.sort(key=lambda x: (x["rate"], x["order"]))
    top = sorted(hints.items(), key=lambda kv: (-len(kv[1]["students"]), -kv[1]["cases"], kv[0]))[:TOP_HINTS]
    return dict(per_case), top


def _flags(students: dict, results: dict, imports: dict, body: list, col: dict, by_id: dict) -> list[dict]:
    """What the instructor should look at, per student in gradebook order: a copy of the
    solution, grading that could not finish, import notes, flags of the run."""
    flags = []
    for row in body:
        s = by_id.get(row[col["ID"]])
        if s is None:
            continue
        same = students[s].get("identical_to_solutions") or []
        if same:
            flags.append({"student": s, "name": row[0], "what": "identical to the published solution",
                          "detail": ", ".join(f"{c}: {e}" for c, e in same)})
        if row[col["Status"]] == "error":
            flags.append({"student": s, "name": row[0], "what": "grading could not finish",
                          "detail": results[s].error or ""})
        for ch in results[s].chapters:  # (a corrupt upload: the student may hand it in again)
            if ch.not_graded:
                flags.append({"student": s, "name": row[0], "what": "notebook not read",
                              "detail": f"{ch.chapter}: {ch.not_graded}"})
        for note in instructor_flags.import_notes(imports[s]):
            what, _, detail = note.partition(": ") if note.startswith(("LATE: ", "not placed: ")) \
                else note.partition(" ") if note.startswith("unpacked ") else ("import", "", note)
            flags.append({"student": s, "name": row[0], "what": what, "detail": detail})
        for what, detail in instructor_flags.run_flags(results[s]):
            flags.append({"student": s, "name": row[0], "what": what, "detail": detail})
    return flags


def _similar(students: dict, body: list, col: dict, by_id: dict) -> list[dict]:
    """The pairs of students whose code is alike (`similarity.pairs`), with their names."""
    row_of = {by_id.get(r[col["ID"]]): r for r in body}
    return [{"names": [row_of[a][0] if a in row_of else a, row_of[b][0] if b in row_of else b],
             "students": [a, b], "exercises": [[c, round(v, 3)] for c, v in p["exercises"]]}
            for p in similarity.pairs({s: d.get("code") or {} for s, d in students.items()})
            for a, b in [p["students"]]]


# ----------------------------------------------------------------------------- plots
def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def score_histogram(totals: list[float], most: float) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    bins = [most * i / 10 for i in range(11)] if most > 0 else 10
    ax.hist(totals, bins=bins, color="#4c72b0", edgecolor="white")
    ax.set_xlabel(f"total score (out of {gradebook._number(most)})")
    ax.set_ylabel("students")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"Score distribution ({plural(len(totals), 'student')})")
    fig.tight_layout()
    return _png(fig)


def pass_rate_bars(exercises: list[dict]) -> str:
    plt = _pyplot()
    shown = [e for e in exercises if e["pass_rate"] is not None]
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.28 * max(1, len(shown))))
    labels = [f"{e['chapter'][:2]}: {e['exercise']}" for e in shown]
    rates = [100 * e["pass_rate"] for e in shown]
    ax.barh(range(len(shown)), rates, color=["#1a7f37" if r >= 75 else "#9a6700" if r >= 40 else "#cf222e"
                                             for r in rates])
    ax.set_yticks(range(len(shown)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("students with full marks (%)")
    ax.set_title("Pass rate per exercise")
    fig.tight_layout()
    return _png(fig)


# ----------------------------------------------------------------------------- the page
def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def render(students: dict, problems: list[str] = ()) -> str:
    """The class report as one HTML page: summary, score distribution, exercises, hardest cases,
    hints, flags, similar code and the students' list, from the saved students (`load`)."""
    st = statistics_of(students)
    parts = _summary_html(students, st, problems)
    for section in (_distribution_html, _exercises_html, _cases_html, _hints_html, _flags_html, _similar_html,
                    _students_html):
        parts += section(st)
    return printable("\n".join(parts))


def _summary_html(students: dict, st: dict, problems) -> list[str]:
    """The page's head, title and summary line (totals, errors, chapters), with notes."""
    e, col = _e, st["col"]
    classes = sorted({d.get("class") for d in students.values() if d.get("class")})
    title = "Class report" + (f": {', '.join(classes)}" if classes else "")
    totals, most = st["totals"], st["total_max"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
             f"<style>{CSS}.num{{text-align:right}}</style></head><body>", f"<h1>{e(title)}</h1>"]
    n_error = sum(r[col["Status"]] == "error" for r in st["rows"])
    summary = f"{plural(len(st['rows']), 'student')}, out of {e(gradebook._number(most))} points"
    if totals:
        summary += (f": mean <span id='mean-total'>{statistics.fmean(totals):.2f}</span>, median "
                    f"{statistics.median(totals):.2f}, lowest {e(gradebook._number(min(totals)))}, highest "
                    f"{e(gradebook._number(max(totals)))}")
    if n_error:
        summary += f" ({plural(n_error, 'student')} whose grading could not finish left out)"
    parts.append(f"<p>{summary}. Scores are those of the grades CSV; chapters: "
                 f"{e(', '.join(h for h in st['header'] if h in CHAPTERS))}.</p>")
    if st["meta"]:
        parts.append(f"<p class='note'>{e(META_NOTE)}</p>")
    parts += [f"<p class='note'>{e(p)}</p>" for p in problems]
    return parts


def _distribution_html(st: dict) -> list[str]:
    """The histogram of the totals."""
    e = _e
    totals, most = st["totals"], st["total_max"]
    parts = ["<h2>Score distribution</h2>"]
    if totals:
        parts.append(f"<img id='histogram' alt='Histogram of the totals of {plural(len(totals), 'student')}, "
                     f"out of {e(gradebook._number(most))} points' src='{score_histogram(totals, most)}'>")
    return parts


def _exercises_html(st: dict) -> list[str]:
    """Per exercise: mean score, full marks and pass rate, as a chart and a table."""
    e = _e
    parts = ["<h2>Exercises</h2>"]
    if any(x["pass_rate"] is not None for x in st["exercises"]):
        parts.append("<img id='pass-rates' alt='Bar chart: share of students with full marks on each exercise' "
                     f"src='{pass_rate_bars(st['exercises'])}'>")
    parts.append("<table id='exercises'><tr><th>chapter</th><th>exercise</th><th class='num'>mean score</th>"
                 "<th class='num'>out of</th><th class='num'>full marks</th><th class='num'>pass rate</th></tr>")
    for x in st["exercises"]:
        mean = "" if x["mean"] is None else f"{x['mean']:.2f}"
        parts.append(f"<tr><td>{e(x['chapter'])}</td><td>{e(x['exercise'])}</td><td class='num'>{mean}</td>"
                     f"<td class='num'>{e(gradebook._number(x['max']))}</td><td class='num'>{x['full']} of {x['n']}</td>"
                     f"<td class='num'>{_pct(x['pass_rate'])}</td></tr>")
    parts.append("</table><p class='note'>Pass rate: the share of the students graded on the exercise who got "
                 "full marks (a chapter not handed in is left out, as its cells are blank in the CSV).</p>")
    return parts


def _cases_html(st: dict) -> list[str]:
    """Per exercise, its cases' pass rates, the hardest first."""
    e = _e
    parts = ["<h2>Cases, the hardest first</h2>"]
    for x in st["exercises"]:
        rows = st["cases"].get((x["chapter"], x["exercise"]))
        if not rows:
            continue
        hardest = rows[0]
        parts.append(f"<details><summary>{e(x['chapter'])}: {e(x['exercise'])} (hardest: {_pct(hardest['rate'])} "
                     f"passed {e(hardest['case'])} [{e(hardest['device'])}])</summary><table>"
                     "<tr><th>case</th><th>device</th><th class='num'>passed</th><th class='num'>rate</th></tr>")
        parts += [f"<tr><td>{e(c['case'])}</td><td>{e(c['device'])}</td><td class='num'>{c['passed']} of "
                  f"{c['run']}</td><td class='num'>{_pct(c['rate'])}</td></tr>" for c in rows]
        parts.append("</table></details>")
    return parts


def _hints_html(st: dict) -> list[str]:
    """The hints given to the most students."""
    e = _e
    parts = ["<h2>Most frequent hints</h2>"]
    if st["hints"]:
        parts.append("<table id='hints'><tr><th class='num'>students</th><th class='num'>failing cases</th>"
                     "<th>exercise</th><th>hint</th><th>for example</th></tr>")
        for h in st["hints"]:
            parts.append(f"<tr><td class='num'>{h['count']}</td><td class='num'>{h['cases']}</td>"
                         f"<td>{e(h['chapter'])}: {e(h['exercise'])}</td><td><span class='hint'>{e(h['hint'])}</span>"
                         f"</td><td>{e(', '.join(h['students'][:3]))}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p>No hints were given.</p>")
    return parts


def _flags_html(st: dict) -> list[str]:
    """What the instructor should look at (no score changes)."""
    e = _e
    parts = ["<h2>Flags for the instructor</h2>"]
    if st["flags"]:
        parts.append("<table id='flags'><tr><th>student</th><th>flag</th><th>where</th></tr>")
        parts += [f"<tr><td>{e(f['name'])}</td><td>{e(f['what'])}</td><td>{e(f['detail'])}</td></tr>"
                  for f in st["flags"]]
        parts.append("</table>")
    else:
        parts.append("<p>None.</p>")
    parts.append("<p class='note'>Identical to the published solution: the exercise's code equals the "
                 "solution notebook's once comments, docstrings, formatting and the names of local variables "
                 "are set aside (written answers and find-the-bug fixes are not compared). LATE, files not "
                 "placed and unpacked zips come from the import; forbidden-API uses and timeouts from the "
                 "grading. Flags to look at; they change no score.</p>")
    return parts


def _similar_html(st: dict) -> list[str]:
    """Pairs of students with similar code (no score changes)."""
    e = _e
    parts = ["<h2>Similar code between students</h2>"]
    if st["similar"]:
        parts.append("<table id='similar'><tr><th>students</th><th class='num'>exercises</th><th>where "
                     "(similarity)</th></tr>")
        for p in st["similar"]:
            where = ", ".join(f"{c} ({100 * v:.0f}%)" for c, v in p["exercises"])
            parts.append(f"<tr><td>{e(p['names'][0])} and {e(p['names'][1])}</td><td class='num'>"
                         f"{len(p['exercises'])}</td><td>{e(where)}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p>No pair.</p>")
    parts.append(f"<p class='note'>Each exercise's code of every two students, compared once local names, "
                 f"comments, docstrings and formatting are set aside (the Jaccard index of their token "
                 f"{similarity.SHINGLE}-grams); pairs at {100 * similarity.THRESHOLD:.0f}% or more are listed. Code "
                 f"shorter than {similarity.MIN_TOKENS} tokens and the released stubs are not compared. A list to "
                 "look at; it changes no score.</p>")
    return parts


def _students_html(st: dict) -> list[str]:
    """Every student's total, status and feedback link; the last section (it closes the page)."""
    e = _e
    col = st["col"]
    parts = ["<h2>Students</h2><table id='students'><tr><th>student</th><th>ID</th>"
             "<th class='num'>total</th><th>status</th><th>feedback</th></tr>"]
    for r in st["rows"]:
        s = st["by_id"].get(r[col["ID"]], r[col["ID"]])
        link = f"<a href='{e(quote(s))}/feedback.html'>feedback</a>"
        parts.append(f"<tr><td>{e(r[0])}</td><td>{e(r[1])}</td><td class='num total'>{e(r[col['Total']])}</td>"
                     f"<td>{e(r[col['Status']])}</td><td>{link}</td></tr>")
    parts.append("</table></body></html>")
    return parts


def write(out_dir) -> Path:
    """DIR/class_report.html from every DIR/<student>/grading.json."""
    students, problems = load(out_dir)
    path = Path(out_dir) / PAGE
    atomic.write_text(path, render(students, problems))
    return path

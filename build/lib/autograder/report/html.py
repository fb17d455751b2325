"""A self-contained HTML feedback page per submission (no external resources).

Where submitted attention weights differ from the expected ones, a figure shows both side by
side (matplotlib, embedded as a PNG data URI). Every text in it is escaped twice over: for HTML,
and through `untrusted_text.printable` (student text may hold control characters).
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from ..runtime.device_check import DEVICE_CHECKS
from ..grading.results import SubmissionResult
from .untrusted_text import printable
from .text import META_NOTE, plural, uses_meta

CSS = """
body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;width:100%}td,th{padding:.3em .5em;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
.ok{color:#1a7f37}.bad{color:#cf222e}.part{color:#9a6700}.hint{background:#fff8c5;padding:.2em .4em;border-radius:3px}
pre{white-space:pre-wrap;background:#f6f8fa;padding:.5em;border-radius:4px;margin:.3em 0}
.note{color:#57606a}img{max-width:100%}
"""


def _figure_png(fig_data: dict, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(7, 3.2))
    for ax, key in zip(axes, ("expected", "submitted")):
        im = ax.imshow(fig_data[key], cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"{key} weights")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _e(text) -> str:
    return html.escape(printable(str(text)))


def render(result: SubmissionResult) -> str:
    e = _e
    name = Path(result.path).name  # (never the grader's absolute path)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Feedback: {e(name)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>Feedback for {e(name)}</h1>",
             f"<p><b>Total: {result.score:.2f} / {result.max_score:.2f}</b> "
             f"<span class='note'>(graded in {result.seconds:.1f} s{', sandbox: ' + e(result.sandbox) if result.sandbox else ''})</span></p>"]
    if uses_meta(result):
        parts.append(f"<p class='note' id='meta'>{e(META_NOTE)}</p>")
    parts += [f"<p class='note'>{e(n)}</p>" for n in result.notes]
    for ch in result.chapters:
        parts.append(f"<h2>{e(ch.chapter)}: {ch.score:.2f} / {ch.max_score:.2f}</h2>")
        parts += [f"<p class='note'>{e(n)}</p>" for n in ch.notes if not n.startswith("sandbox:")]
        parts.append("<table><tr><th>exercise</th><th>device</th><th>score</th><th>details</th></tr>")
        for t in ch.tests:
            cls = "ok" if t.score >= t.max_score - 1e-9 else ("bad" if t.score == 0 else "part")
            details = []
            if t.note:
                details.append(f"<div>{e(t.note)}</div>")
            f = t.first_failure
            if f and not t.note:
                details.append(f"<div>{t.passed} of {plural(len(t.cases), 'case')} passed. First failure: "
                               f"<i>{e(f.case)}</i></div><pre>{e(f.message)}</pre>")
                details += [f"<div><span class='hint'>{e(h)}</span></div>" for h in t.hint_lines()]
                if f.figure:
                    src = _figure_png(f.figure, printable(f"{t.exercise}: {f.case}"))
                    details.append(f"<img alt='expected vs submitted attention weights' src='{src}'>")
            elif not t.note:
                details.append("1 case passed" if len(t.cases) == 1 else f"all {len(t.cases)} cases passed")
            for note in sorted({c.note for c in t.cases if c.passed and c.note}):
                details.append(f"<div class='note'>note: {e(note)}</div>")
            device = f"<a href='#meta'>{e(t.device)}</a>" if t.device in DEVICE_CHECKS else e(t.device)
            parts.append(f"<tr><td>{e(t.exercise)}</td><td>{device}</td>"
                         f"<td class='{cls}'>{t.score:.2f} / {t.max_score:.2f}</td><td>{''.join(details)}</td></tr>")
        parts.append("</table>")
        if ch.output:
            parts.append(f"<details><summary>Output of the notebook</summary><pre>{e(ch.output)}</pre></details>")
    parts.append("</body></html>")
    return printable("\n".join(parts))


def write(result: SubmissionResult, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(render(result), encoding="utf-8")

"""Sphinx glue for the course book (loaded from _config.yml: sphinx.local_extensions).

Five small jobs:

1. The solutions switch. ``course_publish_solutions`` (a Sphinx config value, set in
   _config.yml, default True) decides whether ``solutions/*.ipynb`` are pages of the site.
   The environment variable ``COURSE_PUBLISH_SOLUTIONS`` (1/0, true/false, on/off, yes/no)
   overrides it, so a graded deployment builds from the same _config.yml and _toc.yml:

       COURSE_PUBLISH_SOLUTIONS=0 jupyter-book build --all -W .

   When off, the solution notebooks are dropped from the table of contents (the site map that
   sphinx-external-toc read from _toc.yml) and excluded from the Sphinx sources, so they are
   neither executed, rendered, searchable nor downloadable, and the build stays warning-free.

2. Page titles from _toc.yml. An entry's ``title:`` in _toc.yml names the page in the navigation
   only; the exercise and solution notebooks of a chapter share their first heading, so search
   results, browser tabs and previous/next links could not tell them apart. Where _toc.yml gives
   a title, it becomes the page's title everywhere (the heading inside the page is unchanged).

3. No tracebacks on the pages. The exercise pages run the stubs, so their check cells (tagged
   ``raises-exception``) fail, and a stub called at the top level of a cell raises
   ``NotImplementedError``. The reader gets a short line instead of a traceback with the build
   machine's paths: the self-check's own diagnosis (``SelfCheckFailed`` renders itself as its
   message in IPython) or "not implemented yet".

4. "Try it first": every reference-solution page opens with a note that sends the reader to
   the exercise first (added here, so the solution notebooks stay code and exercise text only).

5. A notebook download on every notebook page. sphinx-book-theme offers ".ipynb" in its
   download menu only for .ipynb sources (or when Binder/Thebe launch buttons are configured,
   which this offline book does not do). For the MyST Markdown notebooks in book/ we copy the
   notebook that MyST-NB executed (``_build/jupyter_execute/<page>.ipynb``) next to the page
   sources and tell the theme about it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging

logger = logging.getLogger(__name__)

ENV_VAR = "COURSE_PUBLISH_SOLUTIONS"
SOLUTIONS_DIR = "solutions"
_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


def publish_solutions(config: Config) -> bool:
    """The effective switch: the environment variable when set, else the config value."""
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if raw:
        raise ValueError(f"{ENV_VAR}={raw!r}: use one of {sorted(_TRUE | _FALSE)}")
    return bool(config.course_publish_solutions)


def _is_solution(docname: str) -> bool:
    return docname == SOLUTIONS_DIR or docname.startswith(SOLUTIONS_DIR + "/")


def apply_solutions_switch(app: Sphinx, config: Config) -> None:
    """Runs after sphinx-external-toc has parsed _toc.yml (priority 900)."""
    publish = publish_solutions(config)
    config.course_publish_solutions = publish
    if publish:
        logger.info("[course] reference solutions are published")
        return
    logger.info("[course] reference solutions are NOT published (graded deployment)")
    site_map = getattr(config, "external_site_map", None)
    if site_map is not None:
        for docname in list(site_map):
            if _is_solution(docname):
                del site_map[docname]
        for docname in list(site_map):
            doc = site_map[docname]
            kept = []
            for tree in doc.subtrees:
                # FileItem and GlobItem are str subclasses; UrlItem is not a document.
                tree.items = [i for i in tree.items if not (isinstance(i, str) and _is_solution(i))]
                if tree.items:
                    kept.append(tree)
            doc.subtrees = kept
    config["exclude_patterns"] = list(config["exclude_patterns"]) + [SOLUTIONS_DIR, f"{SOLUTIONS_DIR}/**"]


def apply_toc_titles(app: Sphinx, doctree) -> None:
    """Give a page the title its _toc.yml entry names (runs after Sphinx's title collector)."""
    site_map = getattr(app.env, "external_site_map", None) or getattr(app.config, "external_site_map", None)
    docname = app.env.docname
    if site_map is None or docname not in site_map:
        return
    title = site_map[docname].title
    if title:
        app.env.titles[docname] = nodes.title(title, title)
        app.env.longtitles[docname] = nodes.title(title, title)


NOT_IMPLEMENTED = "✗ not implemented yet (the stub raises NotImplementedError)."
_TRACEBACK_MARKERS = ("Traceback (most recent call last)", "-" * 20, 'File "', "Cell In[")


def short_error(traceback: str) -> str:
    """What the reader sees of a cell's error output: the diagnosis, never a traceback."""
    lines = [line.rstrip() for line in traceback.splitlines() if line.strip()]
    if not lines:
        return NOT_IMPLEMENTED
    if any(marker in line for line in lines for marker in _TRACEBACK_MARKERS):
        lines = lines[-1:]  # a full traceback: its last line names the exception
    text = "\n".join(lines)
    if text.startswith("NotImplementedError"):
        return NOT_IMPLEMENTED
    for prefix in ("SelfCheckFailed: ", "autograder.selfcheck.SelfCheckFailed: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def shorten_tracebacks(app: Sphinx, doctree) -> None:
    """Replace every rendered error output (myst-nb: a literal block with the class 'traceback')
    by a short block without the traceback."""
    for node in list(doctree.findall(nodes.literal_block)):
        if "traceback" not in node.get("classes", []):
            continue
        text = short_error(node.astext())
        block = nodes.literal_block(text, text, language="none")
        block["classes"] += ["output", "course-error"]
        box = nodes.container(classes=["course-not-implemented"])
        box += block
        node.parent.replace(node, box)  # (replace_self would copy the old node's classes)


def add_try_it_first(app: Sphinx, doctree) -> None:
    """Open every solution page with a note: attempt the exercise before reading the solution."""
    docname = app.env.docname
    if not _is_solution(docname):
        return
    sections = list(doctree.findall(nodes.section))
    if not sections:
        return
    exercise = "../exercises/" + docname.split("/", 1)[1] + ".html"
    note = nodes.admonition(classes=["tip", "course-try-it-first"])
    note += nodes.title("", "Try it first")
    para = nodes.paragraph()
    para += nodes.Text("These are the reference solutions. You will learn much more by writing the code "
                       "yourself first: open ")
    para += nodes.reference("", "the exercise notebook", refuri=exercise, internal=True)
    para += nodes.Text(", let the self-check cells and the autograder's hints guide you, and come back "
                       "here to compare once your code passes, or when you are stuck after a real attempt.")
    note += para
    sections[0].insert(1, note)


def add_notebook_download(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Offer the executed .ipynb of a MyST Markdown notebook page in the theme's download menu.

    Connected with the default priority (500), i.e. before the theme builds its header buttons
    (priority 501).
    """
    if app.builder is None or app.builder.format != "html" or doctree is None:
        return
    metadata = app.env.metadata.get(pagename, {})
    source = context.get("sourcename") or ""
    if "kernelspec" not in metadata or not source.endswith(".md"):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.is_file():
        logger.warning(f"[course] no executed notebook for {pagename}: {executed}")
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def setup(app: Sphinx) -> dict:
    app.add_config_value("course_publish_solutions", True, "env", [bool])
    app.connect("config-inited", apply_solutions_switch, priority=950)
    app.connect("doctree-read", apply_toc_titles, priority=900)
    app.connect("doctree-read", shorten_tracebacks)
    app.connect("doctree-read", add_try_it_first)
    app.connect("html-page-context", add_notebook_download)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

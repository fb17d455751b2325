"""The course website, built and opened in a real browser.

The book is built once per session with ``jupyter-book build --all -W .`` (zero warnings,
notebooks executed) unless ``_build/html`` is newer than every source; then it is served from
127.0.0.1 and every page is visited in Debian's Chromium through Playwright, with no network:

- every page loads with no failed request, no HTTP error, no console error and no request to
  any host but 127.0.0.1;
- every formula is typeset by the bundled MathJax (an ``mjx-container`` in every math element,
  no MathJax error, no raw ``$$``, ``\\(`` or ``\\[`` left in the visible text);
- every image loads with a non-zero size;
- every page reads right at a 1400 px wide window (``test_page_reads_right``): no display
  formula in a box that clips it vertically without room above and below, no backslash typeset
  as a character in math (a TeX escape inside a text box), no traceback shown to the reader, every raster
  figure drawn with at least 1.5 pixels per shown pixel, no code block wider than the column;
- the "next" links from the first page reach every chapter, in order, and search finds pages;
- a screenshot of each page is saved under ``_build/screenshots/``.

Without a browser it also checks every internal link and anchor of the built HTML, the
notebook downloads, and that the graded build (``COURSE_PUBLISH_SOLUTIONS=0``) is warning-free
and leaves the solutions out.

Environment:
    COURSE_SITE_HTML: test this already built site instead of building ``_build/html``.
    COURSE_CHROMIUM: the browser executable (default /usr/bin/chromium).
    COURSE_REQUIRE_BROWSER=1: fail instead of skipping when no browser is available.
"""
from __future__ import annotations

import functools
import html.parser
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "_build"
CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
BUILD_TIMEOUT = 900  # seconds; a clean build takes a few minutes on two cores
CHAPTERS = [
    "book/01_intuition",
    "book/02_scaled_dot_product_attention",
    "book/03_multi_head_attention",
    "book/04_positional_encoding",
    "book/05_masks",
    "book/06_gated_global_attention",
    "book/07_efficient_attention",
    "book/08_transformer",
]


# --------------------------------------------------------------------------------------------
# What the site should contain (known before it is built, so tests can be parametrized)

def toc_docnames(toc_path: Path = REPO / "_toc.yml") -> list[str]:
    """Every document of _toc.yml, in navigation order."""
    toc = yaml.safe_load(toc_path.read_text(encoding="utf8"))
    names = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                names.append(str(Path(entry["file"]).with_suffix("")) if entry["file"].endswith((".md", ".ipynb"))
                             else entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return names


DOCNAMES = toc_docnames()
PAGES = DOCNAMES + ["search", "genindex"]


# --------------------------------------------------------------------------------------------
# Building

SOURCE_GLOBS = ["_config.yml", "_toc.yml", "book/**/*", "exercises/*.ipynb", "solutions/*.ipynb",
                "autograder/**/*.py"]


def newest_source_mtime() -> float:
    newest = 0.0
    for pattern in SOURCE_GLOBS:
        for path in REPO.glob(pattern):
            if path.is_file() and "__pycache__" not in path.parts:
                newest = max(newest, path.stat().st_mtime)
    return newest


def build_book(source: Path, output: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`jupyter-book build --all -W` of `source` (into `output`/_build when given)."""
    cmd = [shutil.which("jupyter-book") or "jupyter-book", "build", "--all", "-W", "--keep-going"]
    if output is not None:
        cmd += ["--path-output", str(output)]
    cmd.append(str(source))
    return subprocess.run(cmd, cwd=source, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                          env={**os.environ, **(env or {})})


# The notebook kernels share the build's stderr, and ipykernel logs there on its own account:
# a transport notice at start-up and, rarely, an event-loop error (tornado/asyncio) as a kernel
# shuts down after its notebook has run (seen once in CI, not reproducible in 3 local builds). Those
# lines are not Sphinx's: a notebook that fails to run is a Sphinx warning, which `-W` makes
# fatal and the scan below still catches.
KERNEL_LOG = re.compile(r"^\[IPKernelApp\]|^ERROR:(?:tornado\.general|asyncio):")


def assert_built(result: subprocess.CompletedProcess, what: str) -> None:
    log = result.stdout + result.stderr
    lines = log.splitlines()
    kernel_noise = [line for line in lines if KERNEL_LOG.search(line) and "Kernel is running over TCP" not in line]
    if kernel_noise:
        print(f"\n{what}: kernel log lines (not Sphinx warnings):\n" + "\n".join(kernel_noise[:10]),
              file=sys.stderr)
    warnings = [line for line in lines if re.search(r"\bWARNING\b|\bERROR\b", line)
                and not KERNEL_LOG.search(line)]
    assert result.returncode == 0, f"{what} failed (exit {result.returncode}):\n{log[-6000:]}"
    assert not warnings, f"{what} logged warnings:\n" + "\n".join(warnings[:30])


@pytest.fixture(scope="session")
def site() -> Path:
    """The built HTML of the public book (built here when missing or out of date)."""
    given = os.environ.get("COURSE_SITE_HTML")
    if given:
        path = Path(given).resolve()
        assert (path / "index.html").is_file(), f"COURSE_SITE_HTML={given} has no index.html"
        return path
    html_dir = BUILD / "html"
    index = html_dir / "index.html"
    if not index.is_file() or index.stat().st_mtime < newest_source_mtime():
        env = {"COURSE_PUBLISH_SOLUTIONS": "1"}
        start = time.monotonic()
        result = build_book(REPO, env=env)
        seconds = time.monotonic() - start
        assert_built(result, "jupyter-book build --all -W .")
        print(f"\nbuilt the book in {seconds:.0f} s", file=sys.stderr)
    return html_dir


# --------------------------------------------------------------------------------------------
# Internal links (no browser, no network)

class _LinkParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str]] = []  # (tag, url)
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key) and not (tag == "link" and attrs.get("rel") in ("canonical",)):
                self.links.append((tag, attrs[key]))


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> _LinkParser:
    parser = _LinkParser()
    parser.feed(path.read_text(encoding="utf8", errors="replace"))
    return parser


def html_files(root: Path) -> list[Path]:
    skip = {"_static", "_sources", "_images", "_downloads", "reports"}
    return sorted(p for p in root.rglob("*.html") if not skip & set(p.relative_to(root).parts))


def broken_links(root: Path) -> list[str]:
    problems = []
    for page in html_files(root):
        for tag, url in _parse(page).links:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc:  # external (http, mailto, data, javascript): not checked here
                continue
            if parts.path:
                target = (page.parent / unquote(parts.path)).resolve()
                if target.is_dir():
                    target = target / "index.html"
                if not target.is_file():
                    problems.append(f"{page.relative_to(root)}: <{tag}> {url} -> missing file")
                    continue
            else:
                target = page
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html" and fragment not in _parse(target).ids:
                problems.append(f"{page.relative_to(root)}: <{tag}> {url} -> no id {fragment!r}")
    return problems


def test_every_toc_page_was_built(site):
    missing = [d for d in PAGES if not (site / f"{d}.html").is_file()]
    assert not missing, f"pages in _toc.yml with no HTML: {missing}"


def test_internal_links_and_anchors_resolve(site):
    problems = broken_links(site)
    assert not problems, f"{len(problems)} broken internal links:\n" + "\n".join(problems[:50])


def test_no_page_references_another_host(site):
    """Nothing in the pages or their CSS/JS loads from the web (hyperlinks aside)."""
    loaders = re.compile(r"""<(script|link|img|iframe|source|video|audio)\b[^>]*\b(?:src|href)=["']?(https?:)?//""", re.I)
    css_urls = re.compile(r"""(?:url\(|@import)\s*["']?(?:https?:)?//""", re.I)
    offenders = [str(p.relative_to(site)) for p in html_files(site) if loaders.search(p.read_text(encoding="utf8"))]
    offenders += [str(p.relative_to(site)) for p in (site / "_static").rglob("*.css")
                  if css_urls.search(p.read_text(encoding="utf8", errors="replace"))]
    assert not offenders, f"pages or stylesheets that load from another host: {offenders}"


def notebook_pages() -> list[str]:
    """Pages made from notebooks: the chapters (MyST Markdown notebooks), the exercise-API page
    (it runs a cell), the exercise and solution notebooks."""
    return [d for d in DOCNAMES if d.startswith(("book/0", "book/exercise_api", "exercises/", "solutions/"))]


@pytest.mark.parametrize("docname", notebook_pages())
def test_notebook_page_offers_its_notebook(site, docname):
    """The theme's download menu links a notebook (.ipynb) that exists and is valid."""
    import nbformat

    page = site / f"{docname}.html"
    links = [url for tag, url in _parse(page).links if tag == "a" and urlsplit(url).path.endswith(".ipynb")
             and "/_sources/" in "/" + urlsplit(url).path]
    assert links, f"{docname}: no .ipynb download in the page's download menu"
    target = (page.parent / urlsplit(links[0]).path).resolve()
    nb = nbformat.read(target, as_version=4)
    assert nb.cells, f"{target} is an empty notebook"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_links_its_exercise_notebook(site, chapter):
    number_name = chapter.split("/", 1)[1]
    urls = [url for tag, url in _parse(site / f"{chapter}.html").links if tag == "a"]
    assert any(u.split("#")[0].endswith(f"exercises/{number_name}.html") for u in urls), \
        f"{chapter} does not link its exercise page"
    assert any(u.endswith(f"/{number_name}.ipynb") and "_downloads" in u for u in urls), \
        f"{chapter} offers no download of exercises/{number_name}.ipynb"


class _TextParser(html.parser.HTMLParser):
    """The visible text of a page (scripts and styles left out)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(path: Path) -> str:
    parser = _TextParser()
    parser.feed(path.read_text(encoding="utf8", errors="replace"))
    return " ".join(parser.parts)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_written_answer_stands_on_its_chapter_pages(site, chapter):
    """The rendered chapter page and exercise page, with every output the build printed, do not
    state the chapter's `predict_*` answers (the rule: tests/course/test_written_answers.answer_on_page)."""
    from test_written_answers import ANSWERS, _right, answer_on_page

    number_name = chapter.split("/", 1)[1]
    answers = [(ch, ex) for ch, ex in ANSWERS if ch == number_name]
    assert answers
    for ch, ex in answers:
        right = _right(ch, ex)
        for page in (site / f"{chapter}.html", site / "exercises" / f"{number_name}.html"):
            assert not answer_on_page(right, page_text(page)), (ex.name, page.name)


def test_error_outputs_are_shortened_to_the_diagnosis():
    """What the book shows of a failing cell (book/_ext/course_book.short_error): the diagnosis,
    without the traceback, the build machine's paths or the exception's class name."""
    sys.path.insert(0, str(REPO / "book" / "_ext"))
    try:
        import course_book
    finally:
        sys.path.remove(str(REPO / "book" / "_ext"))
    ipython = ("-" * 75 + "\nNotImplementedError                       Traceback (most recent call last)\n"
               "Cell In[2], line 3\n----> 3 softmax(x)\nFile /home/build/course/x.py:7, in softmax(x)\n"
               "NotImplementedError: ")
    assert course_book.short_error(ipython) == course_book.NOT_IMPLEMENTED
    check = ipython.replace("NotImplementedError: ", "SelfCheckFailed: ✗ softmax: scores look unscaled")
    assert course_book.short_error(check) == "✗ softmax: scores look unscaled"
    rendered = "✗ softmax: failed on case 'masked'\n  largest error 0.5 at (0, 1)\n  hint: invert the mask"
    assert course_book.short_error(rendered) == rendered  # SelfCheckFailed._render_traceback_: kept whole


def test_solutions_are_published_in_the_public_build(site):
    assert (site / "solutions" / "01_intuition.html").is_file()


# --------------------------------------------------------------------------------------------
# The graded deployment: same sources, solutions switched off

def test_graded_build_leaves_out_solutions(tmp_path_factory, site):
    """COURSE_PUBLISH_SOLUTIONS=0: the build is still warning-free, and no solution is published."""
    out = tmp_path_factory.mktemp("graded")
    result = build_book(REPO, output=out, env={"COURSE_PUBLISH_SOLUTIONS": "0"})
    assert_built(result, "COURSE_PUBLISH_SOLUTIONS=0 jupyter-book build --all -W .")
    html_dir = out / "_build" / "html"
    assert (html_dir / "book" / "01_intuition.html").is_file()
    assert (html_dir / "exercises" / "01_intuition.html").is_file()
    leaked = [str(p.relative_to(html_dir)) for p in html_dir.rglob("*") if "solutions" in p.relative_to(html_dir).parts]
    assert not leaked, f"solution files in the graded site: {leaked[:10]}"
    index_text = (html_dir / "searchindex.js").read_text(encoding="utf8")
    assert "solutions/" not in index_text, "the graded site's search index lists solution pages"
    for page in html_files(html_dir):
        links = [url for _, url in _parse(page).links if "solutions/" in urlsplit(url).path]
        assert not links, f"{page.relative_to(html_dir)} links solutions: {links[:5]}"
    problems = broken_links(html_dir)
    assert not problems, "broken internal links in the graded site:\n" + "\n".join(problems[:30])


# --------------------------------------------------------------------------------------------
# The browser

SERVER_ERRORS: list[str] = []  # every request the server answered with an error (the browser's own
                               # requests too, e.g. /favicon.ico, which Playwright does not report)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass

    def log_request(self, code="-", size="-"):
        if isinstance(code, int) and code >= 400 or str(code).startswith(("4", "5")):
            SERVER_ERRORS.append(f"{self.path} (HTTP {code})")


@pytest.fixture(scope="session")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


# One browser for this module, closed when it ends: Playwright's sync API runs an event loop
# while it is open, and any later test that opens it (unit/test_class_report.py, which runs
# after course/) would fail with "using Playwright Sync API inside the asyncio loop".
@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover
        if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
            raise
        pytest.skip(f"playwright is not installed: {exc}")
    if not Path(CHROMIUM).exists():
        if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"no browser at {CHROMIUM} (apt-get install -y chromium)")
        pytest.skip(f"no browser at {CHROMIUM} (apt-get install -y chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class PageVisit:
    """A browser page that records console errors, failed requests and off-machine requests."""

    def __init__(self, browser, server, width: int = 1280):
        self.server = server
        self.context = browser.new_context(viewport={"width": width, "height": 900}, service_workers="block")
        self.page = self.context.new_page()
        self.console_errors: list[str] = []
        self.failed: list[str] = []
        self.external: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text))
        self.page.on("pageerror", lambda e: self.console_errors.append(f"uncaught: {e}"))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.url} (HTTP {r.status})"))
        self.server_errors_before = len(SERVER_ERRORS)
        # Anything that is not this server (or an inline data:/blob: URL) is refused outright.
        self.context.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about") or parts.hostname == "127.0.0.1":
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def goto(self, path: str):
        response = self.page.goto(f"{self.server}/{path}", wait_until="load")
        assert response is not None and response.ok, f"{path}: HTTP {response.status if response else '?'}"
        self.page.wait_for_load_state("networkidle")
        return response

    @property
    def server_errors(self) -> list[str]:
        return SERVER_ERRORS[self.server_errors_before:]

    def close(self):
        self.context.close()


@pytest.fixture
def visit(browser, server):
    v = PageVisit(browser, server)
    yield v
    v.close()


MATH_CHECK = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const maths = Array.from(document.querySelectorAll('.math'));
  const untypeset = maths.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80));
  const errors = Array.from(document.querySelectorAll('mjx-merror, .MathJax_Error')).map(e => e.textContent.slice(0, 80));
  // Raw delimiters left in visible text, outside code and outside typeset math.
  const raw = [];
  const walker = document.createTreeWalker(document.querySelector('main') || document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const el = node.parentElement;
    if (!el || el.closest('pre, code, script, style, mjx-container, .highlight, textarea')) continue;
    if (!el.offsetParent && getComputedStyle(el).position !== 'fixed') continue;  // not rendered
    const t = node.textContent;
    if (t.includes('$$') || t.includes('\\\\(') || t.includes('\\\\[') || /\\$[^$\\s][^$]*\\\\[a-zA-Z]+[^$]*\\$/.test(t)) raw.push(t.trim().slice(0, 80));
  }
  // Display formulas wider than the text column (they scroll rather than fit).
  const wide = Array.from(document.querySelectorAll('mjx-container[display="true"]'))
    .filter(m => m.scrollWidth > m.parentElement.clientWidth + 1)
    .map(m => m.textContent.slice(0, 60));
  return {count: maths.length, containers: document.querySelectorAll('mjx-container').length,
          untypeset, errors, raw, wide, loaded: !!(window.MathJax && MathJax.version)};
}
"""

IMAGE_CHECK = """
async () => {
  const imgs = Array.from(document.images);
  for (const img of imgs) { img.loading = 'eager'; }
  await Promise.all(imgs.map(img => img.complete ? null : new Promise(r => { img.onload = img.onerror = r; })));
  return imgs.map(img => ({src: img.getAttribute('src'), w: img.naturalWidth, h: img.naturalHeight,
                           shown: img.getBoundingClientRect().width}));
}
"""


# What the reader sees at 1400 px (every page of _toc.yml, whatever chapters are added):
READ_RIGHT = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  for (const d of document.querySelectorAll('main details')) { d.open = true; }   // hidden code cells too
  const imgs = Array.from(document.images);
  for (const img of imgs) { img.loading = 'eager'; }
  await Promise.all(imgs.map(img => img.complete ? null : new Promise(r => { img.onload = img.onerror = r; })));
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const shown = el => !!(el.offsetParent || el.getClientRects().length) && getComputedStyle(el).visibility !== 'hidden';
  const px = v => parseFloat(v) || 0;

  // 1. Display formulas: every box around one that clips vertically leaves room above and below.
  const clipped = [];
  for (const m of document.querySelectorAll('mjx-container[display="true"]')) {
    const math = m.querySelector('mjx-math');
    if (!math || !shown(m)) continue;
    const r = math.getBoundingClientRect();
    const need = 0.25 * px(getComputedStyle(m).fontSize);
    for (let el = m; el && el !== document.body; el = el.parentElement) {
      const cs = getComputedStyle(el);
      if (cs.overflowY === 'visible' && cs.overflowX === 'visible') continue;
      const box = el.getBoundingClientRect();
      const top = r.top - (box.top + px(cs.borderTopWidth));
      const bottom = (box.bottom - px(cs.borderBottomWidth)) - r.bottom;
      if (top < need || bottom < need) {
        clipped.push(`${(m.textContent || '').slice(0, 50)} [${el.tagName.toLowerCase()}.${String(el.className).split(' ')[0]}: ` +
                     `room ${top.toFixed(1)} / ${bottom.toFixed(1)} px, need ${need.toFixed(1)}]`);
        break;
      }
    }
  }

  // 2. Backslashes typeset as characters (\\text{max\\_len} shows "max\\_len").
  const backslashes = Array.from(document.querySelectorAll('mjx-container'))
    .filter(m => m.querySelector('mjx-c.mjx-c5C') ||
                 Array.from(m.querySelectorAll('mjx-assistive-mml mtext')).some(t => t.textContent.includes('\\\\')))
    .map(m => (m.textContent || '').slice(0, 60));

  // 3. Tracebacks.
  const tracebackText = /Traceback \\(most recent call last\\)|Cell In\\[\\d+\\]|File "\\/|\\/site-packages\\/|^-{30,}$/m;
  const tracebacks = Array.from(article.querySelectorAll('.traceback, pre, .output'))
    .filter(el => shown(el) && (el.classList.contains('traceback') || tracebackText.test(el.textContent)))
    .map(el => el.textContent.trim().slice(0, 120));

  // 4. Raster figures drawn with fewer than 1.5 pixels per shown pixel.
  const blurry = imgs.filter(img => shown(img) && !/\\.svg(\\?|#|$)|^data:image\\/svg/i.test(img.getAttribute('src') || ''))
    .map(img => ({src: img.getAttribute('src'), natural: img.naturalWidth, shown: img.getBoundingClientRect().width}))
    .filter(i => i.shown > 0 && i.natural < 1.5 * i.shown);

  // 5. Code blocks wider than the text column.
  const col = article.getBoundingClientRect();
  const colRight = col.right - px(getComputedStyle(article).paddingRight) + 1;
  const wide = Array.from(article.querySelectorAll('pre'))
    .filter(pre => shown(pre) && (pre.scrollWidth > pre.clientWidth + 1 || pre.getBoundingClientRect().right > colRight))
    .map(pre => `${pre.textContent.split('\\n').reduce((a, b) => a.length >= b.length ? a : b, '').slice(0, 80)} ` +
                `(${pre.scrollWidth} px in ${pre.clientWidth} px)`);
  return {clipped, backslashes, tracebacks, blurry, wide};
}
"""


def _screenshot_name(docname: str) -> str:
    return docname.replace("/", "__") + ".png"


@pytest.mark.parametrize("docname", PAGES)
def test_page_renders_in_browser(visit, docname, site):
    if not (site / f"{docname}.html").is_file():
        pytest.fail(f"{docname}.html was not built")
    visit.goto(f"{docname}.html")

    math = visit.page.evaluate(MATH_CHECK)
    source = (site / f"{docname}.html").read_text(encoding="utf8")
    if 'class="math' in source:
        assert math["loaded"], f"{docname}: MathJax did not load"
        assert math["containers"] > 0, f"{docname}: no formula was typeset (no mjx-container)"
    assert not math["untypeset"], f"{docname}: formulas not typeset: {math['untypeset'][:5]}"
    assert not math["errors"], f"{docname}: MathJax errors: {math['errors'][:5]}"
    assert not math["raw"], f"{docname}: raw TeX left in the text: {math['raw'][:5]}"
    if docname.startswith("book/"):  # the book's own pages; notebooks get a scroll bar instead
        assert not math["wide"], f"{docname}: formulas wider than the text column: {math['wide']}"

    images = visit.page.evaluate(IMAGE_CHECK)
    broken = [i for i in images if not (i["w"] > 0 and i["h"] > 0)]
    assert not broken, f"{docname}: images that did not load: {broken}"

    shots = site.parent / "screenshots"  # _build/screenshots for _build/html
    shots.mkdir(parents=True, exist_ok=True)
    visit.page.screenshot(path=str(shots / _screenshot_name(docname)), full_page=True)

    assert not visit.external, f"{docname}: requests to other hosts: {visit.external}"
    assert not visit.failed, f"{docname}: failed requests: {visit.failed}"
    assert not visit.server_errors, f"{docname}: the server answered with errors: {visit.server_errors}"
    assert not visit.console_errors, f"{docname}: console errors: {visit.console_errors}"


@pytest.fixture
def wide_visit(browser, server):
    v = PageVisit(browser, server, width=1400)
    yield v
    v.close()


@pytest.mark.parametrize("docname", PAGES)
def test_page_reads_right(wide_visit, docname, site):
    """At 1400 px: formulas not clipped, no typeset backslashes, no tracebacks, crisp figures,
    code within the column (hidden code cells opened first)."""
    if not (site / f"{docname}.html").is_file():
        pytest.fail(f"{docname}.html was not built")
    wide_visit.goto(f"{docname}.html")
    found = wide_visit.page.evaluate(READ_RIGHT)
    problems = {
        "display formulas clipped (no room in a box that hides vertical overflow)": found["clipped"],
        "backslashes typeset in math": found["backslashes"],
        "tracebacks shown to the reader": found["tracebacks"],
        "raster figures with fewer than 1.5 pixels per shown pixel": found["blurry"],
        "code blocks wider than the column": found["wide"],
    }
    report = [f"{what}: {items[:5]}" for what, items in problems.items() if items]
    assert not report, f"{docname} at 1400 px:\n" + "\n".join(report)


def test_figures_are_on_the_chapter_pages(site):
    """Every chapter page carries figures drawn at build time (PNG files in _images)."""
    for chapter in CHAPTERS:
        imgs = [url for tag, url in _parse(site / f"{chapter}.html").links if tag == "img" and "_images/" in url]
        assert imgs, f"{chapter} has no figure"


def test_next_links_from_the_first_page_reach_every_chapter(visit):
    visit.goto("index.html")  # Jupyter Book's redirect (meta refresh) to the root page
    visit.page.wait_for_url(f"**/{DOCNAMES[0]}.html")
    visit.page.wait_for_load_state("load")
    seen = [visit.page.evaluate("DOCUMENTATION_OPTIONS.pagename")]
    for _ in range(len(PAGES) + 5):
        nxt = visit.page.locator("a.right-next")
        if nxt.count() == 0:
            break
        with visit.page.expect_navigation(wait_until="load"):
            nxt.first.click()
        seen.append(visit.page.evaluate("DOCUMENTATION_OPTIONS.pagename"))
    assert seen[: len(CHAPTERS) + 1] == ["book/index"] + CHAPTERS, f"reading order: {seen}"
    assert seen == DOCNAMES, f"the next links do not follow _toc.yml: {seen}"
    assert not visit.failed and not visit.console_errors and not visit.external and not visit.server_errors


def test_sidebar_lists_every_chapter_in_order(visit):
    visit.goto("book/index.html")
    paths = visit.page.eval_on_selector_all(
        "nav.bd-docs-nav a.reference.internal", "els => els.map(e => new URL(e.href).pathname)")
    listed = [p.lstrip("/").removesuffix(".html") for p in paths]
    assert listed == DOCNAMES, f"sidebar entries differ from _toc.yml: {listed}"
    chapters = [h for h in listed if h in CHAPTERS]
    assert chapters == CHAPTERS, f"sidebar chapters: {chapters}"


def test_search_finds_pages(visit, site):
    visit.goto("search.html?q=softmax")
    visit.page.wait_for_selector("#search-results ul.search li", timeout=15000)
    hits = visit.page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(e => e.getAttribute('href'))")
    assert any("01_intuition" in h for h in hits), f"search for 'softmax' found: {hits}"
    titles = visit.page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(e => e.textContent)")
    duplicated = sorted({t for t in titles if titles.count(t) > 1})
    assert not duplicated, f"search results with the same title for different pages: {duplicated}"
    math = visit.page.evaluate(MATH_CHECK)
    assert not math["raw"], f"raw TeX in the search results: {math['raw'][:5]}"
    assert not visit.failed and not visit.console_errors and not visit.external and not visit.server_errors
    shots = site.parent / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    visit.page.screenshot(path=str(shots / "search-results.png"), full_page=True)


def test_download_menu_serves_the_notebook(visit):
    visit.goto("book/02_scaled_dot_product_attention.html")
    link = visit.page.locator("a[href$='.ipynb']").first
    href = link.get_attribute("href")
    response = visit.page.request.get(f"{visit.server}/book/{href}")
    assert response.ok, f"{href}: HTTP {response.status}"
    json.loads(response.body())  # a notebook is JSON

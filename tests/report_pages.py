"""Walk a `snakemake --report` HTML file as its user does, in headless Chromium (tests/browser.py).

``walk_report`` opens the report (its landing page: the workflow description of
workflow/report/workflow.rst beside the rule graph), then every category of its menu, every
subcategory of a category that has several, and every result listed there, clicking the same
links a user clicks (the report is a React page: categories and results open client-side, a
result's eye button shows an image, an HTML page in an iframe, or downloads the file). It returns
what each page showed, read from the DOM (an iframe's own document included), and every console
error on the way; with ``screenshots`` it saves a PNG of every page it opened there.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import unquote

from .browser import Browser, BrowserError

LANDING = """(() => {
  const landing = document.querySelector('.dlmpipe-landing');
  if (!landing) return null;
  const summary = landing.querySelector('.dlmpipe-summary');
  const table = summary && summary.querySelector('table');
  const rect = table ? table.getBoundingClientRect() : null;
  return {
    text: landing.innerText,
    summary_text: summary ? summary.innerText : '',
    header: table ? Array.from(table.querySelectorAll('thead th')).map(c => c.innerText.trim()) : [],
    rows: table ? Array.from(table.querySelectorAll('tbody tr')).map(
      r => Array.from(r.querySelectorAll('td')).map(c => c.innerText.trim())) : [],
    table_box: rect ? {top: rect.top, left: rect.left, right: rect.right,
                       bottom: rect.bottom} : null,
    viewport: {width: window.innerWidth, height: window.innerHeight},
    images: Array.from(landing.querySelectorAll('img')).map(i => ({
      alt: i.alt, loaded: i.complete && i.naturalWidth > 0, width: i.getBoundingClientRect().width,
      src: i.src.slice(0, 32)})),
    rulegraph_rules: rulegraph_spec.data.find(d => d.name === 'node-data').values.map(n => n.rule),
    rulegraph_drawn: !!document.querySelector('#rulegraph svg, #rulegraph canvas'),
  };
})()"""

MENU_LINK = """(name => {
  const link = Array.from(document.querySelectorAll('nav a')).find(
    a => a.innerText.trim() === name);
  if (!link) return false;
  link.click();
  return true;
})(%s)"""

RESULT_ROWS = """Array.from(document.querySelectorAll('nav tbody tr')).map(r => {
  const eye = r.querySelector('td:last-child a');
  return {label: Array.from(r.querySelectorAll('td')).slice(0, -1).map(c => c.innerText.trim()).join(' | '),
          href: eye ? eye.getAttribute('href') : null,
          download: eye ? eye.getAttribute('download') : null};
})"""

CONTENT = """(() => {
  const frame = document.querySelector('iframe');
  const img = Array.from(document.querySelectorAll('img')).find(i => i.src.startsWith('data:image/')
      && !i.closest('nav') && !i.closest('.dlmpipe-landing') && i.src !== logo_uri);
  if (frame) return {kind: 'html', src: frame.src};
  if (img) return {kind: 'img', src: img.src, loaded: img.complete && img.naturalWidth > 0,
                   width: img.naturalWidth};
  return null;
})()"""

FRAME_DOCUMENT = """document.readyState === 'complete' && document.body ? {
  tables: document.querySelectorAll('table').length,
  text: document.body.innerText,
} : null"""


def data_uri_name(src: str) -> str:
    """The filename Snakemake writes into a result's data: URI."""
    match = re.search(r";filename=([^;,]+)", src)
    return unquote(match.group(1)) if match else ""


def _shot(browser: Browser, screenshots: Path | None, name: str) -> None:
    if screenshots is not None:
        screenshots.mkdir(parents=True, exist_ok=True)
        browser.pump(0.3)  # let the page paint
        browser.screenshot(screenshots / (re.sub(r"[^\w.-]+", "_", name) + ".png"))


class ReportWalk:
    def __init__(self, browser: Browser, report: Path, downloads: Path,
                 screenshots: Path | None = None):
        self.browser, self.url = browser, Path(report).resolve().as_uri()
        self.downloads, self.screenshots = downloads, screenshots
        self.errors: list[tuple[str, str]] = []  # (where, console error)

    def _errors_at(self, where: str) -> None:
        self.errors += [(where, e) for e in self.browser.errors]
        self.browser.errors.clear()

    def open(self) -> None:
        self.browser.navigate(self.url)
        self.browser.wait_for("typeof app !== 'undefined' && document.querySelector('nav a') !== null")

    def landing(self) -> dict:
        self.open()
        self.browser.wait_for("document.querySelector('.dlmpipe-landing') !== null")
        self.browser.wait_for("Array.from(document.querySelectorAll('.dlmpipe-landing img'))"
                              ".every(i => i.complete)")
        self.browser.wait_for("document.querySelector('#rulegraph svg, #rulegraph canvas') !== null")
        page = self.browser.evaluate(LANDING)
        _shot(self.browser, self.screenshots, "landing")
        self._errors_at("landing page")
        return page

    def _click(self, name: str, where: str) -> None:
        if not self.browser.evaluate(MENU_LINK % json.dumps(name)):
            raise BrowserError(f"{where}: no link named {name!r}")
        self.browser.pump(0.2)

    def _open_category(self, category: str, subcategory: str | None) -> None:
        self.open()
        self._click(category, "menu")
        if subcategory is not None:
            self._click(subcategory, category)

    def _subcategories(self, category: str) -> list[str | None]:
        names = self.browser.evaluate(f"Object.keys(categories[{json.dumps(category)}])")
        return [None] if len(names) == 1 else sorted(names)

    def _result(self, index: int, row: dict, where: str) -> dict:
        browser = self.browser
        if row["href"] and row["href"].startswith("data:"):  # a download link (e.g. a CSV)
            before = set(self.downloads.iterdir())
            browser.evaluate(f"document.querySelectorAll('nav tbody tr')[{index}]"
                             ".querySelector('td:last-child a').click()")
            deadline = time.monotonic() + 20
            new: set[Path] = set()
            while time.monotonic() < deadline:
                new = {p for p in set(self.downloads.iterdir()) - before
                       if not p.name.endswith(".crdownload")}
                if new:
                    break
                browser.pump(0.1)
            return {"kind": "download", "name": row["download"],
                    "downloaded": sorted(new)[0] if new else None}
        previous = browser.evaluate(CONTENT)
        browser.evaluate(f"document.querySelectorAll('nav tbody tr')[{index}]"
                         ".querySelector('td:last-child a').click()")
        changed = (f"(c => c && c.src !== {json.dumps(previous['src'] if previous else None)} ? c : null)"
                   f"({CONTENT})")
        content = browser.wait_for(changed, timeout=20)
        shown = {"kind": content["kind"], "name": data_uri_name(content["src"])}
        if content["kind"] == "img":
            browser.wait_for(f"({CONTENT}).loaded", timeout=20)
            shown.update(loaded=True, width=browser.evaluate(f"({CONTENT}).width"))
            return shown
        frame, deadline = None, time.monotonic() + 20
        while frame is None:  # the iframe's own document, in its own execution context
            frame = next((f["id"] for f in browser.frames()
                          if f["url"] == content["src"] and f["id"] in browser.contexts), None)
            if frame is None:
                if time.monotonic() > deadline:
                    raise BrowserError(f"{where}: the iframe of {shown['name']} never loaded")
                browser.pump(0.05)
        shown.update(browser.wait_for(FRAME_DOCUMENT, frame=frame, timeout=20))
        return shown

    def categories(self) -> dict:
        """{category: {subcategory or None: {row label: what its eye button showed}}}."""
        self.open()
        pages: dict = {}
        for category in sorted(self.browser.evaluate("Object.keys(categories)")):
            pages[category] = {}
            for subcategory in self._subcategories(category):
                where = category + (f" / {subcategory}" if subcategory else "")
                self._open_category(category, subcategory)
                rows = self.browser.wait_for(RESULT_ROWS, timeout=20)
                _shot(self.browser, self.screenshots, where)
                self._errors_at(where)
                shown = {}
                for index, row in enumerate(rows):
                    shown[row["label"]] = self._result(index, row, where)
                    _shot(self.browser, self.screenshots, f"{where} - {row['label']}")
                    self._errors_at(f"{where} / {row['label']}")
                pages[category][subcategory] = shown
        return pages


def walk_report(report: Path, downloads: Path, screenshots: Path | None = None,
                binary: str | None = None) -> dict:
    """Everything the report showed: {"landing": ..., "pages": ..., "errors": [...]}."""
    downloads.mkdir(parents=True, exist_ok=True)
    with Browser(binary) as browser:
        browser.send("Browser.setDownloadBehavior", behavior="allow",
                     downloadPath=str(downloads.resolve()))
        walk = ReportWalk(browser, report, downloads, screenshots)
        landing = walk.landing()
        pages = walk.categories()
        return {"landing": landing, "pages": pages, "errors": walk.errors}

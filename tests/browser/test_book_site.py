"""The book's website (book/, `make book`), built here from the committed notebooks and read in
a headless Chromium over http://127.0.0.1, as a reader on a static host reads it.

Every page loads with no console error and no broken image (the source pages, one template
for hundreds of files, are read for missing files and a few of them opened); the sidebar lists
every chapter in order and each chapter links the previous and next; the search finds "block
table" on chapter 04; a folded interview answer opens on click; a widget's place shows its
stand-in line and the static picture after it; each "Read the real thing" heading links to its
source page, whose highlighted first line is the listing's first line; each chapter's download
link serves the committed notebook, byte for byte.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import re
import threading
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
book_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(book_build)

NOTEBOOKS = book_build.book_notebooks()
# Sphinx 9 deprecates attributes the theme and myst-parser still read; the build itself must
# stay free of Sphinx warnings (-W), which these are not
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*Check CHANGES for Sphinx API modifications")


def _by():
    from selenium.webdriver.common.by import By

    return By


def wait_for(condition, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Site:
    def __init__(self, folder: Path):
        self.folder = folder
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def pages(self) -> list[str]:
        return sorted(p.relative_to(self.folder).as_posix() for p in self.folder.rglob("*.html")
                      if not p.relative_to(self.folder).parts[0].startswith("_"))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    html = book_build.build(tmp_path_factory.mktemp("book"))
    served = Site(html)
    yield served
    served.server.shutdown()


def open_page(driver, site: Site, page: str) -> None:
    driver.get(f"{site.url}/{page}")
    wait_for(lambda: driver.execute_script("return document.readyState") == "complete", 30,
             f"{page} to load")


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


# What the tests read of an opened page, in one round trip to the browser (one WebDriver call
# per element took longer than loading the pages: a chapter links a dozen listings). `text` is
# the article's rendered text (innerText: what a reader sees, hidden elements left out).
READ_PAGE = """
const hrefs = selector => Array.from(document.querySelectorAll(selector), a => a.href);
const found = {
    broken: Array.from(document.images).filter(img => !img.complete || img.naturalWidth === 0)
        .map(img => img.src),
    images: document.images.length};
const article = document.querySelector('article');
if (arguments[0] && article) {
    const download = article.querySelector('a.download');
    Object.assign(found, {
        previous: hrefs('a.left-prev'),
        next: hrefs('a.right-next'),
        sources: Array.from(document.querySelectorAll('a.minicb-source-link'), a => {
            const listing = document.evaluate('following::pre[1]', a, null,
                XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
            return [a.href, a.textContent.trim(), listing ? listing.textContent : ''];
        }),
        download: download ? download.href : null,
        text: article.innerText});
}
return found;"""


@pytest.fixture(scope="module")
def read_pages(site, console_browser) -> dict[str, dict]:
    """Every page of the site opened once, and what the tests below read of it: its broken
    images, its image count and console errors; on a chapter's page, also its neighbours' links,
    its "Read the real thing" links with the first line each listing shows, and its download
    link and text (a chapter page is large: opening each once instead of once a test)."""
    console_browser.get_log("browser")                       # start from an empty log
    read = {}
    pages = site.pages()
    opened = [page for page in pages if not page.startswith("source/")]
    sources = [page for page in pages if page.startswith("source/")]
    # the source pages (one per file of the repository's code, most of the site) are one
    # template filled with highlighted lines: a few are opened in the browser, the python,
    # C and listing pages the chapters link to first; every one is read for missing files
    sampled = sorted({sources[0], sources[-1], "source/minicb/kv/blocks.html",
                      *[p for p in sources if p.endswith(".c.html")][:1]} & set(sources))
    for page in sources:
        if page not in sampled:
            read[page] = {"broken": missing_files(site.folder, page), "images": 0, "errors": []}
    for page in opened + sampled:
        open_page(console_browser, site, page)
        found = console_browser.execute_script(READ_PAGE, page.startswith("notebooks/"))
        found["errors"] = console_errors(console_browser)
        if "sources" in found:
            found["sources"] = [(href, text, _first_line(listing))
                                for href, text, listing in found["sources"]]
        read[page] = found
    return read


LOCAL_REFERENCE = re.compile(r'(?:src|href)="(?!https?:|mailto:|#|data:|javascript:)([^"#?]+)')


def missing_files(folder: Path, page: str) -> list[str]:
    """The files `page` refers to (images, scripts, stylesheets, links) that the site lacks."""
    text = (folder / page).read_text()
    base = (folder / page).parent
    return [ref for ref in LOCAL_REFERENCE.findall(text)
            if not (base / urllib.request.url2pathname(ref)).resolve().exists()]


def test_every_page_loads_without_console_errors_or_broken_images(site, read_pages):
    pages = site.pages()
    assert {"index.html", "search.html", "facts.html", "docs/ARCHITECTURE.html",
            "exercises/README.html", "benchmarks/README.html", "source/minicb/kv/blocks.html"} \
        <= set(pages)
    assert {f"notebooks/{p.stem}.html" for p in NOTEBOOKS} <= set(pages)
    problems = {page: {"broken images": found["broken"], "console errors": found["errors"]}
                for page, found in read_pages.items() if found["broken"] or found["errors"]}
    assert not problems, problems
    images = sum(found["images"] for found in read_pages.values())
    figures = sum("image/png" in output.get("data", {}) for notebook in NOTEBOOKS
                  for cell in nbformat.read(notebook, as_version=4).cells
                  for output in cell.get("outputs", []))
    figures += sum(len(re.findall(r"!\[[^\]]*\]\(", page.read_text()))
                   for page in (ROOT / "benchmarks").glob("*.md"))
    assert images >= figures, f"{images} images on the site, {figures} figures in its sources"


def test_the_sidebar_lists_every_chapter_in_order_and_chapters_link_their_neighbours(
        site, console_browser, read_pages):
    By = _by()
    open_page(console_browser, site, "index.html")
    links = console_browser.find_elements(By.CSS_SELECTOR, ".bd-sidebar-primary nav a.reference")
    listed = [a.get_attribute("href").rsplit("/", 1)[-1] for a in links
              if "/notebooks/" in a.get_attribute("href")]
    assert listed == [f"{p.stem}.html" for p in NOTEBOOKS]
    titles = [a.text.strip() for a in links if "/notebooks/" in a.get_attribute("href")]
    assert titles == [book_build.title_of(nbformat.read(p, as_version=4), p.stem)
                      for p in NOTEBOOKS]
    assert [t[:2] for t in titles[:8]] == [f"{n:02d}" for n in range(8)]
    for before, page, after in zip(NOTEBOOKS, NOTEBOOKS[1:], NOTEBOOKS[2:]):
        found = read_pages[f"notebooks/{page.stem}.html"]
        assert [href.rsplit("/notebooks/", 1)[-1] for href in found["previous"]] == \
            [f"{before.stem}.html"], (page.name, found["previous"])
        assert [href.rsplit("/notebooks/", 1)[-1] for href in found["next"]] == \
            [f"{after.stem}.html"], (page.name, found["next"])


def test_search_finds_block_table_on_the_chapter_04_page(site, console_browser):
    By = _by()
    open_page(console_browser, site, "search.html?q=block+table")
    results = wait_for(lambda: console_browser.find_elements(
        By.CSS_SELECTOR, "#search-results ul.search li a"), 30, "search results")
    hrefs = [a.get_attribute("href") for a in results]
    assert any("notebooks/04_paged_kv_cache.html" in href for href in hrefs), hrefs
    # the source pages are left out of the index: the code's every use of a word would bury the
    # chapters that explain it
    assert not any("/source/" in href for href in hrefs), hrefs


def test_a_folded_answer_stays_folded_until_clicked(site, console_browser):
    By = _by()
    open_page(console_browser, site, "notebooks/interview.html")
    answers = console_browser.find_elements(By.CSS_SELECTOR, "article details")
    assert len(answers) >= 30
    first = answers[0]
    text = first.find_element(By.CSS_SELECTOR, "p")
    assert first.get_attribute("open") is None and not text.is_displayed()
    console_browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", first)
    first.find_element(By.TAG_NAME, "summary").click()
    wait_for(lambda: text.is_displayed(), 5, "the answer to show")
    assert first.get_attribute("open") is not None and len(text.text) > 40
    assert answers[1].get_attribute("open") is None        # the others stay folded


@pytest.mark.parametrize("page", ["03_continuous_batching", "interview"])
def test_a_widget_shows_its_static_stand_in(site, console_browser, page):
    By = _by()
    open_page(console_browser, site, f"notebooks/{page}.html")
    notes = console_browser.find_elements(By.CSS_SELECTOR, ".minicb-widget-note")
    assert len(notes) == 1 and notes[0].is_displayed()
    assert "Interactive in the notebook" in notes[0].text
    assert not console_browser.find_elements(By.XPATH, "//*[starts-with(normalize-space(.), "
                                                       "'VBox(children')]")
    if page == "03_continuous_batching":          # the static picture right after it
        picture = console_browser.execute_script("""
            const cells = Array.from(document.querySelectorAll('div.cell'));
            const at = cells.findIndex(c => c.querySelector('.minicb-widget-note'));
            const img = cells.slice(at + 1).map(c => c.querySelector('img')).find(i => i);
            return img ? img.naturalWidth : 0;""")
        assert picture > 100


def _first_line(listing: str) -> tuple[int, str]:
    """The first line of the listing under a "Read the real thing" heading, (number, code), from
    the listing's textContent (not its rendered text: a full source folded under <details> is not
    displayed)."""
    number, _, code = listing.splitlines()[0].strip().partition(" ")
    return int(number), code.strip()


# A source page's highlighted lines (the first without its line number) and its links back
SHOWN = """const shown = document.querySelectorAll('.minicb-shown');
if (!shown.length) return null;
const line = shown[0].cloneNode(true);
line.querySelectorAll('.linenos').forEach(n => n.remove());
const links = document.querySelectorAll('article a.reference.internal');
return {count: shown.length, first: line.textContent, links: Array.from(links, a => a.href)};"""


def test_read_the_real_thing_links_land_on_the_lines_they_show(console_browser, read_pages):
    checked = []
    for notebook in NOTEBOOKS:
        for href, text, (number, code) in read_pages[f"notebooks/{notebook.stem}.html"]["sources"]:
            path, first, last = re.fullmatch(r"(\S+\.(?:py|c|h)), lines (\d+)-(\d+)", text).groups()
            assert href.endswith(f"{book_build.source_docname(path)}.html#L{first}-L{last}")
            assert int(first) == number
            console_browser.get(href)
            shown = wait_for(lambda: console_browser.execute_script(SHOWN), 10,
                             f"the lines of {text} to be highlighted")
            assert shown["count"] == int(last) - int(first) + 1
            line = shown["first"].strip()
            assert line == code, f"{notebook.name}: {text} shows {code!r}, the page has {line!r}"
            # a source page has no sidebar; its opening lines lead back to the book
            assert {"index.html", "source.html"} <= {
                link.rsplit("/", 1)[-1].split("#")[0] for link in shown["links"]}
            checked.append(text)
    assert len(checked) >= 10, checked
    assert any(".c, lines" in text for text in checked), "no C kernel listing was linked"


def test_each_chapter_links_its_notebook_for_download_and_says_how_to_open_it(read_pages):
    for notebook in NOTEBOOKS:
        found = read_pages[f"notebooks/{notebook.stem}.html"]
        assert found["download"] and found["download"].endswith(f"/{notebook.name}"), found
        with urllib.request.urlopen(found["download"], timeout=10) as response:
            assert response.read() == notebook.read_bytes()
        assert f"jupyter lab notebooks/{notebook.name}" in found["text"]

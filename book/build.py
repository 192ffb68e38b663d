#!/usr/bin/env python
"""Build the book as a website: `make book`, or `.venv/bin/python book/build.py [--out DIR]`.

The site is built by Sphinx with myst-nb and sphinx-book-theme from the committed, executed
notebooks: nothing is re-executed and nothing is fetched. This script first gathers the pages
into DIR/src (the configuration stays in book/):

* book/*.md                 the landing page and the pages of the book's own;
* notebooks/*.ipynb         every chapter in order, then the other notebooks (appendix,
                            interview), each with a note that links its .ipynb for download and
                            says how to open it in JupyterLab; a cell whose input is hidden in
                            JupyterLab (`jupyter.source_hidden`) shows only its output;
* docs/ARCHITECTURE.md, exercises/README.md, course/ (the course track), benchmarks/*.md with
  benchmarks/results/;
* facts.md                  the cited facts table, rendered from minicb/facts.py;
* source/...                one page per source file of minicb/ and kernels/ (Python, and the C
                            kernels with their header), each line with an anchor (#L12), which
                            the "Read the real thing" headings link to.

Then `sphinx-build -W --keep-going` writes DIR/html (open DIR/html/index.html). Any warning
fails the build: a broken link or cross-reference, a missing image, bad MyST.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = ROOT / "notebooks"
DEFAULT_OUT = ROOT / "build" / "book"
SOURCE_PACKAGES = ("minicb", "kernels")
C_SOURCES = ("*.c", "*.h")              # the CPU kernels, in kernels/
NBVAL_MARKER = re.compile(r"^# NBVAL_\w+\n?")


def book_notebooks() -> list[Path]:
    """The chapters in order (NN_*.ipynb), then the appendix, if any, then the rest."""
    every = sorted(NOTEBOOKS.glob("*.ipynb"))
    chapters = [p for p in every if re.match(r"\d\d_", p.name)]
    appendix = [p for p in every if p.name.startswith("appendix")]
    return chapters + appendix + [p for p in every if p not in chapters and p not in appendix]


def title_of(nb: nbformat.NotebookNode, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def run_note(name: str) -> str:
    return f"""```{{admonition}} Run this chapter
:class: tip

{{download}}`Download {name} <../downloads/{name}>` (executed, with its outputs) and open it in
JupyterLab. From a clone of the repository, `make lab` sets up `.venv` and opens JupyterLab on
`notebooks/`; or, once set up:

    .venv/bin/jupyter lab notebooks/{name}

Pictures and numbers below are this notebook's recorded outputs; the widgets and the code run
only in JupyterLab.
```"""


def site_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook as the site shows it: the recorded outputs unchanged; a code cell whose input
    is hidden in JupyterLab shows only its output; the test-only `# NBVAL_...` first line is
    dropped; a note with the download link follows the first cell."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source = NBVAL_MARKER.sub("", cell.source, count=1)
        tags = cell.metadata.setdefault("tags", [])
        if cell.metadata.get("jupyter", {}).get("source_hidden") and "hide-input" not in tags \
                and "remove-input" not in tags:
            tags.append("remove-input")
        if not tags:
            del cell.metadata["tags"]
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(run_note(path.name)))
    return nb


def promote_headings(text: str) -> str:
    """A page whose first heading is `##` gets every heading one level up: a page's title is
    its first heading, and MyST wants it at level 1."""
    first = re.search(r"^(#+) ", text, re.M)
    if not first or len(first.group(1)) == 1:
        return text
    fences, lines = False, []
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fences = not fences
        lines.append(line[1:] if not fences and re.match(r"##+ ", line) else line)
    return "".join(lines)


def facts_page() -> str:
    spec = importlib.util.spec_from_file_location("minicb_book_facts", ROOT / "minicb" / "facts.py")
    facts = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = facts                  # dataclasses look their module up there
    spec.loader.exec_module(facts)
    return ("# Cited facts\n\nEvery number in the book that comes from outside the project (a "
            "data sheet, a paper, another engine's defaults), with its unit and its source. The "
            "chapters, the simulator and the benchmarks read these values from `minicb/facts.py` "
            "({doc}`source page <source/minicb/facts>`), so a sentence that quotes one and the "
            "code that uses it cannot disagree.\n\n" + facts.facts_table() + "\n")


def results_index() -> str:
    """The page a link to benchmarks/results/ lands on: every recorded result, to download."""
    files = sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir()
                   if p.is_file() and not p.name.endswith(".tmp"))
    return ("---\norphan: true\n---\n\n# Benchmark results\n\nThe raw results the benchmark "
            "pages quote (JSON) and their pictures, as recorded in `benchmarks/results/`.\n\n"
            + "\n".join(f"* {{download}}`{name} <{name}>`" for name in files) + "\n")


def source_files() -> list[Path]:
    python = [p for package in SOURCE_PACKAGES for p in (ROOT / package).rglob("*.py")
              if "__pycache__" not in p.parts]
    return sorted(python + [p for pattern in C_SOURCES for p in (ROOT / "kernels").glob(pattern)])


def source_docname(relative: str) -> str:
    """The site's page of a source file: `source/minicb/kv/blocks` for a Python file, the name
    with its suffix for a C file (`source/kernels/cpu_linear.c`: `cpu.py` and a `cpu.c` could
    otherwise share a page)."""
    return "source/" + relative.removesuffix(".py")


def source_page(path: Path) -> str:
    """One source file, highlighted, each line a span with id `L<n>` (the lines a chapter shows
    are highlighted by book/_static/source-lines.js from the link's #L12-L30)."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import CLexer, PythonLexer

    relative = path.relative_to(ROOT).as_posix()
    code = path.read_text(encoding="utf-8")
    lexer = PythonLexer() if path.suffix == ".py" else CLexer()
    body = highlight(code, lexer, HtmlFormatter(linenos="inline", linespans="L",
                                                        cssclass="highlight minicb-source"))
    body = re.sub(r'<span id="L-(\d+)">', r'<span id="L\1">', body)
    lines = code.count("\n") + (not code.endswith("\n"))
    # A source page is kept out of the search index (`nosearch`: a search for a word should
    # land in the chapters that explain it, not in the code's every use of it) and has no
    # sidebar (book/conf.py): its listing gets the page's width, and the links below lead back.
    # Together they take about a third off the site's build, most of whose pages are these.
    return (f"---\norphan: true\nnosearch: true\n---\n\n# {relative}\n\n`{relative}`, {lines} "
            "lines, as this site was built. The chapters' *Read the real thing* sections link here "
            "to the lines they show. Back to {doc}`the book </index>` or to "
            "{doc}`every source file </source>`.\n\n"
            f"```{{raw}} html\n{body}\n```\n")


def source_index(files: list[Path]) -> str:
    lines = []
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        lines.append(f"* {{doc}}`{relative} <{source_docname(relative)}>`")
    return ("# Source code\n\nEvery file of the `minicb` package and its kernels, as the site was "
            "built, with line numbers: the chapters link each listing they show to its lines "
            "here.\n\n" + "\n".join(lines) + "\n")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def stage(src: Path) -> None:
    """Gather every page of the site into `src`."""
    if src.exists():
        shutil.rmtree(src)
    for folder in ("notebooks", "downloads"):
        (src / folder).mkdir(parents=True)
    notebooks = book_notebooks()
    entries = []
    for path in notebooks:
        nb = site_notebook(path)
        nbformat.write(nb, src / "notebooks" / path.name)
        shutil.copy(path, src / "downloads" / path.name)
        entries.append(f"notebooks/{path.stem}")
    index = (BOOK / "index.md").read_text(encoding="utf-8")
    if "{chapter-toctree}" not in index:
        raise ValueError("book/index.md lost its {chapter-toctree} line: the chapters' toctree "
                         "is written there")
    write(src / "index.md", index.replace("{chapter-toctree}", "\n".join(entries)))
    for page in BOOK.glob("*.md"):
        if page.name != "index.md":
            shutil.copy(page, src / page.name)
    benchmarks = sorted((ROOT / "benchmarks").glob("*.md"))
    course = sorted((ROOT / "course").rglob("*.md"))
    for page in (["docs/ARCHITECTURE.md", "exercises/README.md"]
                 + [p.relative_to(ROOT).as_posix() for p in benchmarks + course]):
        text = promote_headings((ROOT / page).read_text(encoding="utf-8"))
        # a link to the results folder lands on the page that lists it
        write(src / page, text.replace("](results/)", "](results/index.md)"))
    shutil.copytree(ROOT / "benchmarks" / "results", src / "benchmarks" / "results",
                    ignore=shutil.ignore_patterns("*.tmp"))
    write(src / "benchmarks" / "results" / "index.md", results_index())
    write(src / "facts.md", facts_page())
    files = source_files()
    for path in files:
        page = source_docname(path.relative_to(ROOT).as_posix())
        write(src / f"{page}.md", source_page(path))
    write(src / "source.md", source_index(files))


def sphinx_args(src: Path, out: Path, quiet: bool = True) -> list[str]:
    """sphinx-build's arguments: every warning an error (all of them reported), a fresh
    environment each time (so a warning is never hidden by a cached page), pages read and
    written on every core (the site's one extension and myst-nb are safe in parallel)."""
    return (["-q"] if quiet else []) + [
        "-b", "html", "-W", "--keep-going", "-E", "-j", "auto", "-c", str(BOOK),
        "-d", str(out / "doctrees"), str(src), str(out / "html")]


def build(out: Path = DEFAULT_OUT, quiet: bool = True) -> Path:
    """Stage and build the site into out/html; raise if Sphinx warned or failed."""
    from sphinx.cmd.build import build_main

    src = out / "src"
    stage(src)
    status = build_main(sphinx_args(src, out, quiet))
    if status:
        raise SystemExit(f"the book did not build (sphinx-build exited {status}): see the "
                         "warnings above")
    return out / "html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"build folder (default: {DEFAULT_OUT.relative_to(ROOT)})")
    parser.add_argument("--verbose", action="store_true", help="Sphinx's progress lines too")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    site = build(args.out.resolve(), quiet=not args.verbose)
    print(f"book: built in {time.perf_counter() - start:.0f} s; open "
          f"{site / 'index.html'} (or: python -m http.server -d {site})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

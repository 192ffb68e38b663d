"""How book/build.py prepares the pages of the website (the build itself, read in a browser, is
tests/browser/test_book_site.py): what a reader of the site sees of a notebook's cells."""

from __future__ import annotations

import html
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
book_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(book_build)
# Sphinx 9 deprecates attributes the theme and myst-parser still read (Python warnings, not the
# Sphinx warnings the build turns into errors)
pytestmark = pytest.mark.filterwarnings("ignore:.*Check CHANGES for Sphinx API modifications")


def _notebook(tmp_path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 · A chapter\n\nIts goals."),
                nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(time.time())"),
                nbformat.v4.new_code_cell("Markdown(f'prose with {value}')"),
                nbformat.v4.new_code_cell("folded_but_shown()")]
    nb.cells[2].metadata["jupyter"] = {"source_hidden": True}
    nb.cells[3].metadata["tags"] = ["hide-input"]
    nb.cells[3].metadata["jupyter"] = {"source_hidden": True}
    path = tmp_path / "99_a_chapter.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_hidden_input_cell_shows_only_its_output_on_the_site(tmp_path):
    site = book_build.site_notebook(_notebook(tmp_path))
    code = [c for c in site.cells if c.cell_type == "code"]
    assert code[1].metadata["tags"] == ["remove-input"]
    assert code[2].metadata["tags"] == ["hide-input"]        # the author's choice stays
    assert "tags" not in code[0].metadata


def test_the_site_drops_the_test_marker_and_adds_the_run_note_after_the_title(tmp_path):
    path = _notebook(tmp_path)
    site = book_build.site_notebook(path)
    assert site.cells[0].source.startswith("# 99 · A chapter")
    assert "{download}" in site.cells[1].source
    assert f"jupyter lab notebooks/{path.name}" in site.cells[1].source
    assert site.cells[2].source == "print(time.time())"
    assert nbformat.read(path, as_version=4).cells[1].source.startswith("# NBVAL_IGNORE_OUTPUT")


def test_a_page_that_starts_at_level_two_is_promoted_but_its_code_is_not():
    text = "## Title\n\n### Part\n\n```bash\n## a shell comment\n```\n"
    assert book_build.promote_headings(text) == \
        "# Title\n\n## Part\n\n```bash\n## a shell comment\n```\n"
    assert book_build.promote_headings("# Title\n\n## Part\n") == "# Title\n\n## Part\n"


def test_the_chapters_come_in_order_then_the_appendix_then_the_rest():
    names = [p.name for p in book_build.book_notebooks()]
    chapters = [n for n in names if n[:2].isdigit()]
    assert names[:len(chapters)] == sorted(chapters) and len(chapters) >= 8
    assert "interview.ipynb" in names[len(chapters):]


def test_every_source_file_gets_a_page_with_an_anchor_per_line():
    files = book_build.source_files()
    assert ROOT / "minicb" / "kv" / "blocks.py" in files
    assert ROOT / "kernels" / "paged_attention.py" in files
    assert ROOT / "kernels" / "cpu_decode_layer.c" in files       # the appendix shows the C kernels
    assert book_build.source_docname("kernels/cpu.py") == "source/kernels/cpu"
    assert book_build.source_docname("kernels/cpu_linear.c") == "source/kernels/cpu_linear.c"
    c_page = book_build.source_page(ROOT / "kernels" / "cpu_linear.c")
    assert '<span id="L1">' in c_page and "minicb_linear_rows" in c_page
    page = book_build.source_page(ROOT / "minicb" / "kv" / "blocks.py")
    lines = (ROOT / "minicb" / "kv" / "blocks.py").read_text().count("\n")
    assert f'<span id="L{lines}">' in page and f'<span id="L{lines + 1}">' not in page
    assert '<span id="L1">' in page


def test_a_broken_link_or_a_missing_image_fails_the_build(tmp_path):
    """The site's configuration with the build's own arguments, on two small pages: a page that
    links a missing page or shows a missing picture must fail, the same page without them not."""
    from sphinx.cmd.build import build_main

    def build(body: str) -> int:
        src = tmp_path / "src"
        src.mkdir(exist_ok=True)
        (src / "index.md").write_text("# A book\n\n```{toctree}\npage\n```\n")
        (src / "page.md").write_text(f"# A page\n\n{body}\n")
        return build_main(book_build.sphinx_args(src, tmp_path / "out"))

    assert build("Some prose.") == 0
    assert build("See [the chapter](missing.md).") != 0
    assert build("![a figure](results/missing.png)") != 0


def test_a_hidden_input_prose_cell_shows_only_its_prose_on_the_page(tmp_path):
    from sphinx.cmd.build import build_main

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("Markdown(f'The pool held **{blocks}** blocks.')",
                                     execution_count=1)
    cell.metadata["jupyter"] = {"source_hidden": True}
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/markdown": "The pool held **96** blocks.", "text/plain": "<Markdown>"})]
    shown = nbformat.v4.new_code_cell("print('shown')", execution_count=2)
    nb.cells = [nbformat.v4.new_markdown_cell("# 98 · Hidden inputs"), cell, shown]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    source = tmp_path / "98_hidden.ipynb"
    nbformat.write(nb, source)
    src = tmp_path / "src"
    (src / "downloads").mkdir(parents=True)
    (src / "index.md").write_text("# A book\n\n```{toctree}\n98_hidden\n```\n")
    (src / "downloads" / source.name).write_text(source.read_text())
    site = book_build.site_notebook(source)
    site.cells[1].source = "A note."                   # the run note links ../downloads/
    nbformat.write(site, src / source.name)
    assert build_main(book_build.sphinx_args(src, tmp_path / "out")) == 0
    page = (tmp_path / "out" / "html" / "98_hidden.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", page))      # what a reader sees
    assert "The pool held <strong>96</strong> blocks." in page
    assert "Markdown(f'The pool held" not in text
    assert "print('shown')" in text                   # other inputs still show

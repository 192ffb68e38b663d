"""How book/build.py prepares the pages of the website (the build itself, read in a browser, is
tests/browser/test_book_site.py): what a reader of the site sees of a notebook's cells."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
book_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(book_build)


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
    page = book_build.source_page(ROOT / "minicb" / "kv" / "blocks.py")
    lines = (ROOT / "minicb" / "kv" / "blocks.py").read_text().count("\n")
    assert f'<span id="L{lines}">' in page and f'<span id="L{lines + 1}">' not in page
    assert '<span id="L1">' in page

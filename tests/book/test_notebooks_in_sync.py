"""Every notebook is a jupytext pair, in step: the MyST text file (what is edited and reviewed)
and the executed .ipynb hold the same cells, read by jupytext itself. A notebook edited without
syncing (or a text file edited without re-executing) drifts, and the next sync would silently
undo or reveal the change."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
spec = importlib.util.spec_from_file_location("execute_notebooks",
                                              ROOT / "scripts" / "execute_notebooks.py")
execute_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(execute_notebooks)

PAIRS = execute_notebooks.book_notebooks()


def cells(nb) -> list[tuple[str, str, dict]]:
    """Each cell's type, source and metadata (tags, `jupyter.source_hidden`: what the site and
    JupyterLab read), without the run's timestamps."""
    return [(c.cell_type, c.source, {k: v for k, v in c.metadata.items() if k != "execution"})
            for c in nb.cells]


def test_every_notebook_is_paired_with_a_text_file():
    committed = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert committed == {p.name for p in PAIRS}, \
        f"notebooks without a text file: {sorted(committed - {p.name for p in PAIRS})}; pair " \
        "one with: jupytext --set-formats ipynb,md:myst notebooks/NAME.ipynb"
    assert [p.name[:2] for p in PAIRS[:8]] == [f"{n:02d}" for n in range(8)]


@pytest.mark.parametrize("notebook", PAIRS, ids=lambda p: p.stem)
def test_the_pair_holds_the_same_cells_and_every_code_cell_ran(notebook):
    text = jupytext.read(notebook.with_suffix(".md"))
    executed = nbformat.read(notebook, as_version=4)
    for nb in (text, executed):
        assert nb.metadata.get("jupytext", {}).get("formats") == execute_notebooks.PAIRING
    assert cells(executed) == cells(text), \
        f"{notebook.name} differs from {notebook.with_suffix('.md').name}: run " \
        f"scripts/execute_notebooks.py {notebook.stem[:2]} (or jupytext --sync {notebook.name})"
    not_run = [i for i, c in enumerate(executed.cells) if c.cell_type == "code"
               and c.source.strip() and c.execution_count is None]
    assert not not_run, f"cells {not_run} of {notebook.name} were never executed"


def test_the_interview_gathers_every_chapter_question_as_the_chapters_word_it():
    interview = nbformat.read(NOTEBOOKS / "interview.ipynb", as_version=4)
    gathered = [c.source for c in interview.cells if c.source.startswith("### ")
                and "<details>" in c.source]
    assert gathered == execute_notebooks.gathered_interview_cells(NOTEBOOKS), \
        "a chapter's interview questions changed: run scripts/execute_notebooks.py interview"


def test_refreshing_the_interview_takes_a_changed_question_from_its_chapter(tmp_path):
    for path in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"):
        shutil.copy(path, tmp_path / path.name)
    chapter = tmp_path / "04_paged_kv_cache.ipynb"
    nb = nbformat.read(chapter, as_version=4)
    cell = next(c for c in nb.cells if "## Interview questions" in c.source)
    question = next(line for line in cell.source.splitlines() if line.startswith("**"))
    cell.source = cell.source.replace(question, "**Why is a block table a list?**")
    nbformat.write(nb, chapter)
    interview = execute_notebooks.refresh_interview(
        nbformat.read(NOTEBOOKS / "interview.ipynb", as_version=4), tmp_path)
    text = "\n".join(c.source for c in interview.cells)
    assert "**Why is a block table a list?**" in text and question not in text


def _pair(tmp_path: Path, name: str = "07_beyond") -> tuple[Path, Path]:
    for suffix in (".ipynb", ".md"):
        shutil.copy(NOTEBOOKS / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    return tmp_path / f"{name}.ipynb", tmp_path / f"{name}.md"


def _make_newer(path: Path, than: Path) -> None:
    later = than.stat().st_mtime + 5
    os.utime(path, (later, later))


def test_editing_the_text_file_and_syncing_changes_the_notebook_and_keeps_its_outputs(tmp_path):
    ipynb, md = _pair(tmp_path)
    before = nbformat.read(ipynb, as_version=4)
    md.write_text(md.read_text().replace("# 07 · ", "# 07 (revised) · ", 1))
    _make_newer(md, ipynb)
    execute_notebooks.sync(ipynb)
    after = nbformat.read(ipynb, as_version=4)
    assert after.cells[0].source.startswith("# 07 (revised) · ")
    assert before.cells[0].source.startswith("# 07 · ")
    assert [c.get("outputs") for c in after.cells] == [c.get("outputs") for c in before.cells]


def test_editing_the_notebook_and_syncing_changes_the_text_file(tmp_path):
    ipynb, md = _pair(tmp_path)
    nb = nbformat.read(ipynb, as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.source += "\nprint('added in JupyterLab')"
    nbformat.write(nb, ipynb)
    _make_newer(ipynb, md)
    assert "added in JupyterLab" not in md.read_text()
    execute_notebooks.sync(ipynb)
    assert "print('added in JupyterLab')" in md.read_text()
    assert cells(jupytext.read(md)) == cells(nbformat.read(ipynb, as_version=4))


def test_execute_notebooks_runs_cleans_and_keeps_the_pair(tmp_path):
    """The command that re-executes a chapter for commit, on a small pair in a scratch folder."""
    md = tmp_path / "99_small.md"
    md.write_text("---\njupytext:\n  formats: ipynb,md:myst\nkernelspec:\n  display_name: Python 3 "
                  "(ipykernel)\n  language: python\n  name: python3\n---\n\n# A small chapter\n\n"
                  "```{code-cell} ipython3\nprint(6 * 7)\n```\n\n"
                  "```{code-cell} ipython3\n---\njupyter:\n  source_hidden: true\n"
                  "tags: [remove-input]\n---\nfrom IPython.display import Markdown\n"
                  "Markdown(f'**{6 * 7}** tokens')\n```\n")
    execute_notebooks.sync(md)
    ipynb = md.with_suffix(".ipynb")
    execute_notebooks.process(ipynb, timeout=60)
    nb = nbformat.read(ipynb, as_version=4)
    assert [c.id for c in nb.cells] == ["c000", "c001", "c002"]
    assert nb.cells[1].outputs[0]["text"] == "42\n" and nb.cells[1].execution_count == 1
    assert "execution" not in nb.cells[1].metadata and "widgets" not in nb.metadata
    # the load record (scripts/execute_notebooks.py's guard): this chapter times nothing
    assert set(nb.metadata) == {"jupytext", "kernelspec", "language_info", "minicb"}
    assert nb.metadata["minicb"]["execution"]["timing_cells"] == []
    hidden = nb.cells[2]                   # a sentence built from a value: only its prose shows
    assert hidden.outputs[0]["data"]["text/markdown"] == "**42** tokens"
    assert hidden.metadata == {"jupyter": {"source_hidden": True}, "tags": ["remove-input"]}
    assert cells(jupytext.read(md)) == cells(nb)

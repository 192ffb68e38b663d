"""Every notebook is its chapter source, executed: a notebook edited by hand (or a source edited
without rebuilding) drifts, and the next rebuild would silently undo or reveal the change."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("build_notebooks",
                                              ROOT / "scripts" / "build_notebooks.py")
build_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_notebooks)

SOURCES = sorted(build_notebooks.CHAPTERS.glob("ch[0-9][0-9]_*.py")) + [
    build_notebooks.CHAPTERS / "interview.py"]


def notebook_for(source: Path) -> Path:
    return (ROOT / "notebooks"
            / f"{source.stem[2:] if source.stem.startswith('ch') else source.stem}.ipynb")


def test_every_notebook_has_a_source_and_every_source_a_notebook():
    built = {notebook_for(s).name for s in SOURCES}
    committed = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert built == committed


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_notebook_cells_equal_its_source_and_every_code_cell_ran(source):
    expected = build_notebooks.build(build_notebooks.load_chapter(source))
    committed = nbformat.read(notebook_for(source), as_version=4)
    assert [(c.cell_type, c.source) for c in committed.cells] == [
        (c.cell_type, c.source) for c in expected.cells], \
        f"{notebook_for(source).name} differs from {source.name}: run scripts/build_notebooks.py " \
        f"{source.stem[2:4]}"
    not_run = [i for i, c in enumerate(committed.cells) if c.cell_type == "code"
               and c.source.strip() and c.execution_count is None]
    assert not not_run, f"cells {not_run} of {notebook_for(source).name} were never executed"

"""The load guard: a notebook's wall-clock cells are committed only from a quiet machine.

scripts/execute_notebooks.py reads the 1-minute load average before and after every timing cell
(first line `# NBVAL_IGNORE_OUTPUT`), records it in the notebook's metadata
(`metadata.minicb.execution`) and refuses to write a notebook whose timing cells ran above
MAX_LOAD_PER_CORE × cores (1.5 on 2 cores), unless asked for a draft. This test reads what is
committed: every notebook with timing cells must carry a record of this very notebook's timing
cells, not a draft, every load read within the limit."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("execute_notebooks",
                                              ROOT / "scripts" / "execute_notebooks.py")
execute_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(execute_notebooks)


TIMED = [path for path in execute_notebooks.book_notebooks()
         if execute_notebooks.timing_cells(nbformat.read(path, as_version=4))]


@pytest.mark.parametrize("path", TIMED, ids=lambda p: p.stem)
def test_committed_timing_cells_ran_on_a_quiet_machine(path):
    nb = nbformat.read(path, as_version=4)
    timed = execute_notebooks.timing_cells(nb)
    record = nb.metadata.get("minicb", {}).get("execution")
    assert record is not None, (f"{path.name} has timing cells {timed} but no load record: "
                                "execute it with scripts/execute_notebooks.py on a quiet machine")
    assert not record["draft"], f"{path.name} is a draft, run at load {record['max_load_1min']}"
    assert record["timing_cells"] == timed, f"{path.name}: the record is of other cells"
    assert len(record["loads_1min"]) == 2 * len(timed)          # before and after each
    assert record["load_limit"] == execute_notebooks.load_limit(record["cores"])
    assert max(record["loads_1min"]) == record["max_load_1min"] <= record["load_limit"], (
        f"{path.name}: its timing cells ran at a load of {record['max_load_1min']} on "
        f"{record['cores']} cores")


def _pair(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["jupytext"] = {"formats": execute_notebooks.PAIRING}
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 · A timed chapter"),
                nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(x + 1)")]
    path = folder / "99_timed.ipynb"
    nbformat.write(nb, path)
    return path


def test_the_guard_refuses_a_busy_run_writes_a_quiet_one_and_marks_a_draft(tmp_path,
                                                                           monkeypatch):
    path = _pair(tmp_path)
    assert execute_notebooks.timing_cells(nbformat.read(path, as_version=4)) == [2]
    before = path.read_text()
    cores = os.cpu_count() or 1
    busy = execute_notebooks.load_limit(cores) + 0.5
    monkeypatch.setattr(os, "getloadavg", lambda: (busy, 0.0, 0.0))
    monkeypatch.delenv(execute_notebooks.DRAFT_ENV, raising=False)
    with pytest.raises(execute_notebooks.TooLoaded, match="not written"):
        execute_notebooks.process(path)
    assert path.read_text() == before                   # nothing written, no outputs

    monkeypatch.setenv(execute_notebooks.DRAFT_ENV, "1")   # a draft: written, and says so
    execute_notebooks.process(path)
    record = nbformat.read(path, as_version=4).metadata["minicb"]["execution"]
    assert record["draft"] and record["max_load_1min"] == busy
    with pytest.raises(AssertionError, match="is a draft"):
        test_committed_timing_cells_ran_on_a_quiet_machine(path)

    monkeypatch.delenv(execute_notebooks.DRAFT_ENV)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    execute_notebooks.process(path)
    nb = nbformat.read(path, as_version=4)
    record = nb.metadata["minicb"]["execution"]
    assert (record["timing_cells"], record["loads_1min"], record["cores"]) == ([2], [0.2, 0.2],
                                                                               cores)
    assert not record["draft"] and nb.cells[2].outputs[0]["text"] == "2\n"
    test_committed_timing_cells_ran_on_a_quiet_machine(path)
    # the record lives in the notebook, not in its text twin, and a sync alone keeps it
    assert "minicb" not in path.with_suffix(".md").read_text().split("---")[1]
    execute_notebooks.process(path, run=False)
    assert nbformat.read(path, as_version=4).metadata["minicb"]["execution"] == record

#!/usr/bin/env python
"""Execute the book's notebooks for commit: sync each pair, run it, clean it, sync it back.

Every chapter is a jupytext pair in notebooks/: `NN_name.md` (MyST markdown, the text you edit
and review) and `NN_name.ipynb` (the executed notebook with its outputs). JupyterLab keeps the
two in step when jupytext is installed (`make setup` installs it); this script is what rebuilds
the outputs:

    .venv/bin/python scripts/execute_notebooks.py             # every notebook
    .venv/bin/python scripts/execute_notebooks.py 00 04       # some chapters (or: interview)
    .venv/bin/python scripts/execute_notebooks.py --no-execute  # sync and clean only
    make notebooks CH=04

For each notebook: `jupytext --sync` takes whichever file of the pair is newer; the interview
notebook's "Every chapter's questions" section is regathered from the chapters; nbclient runs
it with the kernel `python3` (the venv's, installed by `make setup`) in notebooks/; then what
changes on every run and carries no content is dropped (execution timestamps, widget state,
transient output metadata) and cell ids are numbered, so a rebuild only changes the lines whose
content changed; finally the text file is written again from the notebook. Wall-clock outputs
sit in cells whose first line is `# NBVAL_IGNORE_OUTPUT`; `pytest --nbval` compares every other
output.

**The load guard.** A cell whose first line is `# NBVAL_IGNORE_OUTPUT` is a *timing cell*: its
output moves with the wall clock, so it is only as good as the machine was quiet. The 1-minute
load average is read before and after every timing cell, and the notebook's metadata records
it (`metadata.minicb.execution`: the date, the machine's cores, the limit, the timing cells'
indices, every load read and the highest). A notebook whose highest load exceeds
MAX_LOAD_PER_CORE × cores (1.5 on 2 cores) is not written: the script says so and exits 1,
leaving the committed files as they were. `MINICB_DRAFT_TIMINGS=1` writes it anyway, recorded
as a draft (`"draft": true`), which tests/book/test_timing_loads.py refuses to find committed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from jupytext.cli import jupytext as jupytext_cli

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PAIRING = "ipynb,md:myst"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
TIMING_MARKER = "# NBVAL_IGNORE_OUTPUT"         # the first line of a timing cell
MAX_LOAD_PER_CORE = 0.75                        # 1-minute load average per core: 1.5 on 2 cores
DRAFT_ENV = "MINICB_DRAFT_TIMINGS"              # =1: write a notebook run above it, as a draft
GATHERED = "## Every chapter's questions"       # the interview's generated section starts here
CHEAT_SHEET = "## Cheat sheet"                  # ... and ends here


def book_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The paired notebooks in reading order: the chapters, then the others (interview, ...)."""
    pairs = [path for path in sorted(folder.glob("*.ipynb")) if path.with_suffix(".md").exists()]
    return ([p for p in pairs if re.match(r"\d\d_", p.name)]
            + [p for p in pairs if not re.match(r"\d\d_", p.name)])


def sync(path: Path) -> None:
    """jupytext --sync: the newer file of the pair wins; outputs stay with the notebook."""
    jupytext_cli(["--sync", "--quiet", str(path)])


def gathered_interview_cells(folder: Path) -> list[str]:
    """The interview notebook's per-chapter sections, read from the chapter notebooks."""
    from minicb.viz.quiz import book_interview, interview_markdown

    questions = book_interview(folder)
    chapters = list(dict.fromkeys(q.chapter for q in questions))
    return [f"### {chapter}\n\n"
            + interview_markdown([q for q in questions if q.chapter == chapter])
            for chapter in chapters]


def refresh_interview(nb: nbformat.NotebookNode, folder: Path) -> nbformat.NotebookNode:
    """Replace the interview's gathered section (and the question count) with what the chapter
    notebooks in `folder` hold now: the questions live in the chapters, once."""
    sources = [cell.source for cell in nb.cells]
    start = next(i for i, s in enumerate(sources) if s.startswith(GATHERED)) + 1
    stop = next(i for i, s in enumerate(sources) if s.startswith(CHEAT_SHEET))
    fresh = gathered_interview_cells(folder)
    total = sum(s.count("<details>") for s in fresh)
    nb.cells[start:stop] = [nbformat.v4.new_markdown_cell(s) for s in fresh]
    nb.cells[0].source = re.sub(r"(gathers all\s+)\d+(\s+of them)", rf"\g<1>{total}\g<2>",
                                nb.cells[0].source)
    return nb


def timing_cells(nb: nbformat.NotebookNode) -> list[int]:
    """The indices of the cells whose output is wall-clock: first line TIMING_MARKER."""
    return [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            and cell.source.split("\n", 1)[0].strip() == TIMING_MARKER]


def load_limit(cores: int) -> float:
    return MAX_LOAD_PER_CORE * cores


def execute(nb: nbformat.NotebookNode, folder: Path, timeout: int) -> dict:
    """Run every cell; return the execution record: the 1-minute load average read before and
    after each timing cell, with the machine's cores and the limit they are held to."""
    from nbclient import NotebookClient

    timed, loads = set(timing_cells(nb)), []

    def read_load(cell_index: int, **_) -> None:
        if cell_index in timed:
            loads.append(round(os.getloadavg()[0], 2))

    NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(folder)}},
                   on_cell_execute=read_load, on_cell_executed=read_load).execute()
    cores = os.cpu_count() or 1
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cores": cores, "load_limit": load_limit(cores), "timing_cells": sorted(timed),
            "loads_1min": loads, "max_load_1min": max(loads, default=None)}


def too_loaded(record: dict) -> bool:
    """True when a timing cell ran above the record's load limit."""
    return record["max_load_1min"] is not None and record["max_load_1min"] > record["load_limit"]


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what differs between two runs of the same notebook but carries no content.

    The kernel's language_info stays whole, as JupyterLab writes it: with only part of it, a
    notebook shows as modified the moment a reader opens it (the kernel fills in the rest). Cell
    metadata the book uses (tags, `jupyter.source_hidden`) stays.
    """
    kept = {"minicb": nb.metadata["minicb"]} if "minicb" in nb.metadata else {}  # the load record
    nb.metadata = {"jupytext": {"formats": PAIRING}, "kernelspec": dict(KERNELSPEC),
                   "language_info": nb.metadata.get("language_info", {"name": "python"}), **kept}
    for index, cell in enumerate(nb.cells):
        cell.id = f"c{index:03d}"
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            output.get("metadata", {}).pop("transient", None)
    nbformat.validate(nb)
    return nb


class TooLoaded(RuntimeError):
    """A notebook's timing cells ran on a machine busier than the load guard allows."""


def process(path: Path, run: bool = True, timeout: int = 600) -> float:
    """Sync, (re)gather, execute and clean one paired notebook; return the seconds it ran.
    Raises TooLoaded, writing nothing, when its timing cells ran above the load limit (unless
    DRAFT_ENV is set: then it is written, marked a draft)."""
    sync(path)
    nb = nbformat.read(path, as_version=4)
    if path.stem == "interview":
        refresh_interview(nb, path.parent)
    start = time.perf_counter()
    if run:
        record = execute(nb, path.parent, timeout)
        if too_loaded(record) and os.environ.get(DRAFT_ENV) != "1":
            raise TooLoaded(f"{path.name}: its timing cells ran at a 1-minute load of up to "
                            f"{record['max_load_1min']} on {record['cores']} cores, above "
                            f"{record['load_limit']}; not written. Run it on a quieter machine, "
                            f"or set {DRAFT_ENV}=1 to write it as a draft.")
        nb.metadata["minicb"] = {"execution": {**record, "draft": too_loaded(record)}}
    seconds = time.perf_counter() - start
    nbformat.write(clean(nb), path)
    jupytext.write(nb, path.with_suffix(".md"), fmt="md:myst")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*",
                        help="chapter numbers (00, 01, ...) or notebook names; default: all")
    parser.add_argument("--no-execute", action="store_true",
                        help="sync and clean the pairs without running them")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a single cell may run")
    args = parser.parse_args(argv)
    paths = book_notebooks()
    if args.names:
        paths = [p for p in paths if p.name[:2] in args.names or p.stem in args.names]
        if not paths:
            parser.error(f"no paired notebook matches {args.names} in {NOTEBOOKS}")
    refused = []
    for path in paths:
        try:
            seconds = process(path, run=not args.no_execute, timeout=args.timeout)
        except TooLoaded as error:
            print(f"REFUSED {error}", file=sys.stderr)
            refused.append(path.name)
            continue
        verb = "executed" if not args.no_execute else "synced"
        print(f"{verb} {path.relative_to(ROOT)} in {seconds:.0f} s")
    if refused:
        print(f"not written (load above the guard): {', '.join(refused)}", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Write the book's chapter notebooks from their sources and execute them in place.

Each chapter's cells live in scripts/chapters/chNN_*.py as a Python list (`CELLS`) of
markdown and code strings, so a chapter is reviewed like code and rebuilt in one command:

    .venv/bin/python scripts/build_notebooks.py            # every chapter
    .venv/bin/python scripts/build_notebooks.py 00 03      # some chapters
    .venv/bin/python scripts/build_notebooks.py --no-execute

Execution uses `jupyter nbconvert --execute --inplace` with the kernel `python3` (the venv's,
installed by `make setup`). Afterwards the noise that changes on every run is stripped (execution
timestamps, widget state, interpreter version) and cell ids are numbered, so a rebuild only
changes the lines whose content changed. Wall-clock outputs sit in cells whose first line is
`# NBVAL_IGNORE_OUTPUT`; `pytest --nbval` compares every other output.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = Path(__file__).resolve().parent / "chapters"
NOTEBOOKS = ROOT / "notebooks"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def load_chapter(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(chapter) -> nbformat.NotebookNode:
    """A notebook from a chapter's CELLS: ("md" | "code", source) pairs."""
    nb = nbformat.v4.new_notebook()
    for index, (kind, source) in enumerate(chapter.CELLS):
        source = textwrap.dedent(source).strip("\n")
        new_cell = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
        cell = new_cell(source)
        cell.id = f"c{index:03d}"
        nb.cells.append(cell)
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    return nb


def execute(path: Path, timeout: int) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                    "--inplace", "--ExecutePreprocessor.kernel_name=python3",
                    f"--ExecutePreprocessor.timeout={timeout}",
                    str(path)], check=True, cwd=path.parent)
    return time.perf_counter() - start


def strip_noise(path: Path) -> None:
    """Drop what differs between two runs of the same notebook but carries no content.

    The kernel's language_info stays whole, as JupyterLab writes it: with only part of it, a
    notebook shows as modified the moment a reader opens it (the kernel fills in the rest).
    """
    nb = nbformat.read(path, as_version=4)
    nb.metadata = {"kernelspec": dict(KERNELSPEC),
                   "language_info": nb.metadata.get("language_info", {})}
    for index, cell in enumerate(nb.cells):
        cell.id = f"c{index:03d}"
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            output.get("metadata", {}).pop("transient", None)
    nbformat.validate(nb)
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*",
                        help="chapter numbers (00, 01, ...) or interview; default: all")
    parser.add_argument("--no-execute", action="store_true",
                        help="write the notebooks without running them")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a single cell may run")
    args = parser.parse_args(argv)
    sources = sorted(CHAPTERS.glob("ch[0-9][0-9]_*.py")) + [CHAPTERS / "interview.py"]
    if args.chapters:
        sources = [s for s in sources if s.name[2:4] in args.chapters or s.stem in args.chapters]
        if not sources:
            parser.error(f"no chapter source matches {args.chapters} in {CHAPTERS}")
    for source in sources:
        chapter = load_chapter(source)
        path = (NOTEBOOKS
                / f"{source.stem[2:] if source.stem.startswith('ch') else source.stem}.ipynb")
        nbformat.write(build(chapter), path)
        if args.no_execute:
            print(f"wrote {path.relative_to(ROOT)}")
            continue
        seconds = execute(path, args.timeout)
        strip_noise(path)
        print(f"executed {path.relative_to(ROOT)} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

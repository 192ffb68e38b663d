"""docs/ARCHITECTURE.md lists the files the chapters display, so a contributor knows which
chapters to re-execute after a change; this keeps the list equal to the committed chapters."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- displayed-files: begin -->", "<!-- displayed-files: end -->"
# the header minicb.viz.show_source / show_file writes above a listing
HEADER = re.compile(r"\*\*`((?:minicb|kernels)/[\w/]+\.\w+), lines \d+-\d+`\*\*")


def displayed() -> dict[str, list[str]]:
    """file -> the chapters (notebook stems) whose committed outputs show part of it."""
    shown = defaultdict(set)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            for output in cell.get("outputs", []):
                text = output.get("data", {}).get("text/markdown", "")
                for path in HEADER.findall("".join(text) if isinstance(text, list) else text):
                    shown[path].add(notebook.stem)
    return {path: sorted(stems) for path, stems in sorted(shown.items())}


def expected_block() -> str:
    return "\n".join(f"- `{path}`: {', '.join(stems)}" for path, stems in displayed().items())


def test_the_architecture_lists_every_displayed_file():
    text = ARCHITECTURE.read_text()
    listed = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    assert displayed(), "no chapter displays any of minicb's files: the header format changed?"
    assert listed == expected_block(), (
        "docs/ARCHITECTURE.md's list of displayed files is stale; put this between its "
        f"displayed-files markers:\n{expected_block()}")


LISTING = re.compile(r"\*\*`((?:minicb|kernels)/[\w/]+\.\w+), lines (\d+)-(\d+)`\*\*"
                     r"\n\n```\w*\n(.*?)\n```", re.DOTALL)


def test_every_committed_listing_still_matches_its_lines():
    """A change to a displayed file that moves or edits the lines a chapter shows makes that
    chapter's committed listing stale; this names the chapter to re-execute, in a fraction of
    a second, before the notebook checks would."""
    stale, seen = [], 0
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            for output in cell.get("outputs", []):
                text = output.get("data", {}).get("text/markdown", "")
                text = "".join(text) if isinstance(text, list) else text
                for path, first, last, body in LISTING.findall(text):
                    seen += 1
                    source = (ROOT / path).read_text().splitlines()
                    shown = [re.sub(r"^ *\d+ ?", "", line, count=1)
                             for line in body.splitlines()]
                    wanted = [line.strip() for line in source[int(first) - 1:int(last)]]
                    if [line.strip() for line in shown] != wanted:
                        stale.append(f"{notebook.name}: {path}, lines {first}-{last}")
    assert seen > 20, f"only {seen} listings found: the listing format changed?"
    assert not stale, ("these chapters show lines that have since changed; re-execute them "
                       "(scripts/execute_notebooks.py NN) and run scripts/displayed_files.py:\n"
                       + "\n".join(stale))

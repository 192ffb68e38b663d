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

"""No number with a unit or a ratio is typed into the book's prose.

A sentence that quotes a measured, simulated or fitted number is displayed by a code cell that
builds it from the value (`display(Markdown(f"..."))`, its input hidden); a number from outside
comes from the cited facts table `minicb/facts.py` through such a cell. So the markdown cells of
every notebook hold no number followed by a unit or a ratio: ×, an x after a number, %, s, ms,
µs, us, ns, tok/s, tokens/s, requests/s, GB, GiB, MB, MiB, KiB, TB/s, FLOP(s), TFLOP/s, bytes,
"times". Code cells, and what they print or render, are not scanned: that is evidence.

A chapter's "## Interview questions" stay plain markdown: the interview notebook gathers them
from the chapters' markdown cells (`minicb.viz.quiz.book_interview`) into its own, so they too
hold no typed number with a unit (a rendered one would not be gathered).

The few sentences allowed to keep a typed number are listed once, in `EXCEPTIONS` below, each
with its reason. Rewriting the prose is better than adding a row.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


@dataclass(frozen=True)
class Allowed:
    notebook: str        # a notebook's file name, or "*" for every notebook
    text: str            # the exact text in a markdown cell that holds the typed number
    reason: str


# The one list of typed numbers allowed in markdown cells. Each row must still match a typed
# number in its notebook (a stale row fails), so the list cannot quietly grow.
EXCEPTIONS: list[Allowed] = [
    Allowed("*", "TTFT ≤ 1 s", "the book's example latency target, a stated goal, not a result"),
    Allowed("*", "TPOT ≤ 50 ms", "the book's example latency target, a stated goal, not a result"),
    Allowed("01_naive_serving.ipynb", "64 × 2 bytes = 16,384 bytes = 16 KiB",
            "a recall exercise's arithmetic on the sizes its question gives"),
]

NUMBER = r"(?<![\w.$/\\-])\d+(?:[,\u202f]\d{3})*(?:\.\d+)?"
# a ratio or a unit right after a number (one optional space, a range "2-3", "2–3", "2 to 3")
UNIT = (r"(?:×|\\times\b|x\b|%|\\%|"
        r"tok(?:en)?s?/s\b|req(?:uest)?s?/s\b|[A-Za-z]+/s\b|"
        r"[kKMGT]i?B\b|[GM]b/s|bytes?\b|"
        r"(?:[kMGTP])?FLOPs?\b|(?:[kMGTP])?FLOP/s|"
        r"ms\b|µs\b|μs\b|us\b|ns\b|s\b|sec(?:onds?)?\b|minutes?\b|"
        r"times\b)")
TYPED = re.compile(
    rf"(?P<number>{NUMBER})(?:\s?(?:-|–|to)\s?{NUMBER})?\s?(?:\\,|&nbsp;| )?(?P<unit>{UNIT})")
# a multiplication between two numbers or a number and a code name ("2 × 32 × 4096",
# "2 × `head_dim`") is arithmetic, not a ratio; so is a remainder ("37 % 16")
PRODUCT = re.compile(r"\s*(?:\\,)?\s*[\d(`$]")
MODULO = re.compile(r"\s+\d")

# what is not prose: links' targets, HTML tags and their attributes, MyST roles' targets
NOT_PROSE = [re.compile(p) for p in (
    r"\]\([^)]*\)",              # [text](target)
    r"<[^>]+>",                  # <img width="80%">, <details>
    r"https?://\S+",
)]


@dataclass(frozen=True)
class Typed:
    notebook: str
    cell: int
    text: str               # the match
    context: str            # the sentence around it
    span: tuple[int, int]


def _blank(source: str) -> str:
    """The cell with what is not prose replaced by spaces (offsets are kept)."""
    for pattern in NOT_PROSE:
        source = pattern.sub(lambda m: " " * len(m.group()), source)
    return source


def typed_numbers(cells: list[dict], notebook: str) -> list[Typed]:
    """Every number with a unit or a ratio typed into a markdown cell of `cells` (nbformat
    dicts), with the cell's index and the text around it."""
    found = []
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "markdown":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        prose = _blank(source)
        for match in TYPED.finditer(prose):
            unit = match.group("unit")
            if unit in ("×", "\\times", "x") and PRODUCT.match(prose, match.end()):
                continue
            if unit == "%" and MODULO.match(prose, match.end()):
                continue
            start, end = match.span()
            left = max(source.rfind("\n", 0, start), source.rfind(". ", 0, start)) + 1
            right = min(i for i in (source.find("\n", end), len(source)) if i >= 0)
            found.append(Typed(notebook, index, match.group(), source[left:right].strip(),
                               (start, end)))
    return found


def _allowed(hit: Typed, cells: list[dict]) -> Allowed | None:
    cell = cells[hit.cell]
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    for row in EXCEPTIONS:
        if row.notebook not in ("*", hit.notebook):
            continue
        for occurrence in re.finditer(re.escape(row.text), source):
            if occurrence.start() <= hit.span[0] and hit.span[1] <= occurrence.end():
                return row
    return None


def check_notebook(path: Path) -> tuple[list[Typed], set[Allowed]]:
    """The typed numbers of one notebook that no exception allows, and the exceptions used."""
    cells = json.loads(path.read_text())["cells"]
    offending, used = [], set()
    for hit in typed_numbers(cells, path.name):
        row = _allowed(hit, cells)
        if row is None:
            offending.append(hit)
        else:
            used.add(row)
    return offending, used


def report(offending: list[Typed]) -> str:
    return "\n".join(f"  {h.notebook} markdown cell {h.cell}: {h.text!r} in: {h.context}"
                     for h in offending)


NOTEBOOK_PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOK_PATHS, ids=[p.stem for p in NOTEBOOK_PATHS])
def test_no_typed_number_in_prose(path):
    offending, used = check_notebook(path)
    assert not offending, (
        f"{len(offending)} number(s) with a unit or ratio typed into markdown; render each from "
        "the value that produced it (display(Markdown(f'...')) in a hidden-input cell) or from "
        "minicb.facts, or rewrite the sentence:\n" + report(offending))
    stale = [row for row in EXCEPTIONS if row.notebook == path.name and row not in used]
    assert not stale, f"exceptions that no longer match a typed number in {path.name}: {stale}"


def test_every_exception_names_a_notebook():
    names = {p.name for p in NOTEBOOK_PATHS}
    assert all(row.notebook == "*" or row.notebook in names for row in EXCEPTIONS)
    assert all(row.reason.strip() for row in EXCEPTIONS)


def _markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code_rendering(text: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "display(...)",
            "outputs": [{"output_type": "display_data", "metadata": {},
                         "data": {"text/markdown": text, "text/plain": "<Markdown>"}}]}


def test_a_planted_typed_number_is_found(tmp_path):
    """The scanner flags a typed ratio in a markdown cell, and passes the same sentence when a
    code cell renders it."""
    sentence = "On this CPU, 64 decodes cost 1.6 times one."
    planted = tmp_path / "planted.ipynb"
    planted.write_text(json.dumps({"cells": [_markdown("# A chapter"), _markdown(sentence)],
                                   "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    offending, _ = check_notebook(planted)
    assert [(h.cell, h.text) for h in offending] == [(1, "1.6 times")]
    assert "planted.ipynb markdown cell 1" in report(offending)

    rendered = tmp_path / "rendered.ipynb"
    rendered.write_text(json.dumps({"cells": [_markdown("# A chapter"), _code_rendering(sentence)],
                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert check_notebook(rendered) == ([], set())


@pytest.mark.parametrize("text, typed", [
    ("a 6-row step costs 1.6× a 1-row step", ["1.6×"]),
    ("about 2x faster", ["2x"]),
    ("about 2 \\times faster", ["2 \\times"]),
    ("a step takes 12.7 ms on the A100", ["12.7 ms"]),
    ("the p99 is 3 s", ["3 s"]),
    ("waiting 90 % of the time, or 90%", ["90 %", "90%"]),
    ("HBM moves 3.35 TB/s", ["3.35 TB/s"]),
    ("the weights fill 13.5 GB, the cache 2 GiB, a block 16 KiB", ["13.5 GB", "2 GiB", "16 KiB"]),
    ("312 TFLOP/s and 7 FLOPs per byte", ["312 TFLOP/s", "7 FLOPs"]),
    ("it served 1,234 tok/s and 40 tokens/s and 15.8 requests/s", ["1,234 tok/s", "40 tokens/s",
                                                                   "15.8 requests/s"]),
    ("took 350 µs or 350 us", ["350 µs", "350 us"]),
    ("between 1.1 and 1.6 times, or 5.9–6.2×", ["1.6 times", "5.9–6.2×"]),
    # not ratios or units: shapes, counts, chapter numbers, years, identifiers
    ("a 2 × 4096 matrix, 32 layers, chapter 05, in 2023, Llama-2-7b, fp16, sm_80", []),
    ("2 × `head_dim` values; offset 37 % 16 = 5", []),
    ("[the paper](https://arxiv.org/abs/2309.06180) <img width=\"80%\">", []),
    ("`x2` and h100s and v0.6", []),
])
def test_what_counts_as_typed(text, typed):
    assert [h.text for h in typed_numbers([_markdown(text)], "t.ipynb")] == typed


def test_a_row_in_the_exception_list_allows_exactly_its_text(tmp_path, monkeypatch):
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps({"cells": [_markdown("The seed asks for 10 tokens, 2 s later; "
                                                    "the step took 8 ms.")],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    row = Allowed("x.ipynb", "2 s later", "a given of the example")
    monkeypatch.setitem(globals(), "EXCEPTIONS", [row])
    offending, used = check_notebook(path)
    assert [h.text for h in offending] == ["8 ms"] and used == {row}

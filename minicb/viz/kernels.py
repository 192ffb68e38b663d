"""Pictures and records for the kernel chapter: how a paged kernel finds a key (position → block
table → physical block → address), and the GPU measurements `python -m minicb bench kernels`
wrote, if any."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from minicb.config import blocks_for
from minicb.viz.base import PALETTE, new_figure


def paged_lookup(block_table: Sequence[int], block_size: int, seq_len: int, num_blocks: int,
                 position: int | None = None, width: float = 8.0) -> Figure:
    """A request's keys in logical order (top) and where they sit in the pool (bottom).

    Each logical block i of the request points at physical block block_table[i]; `position`, if
    given, is highlighted with its block, offset and slot (block * block_size + offset).
    """
    needed = blocks_for(seq_len, block_size)
    if len(block_table) < needed:
        raise ValueError(f"{seq_len} keys need {needed} blocks of {block_size}; the table has "
                         f"{len(block_table)}.")
    if any(not 0 <= b < num_blocks for b in block_table[:needed]):
        raise ValueError(f"block table {list(block_table[:needed])} names blocks outside the pool "
                         f"of {num_blocks}.")
    if position is not None and not 0 <= position < seq_len:
        raise ValueError(f"position {position} is not one of the request's {seq_len} keys.")
    cell = 1.0 / block_size
    fig, (ax,) = new_figure(width, 3.2)
    top, bottom = 2.0, 0.0
    for logical in range(needed):
        colour = PALETTE[logical % len(PALETTE)]
        physical = block_table[logical]
        for offset in range(block_size):
            p = logical * block_size + offset
            filled = p < seq_len
            hit = p == position
            face = colour if filled else "white"
            edge = "black" if hit else "white" if filled else "#cccccc"
            ax.add_patch(Rectangle((logical * 1.2 + offset * cell, top), cell, 0.6, facecolor=face,
                                   edgecolor=edge, linewidth=2.5 if hit else 0.5))
            ax.add_patch(Rectangle((physical * 1.2 + offset * cell, bottom), cell, 0.6,
                                   facecolor=face, edgecolor=edge, linewidth=2.5 if hit else 0.5))
        ax.text(logical * 1.2 + 0.5, top + 0.8, f"logical {logical}\npositions "
                f"{logical * block_size}–"
                f"{(logical + 1) * block_size - 1}", ha="center", fontsize=7)
        ax.add_patch(FancyArrowPatch((logical * 1.2 + 0.5, top - 0.05),
                                     (physical * 1.2 + 0.5, bottom + 0.65), arrowstyle="-|>",
                                     mutation_scale=10, color=colour, linewidth=1.2))
    for block in range(num_blocks):
        if block not in block_table[:needed]:
            ax.add_patch(Rectangle((block * 1.2, bottom), 1.0, 0.6, facecolor="#f2f2f2",
                                   edgecolor="#cccccc"))
        ax.text(block * 1.2 + 0.5, bottom - 0.3, f"block {block}", ha="center", fontsize=7)
    ax.text(-0.2, top + 0.3, "the request's keys", ha="right", va="center", fontsize=8)
    ax.text(-0.2, bottom + 0.3, "the KV pool", ha="right", va="center", fontsize=8)
    title = f"block table {list(block_table[:needed])}, block_size {block_size}"
    if position is not None:
        block, offset = block_table[position // block_size], position % block_size
        title += (f": position {position} → table[{position} // {block_size}] = block {block}, "
                  f"offset {position} % {block_size} = {offset}, slot "
                  f"{block * block_size + offset}")
    ax.set_title(title, fontsize=9)
    ax.set_xlim(-2.2, max(num_blocks, needed) * 1.2)
    ax.set_ylim(bottom - 0.6, top + 1.4)
    ax.axis("off")
    return fig


def recorded_kernel_results(results_dir: str | Path) -> list[dict]:
    """The GPU runs of `python -m minicb bench kernels` found in `results_dir`
    (kernels-<device>.json; interpreter dry runs are left out), each with the path of its plot."""
    runs = []
    for path in sorted(Path(results_dir).glob("kernels-*.json")):
        record = json.loads(path.read_text())
        if record.get("dry_run"):
            continue
        record["plot_path"] = str(path.with_suffix(".png"))
        runs.append(record)
    return runs

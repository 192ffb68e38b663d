"""Pictures of how the Triton decode kernel divides its work (chapter 05).

`decode_programs` lists what each program of a decode launch reads, and `split_ranges` the key
range each split-KV program takes, both with the kernel's own arithmetic
(`kernels/paged_attention.py`: program (i, h) serves request i and KV head h; its loop walks the
keys BLOCK_N at a time through the block table; with splits, each takes whole BLOCK_N tiles of
ceil(keys / splits)). The figures draw those lists, so a picture cannot disagree with the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from minicb.viz.base import PALETTE, new_figure


@dataclass
class BlockRead:
    iteration: int       # which pass of the program's loop (BLOCK_N keys each)
    logical: int         # the request's block number
    physical: int        # where it sits in the pool (block_table[logical])
    keys: int            # keys of this block the pass reads


def decode_programs(seq_lens: Sequence[int], block_tables: Sequence[Sequence[int]],
                    block_size: int, block_n: int = 64) -> list[list[BlockRead]]:
    """For each request (a row of the launch grid), the blocks its programs read, pass by pass.

    Every KV head of a request reads the same blocks (each at its own head offset), so one list
    per request describes a whole row of programs."""
    if len(seq_lens) != len(block_tables):
        raise ValueError(f"{len(seq_lens)} requests but {len(block_tables)} block tables")
    if block_n % block_size and block_size % block_n:
        raise ValueError("block_n and block_size must divide one another for this picture")
    plans = []
    for seq_len, table in zip(seq_lens, block_tables):
        needed = -(-seq_len // block_size)
        if len(table) < needed:
            raise ValueError(f"{seq_len} keys need {needed} blocks; the table has {len(table)}")
        reads = []
        for logical in range(needed):
            start = logical * block_size
            reads.append(BlockRead(start // block_n, logical, int(table[logical]),
                                   min(block_size, seq_len - start)))
        plans.append(reads)
    return plans


def split_ranges(seq_len: int, num_splits: int, block_n: int = 64) -> list[tuple[int, int]]:
    """The [lo, hi) keys each split-KV program of one decode takes, as the kernel computes them:
    whole BLOCK_N tiles of ceil(seq_len / num_splits), the last split what is left (a split can
    be empty when the tiles run out)."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be at least 1; got {num_splits}")
    per_split = -(-seq_len // num_splits)
    per_split = -(-per_split // block_n) * block_n
    ranges = []
    for split in range(num_splits):
        lo = split * per_split
        ranges.append((min(lo, seq_len), min(lo + per_split, seq_len)))
    return ranges


def decode_grid_picture(seq_lens: Sequence[int], block_tables: Sequence[Sequence[int]],
                        block_size: int, num_kv_heads: int, group: int, block_n: int = 64,
                        width: float = 10.0) -> Figure:
    """Left: the launch grid, one program per (request, KV head), each serving `group` query
    heads. Right: what the programs of each request read: its blocks in logical order, labelled
    with their physical ids, shaded by the loop pass (BLOCK_N keys) that reads them."""
    plans = decode_programs(seq_lens, block_tables, block_size, block_n)
    fig, (grid_ax, loop_ax) = new_figure(width, 1.0 + 0.75 * len(seq_lens), cols=2,
                                         gridspec_kw={"width_ratios": [1, 2.2]})
    for i in range(len(seq_lens)):
        for h in range(num_kv_heads):
            colour = PALETTE[i % len(PALETTE)]
            grid_ax.add_patch(Rectangle((h, -i - 0.9), 0.92, 0.8, facecolor=colour, alpha=0.35,
                                        edgecolor=colour))
            heads = f"{h * group}–{h * group + group - 1}" if group > 1 else f"{h * group}"
            grid_ax.text(h + 0.46, -i - 0.5, f"program ({i}, {h})\nq heads {heads}",
                         ha="center", va="center", fontsize=7)
    grid_ax.set_xlim(-0.1, num_kv_heads)
    grid_ax.set_ylim(-len(seq_lens) - 0.2, 0.4)
    grid_ax.set_title("the launch grid: program_id(0) = request,\nprogram_id(1) = KV head",
                      fontsize=9)
    grid_ax.axis("off")
    longest = max((len(p) for p in plans), default=1)
    for i, reads in enumerate(plans):
        colour = PALETTE[i % len(PALETTE)]
        for read in reads:
            x = read.logical * 1.1
            shade = 0.75 if read.iteration % 2 == 0 else 0.35
            loop_ax.add_patch(Rectangle((x, -i - 0.9), read.keys / block_size, 0.8,
                                        facecolor=colour, alpha=shade, edgecolor="black",
                                        linewidth=0.5))
            loop_ax.text(x + 0.5, -i - 0.5, f"block {read.physical}", ha="center",
                         va="center", fontsize=7)
        passes = reads[-1].iteration + 1 if reads else 0
        loop_ax.text(longest * 1.1 + 0.1, -i - 0.5, f"request {i}: {seq_lens[i]} keys,\n"
                     f"{passes} pass{'es' if passes != 1 else ''} of {block_n} keys", va="center",
                     fontsize=7)
    loop_ax.add_patch(FancyArrowPatch((0, 0.25), (longest * 1.1 - 0.1, 0.25), arrowstyle="-|>",
                                      mutation_scale=10, color="black"))
    loop_ax.text(0, 0.45, "the loop: keys in logical order, each block fetched through the "
                 "request's block table (shade = loop pass)", fontsize=7)
    loop_ax.set_xlim(-0.1, longest * 1.1 + 2.6)
    loop_ax.set_ylim(-len(seq_lens) - 0.2, 0.8)
    loop_ax.set_title("what each row of programs reads", fontsize=9)
    loop_ax.axis("off")
    return fig


def split_kv_picture(seq_len: int, num_splits: int, block_n: int = 64,
                     width: float = 9.0) -> Figure:
    """One request's keys cut into the split programs' ranges (top), each producing its partial
    (max m, sum l, output o), and the merge that reweights them into one softmax (bottom)."""
    ranges = split_ranges(seq_len, num_splits, block_n)
    fig, (ax,) = new_figure(width, 3.2)
    scale = 10.0 / max(seq_len, 1)
    for split, (lo, hi) in enumerate(ranges):
        colour = PALETTE[split % len(PALETTE)]
        if hi > lo:
            ax.add_patch(Rectangle((lo * scale, 2.0), (hi - lo) * scale, 0.6, facecolor=colour,
                                   alpha=0.6, edgecolor="black", linewidth=0.6))
        middle = (lo + max(hi, lo + 1)) / 2 * scale
        ax.text(middle, 2.75, f"split {split}\nkeys {lo}–{hi - 1}" if hi > lo else
                f"split {split}\n(empty)", ha="center", fontsize=7)
        centre = (split + 0.5) * 10.0 / num_splits
        ax.add_patch(Rectangle((centre - 0.55, 1.0), 1.1, 0.5, facecolor="white",
                               edgecolor=colour, linewidth=1.2))
        ax.text(centre, 1.25, f"m{split}, l{split}, o{split}", ha="center", va="center",
                fontsize=7)
        ax.add_patch(FancyArrowPatch((middle, 1.98), (centre, 1.52), arrowstyle="-|>",
                                     mutation_scale=8, color=colour))
        ax.add_patch(FancyArrowPatch((centre, 0.98), (5.0, 0.42), arrowstyle="-|>",
                                     mutation_scale=8, color=colour))
    ax.add_patch(Rectangle((0.6, -0.1), 8.8, 0.5, facecolor="#f2f2f2", edgecolor="black"))
    ax.text(5.0, 0.15, "merge: lse_s = m_s + log l_s;  out = Σ e^(lse_s − max lse) o_s / "
            "Σ e^(lse_s − max lse)", ha="center", va="center", fontsize=7)
    ax.text(-0.1, 2.3, "keys", ha="right", va="center", fontsize=8)
    ax.text(-0.1, 1.25, "one program\neach", ha="right", va="center", fontsize=8)
    ax.set_title(f"split-KV: {seq_len} keys over {num_splits} programs, whole tiles of "
                 f"{block_n} keys each", fontsize=9)
    ax.set_xlim(-1.6, 10.4)
    ax.set_ylim(-0.3, 3.4)
    ax.axis("off")
    return fig

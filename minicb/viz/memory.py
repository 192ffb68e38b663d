"""Pictures of the paged KV cache: which request holds which physical block at every step, when
a finished request's blocks go to the next one, and how many blocks are free.

All of them read the block tables that `minicb.sim.simulate(..., record_blocks=True)` records
after each step's allocation, so they show the real KV manager's decisions.
"""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from minicb.sim import SimResult
from minicb.viz.base import PALETTE, new_figure, request_colour


def block_owners(result: SimResult) -> list[dict[int, list[str]]]:
    """Per step: physical block → the requests whose block table holds it (several when shared)."""
    if result.steps and not any(step.block_tables for step in result.steps):
        raise ValueError("this SimResult has no block tables; run simulate(..., "
                         "record_blocks=True).")
    owners = []
    for step in result.steps:
        held: dict[int, list[str]] = {}
        for request_id, table in step.block_tables.items():
            for block in table:
                held.setdefault(block, []).append(request_id)
        owners.append(held)
    return owners


def block_reuse(result: SimResult) -> list[tuple[int, int, str, str]]:
    """(step, block, previous holder, new holder) for every block that changed hands: held in
    `step` by requests none of which held it the last time it was in use."""
    last_holders: dict[int, list[str]] = {}
    events = []
    for step, held in zip(result.steps, block_owners(result)):
        for block, holders in sorted(held.items()):
            previous = last_holders.get(block)
            if previous and not set(previous) & set(holders):
                events.append((step.step, block, previous[0], holders[0]))
            last_holders[block] = holders
    return events


def block_map(result: SimResult, names: Mapping[str, str] | None = None,
              num_blocks: int | None = None, title: str | None = None,
              width: float = 8.0) -> Figure:
    """Physical blocks (rows) against engine steps (columns), coloured by the request holding them.

    A black bar on a cell's left edge marks a block changing hands: the free list gave a block
    that a finished (or preempted) request returned to another request.
    """
    owners = block_owners(result)
    names = names or {}
    used = [block for held in owners for block in held]
    num_blocks = num_blocks or (max(used) + 1 if used else result.config.num_kv_blocks)
    reused = {(step, block) for step, block, _, _ in block_reuse(result)}
    fig, (ax,) = new_figure(width, 1.4 + min(0.22 * num_blocks, 6.0))
    for column, (step, held) in enumerate(zip(result.steps, owners)):
        x = column + 0.5
        for block, holders in held.items():
            if block >= num_blocks:
                continue
            shared = len(holders) > 1
            ax.add_patch(Rectangle((x, block - 0.45), 1, 0.9, facecolor=request_colour(holders[0]),
                                   edgecolor="white", hatch="xx" if shared else None,
                                   linewidth=0.5))
            label = "+".join(names.get(h, h) for h in holders)
            ax.text(x + 0.5, block, label, ha="center", va="center", color="white", fontsize=7,
                    fontweight="bold")
            if (step.step, block) in reused:
                ax.plot([x + 0.04, x + 0.04], [block - 0.45, block + 0.45], color="black",
                        linewidth=3)
    steps = len(result.steps)
    ax.set_xlim(0.5, steps + 0.5)
    ax.set_ylim(num_blocks - 0.5, -0.5)
    ax.set_xticks(range(1, steps + 1, 1 if steps <= 24 else -(-steps // 24)))
    every = -(-num_blocks // 16)
    ax.set_yticks(range(0, num_blocks, every), [f"block {b}" for b in range(0, num_blocks, every)])
    ax.set_xlabel("engine step")
    ax.set_title(title or f"block map: {len(reused)} blocks handed from one request to another",
                 fontsize=10)
    handles = [Patch(facecolor="#888888", label="held by the request named in it"),
               Line2D([], [], color="black", marker="|", linestyle="None", markersize=10,
                      markeredgewidth=3, label="handed over: another request held it before")]
    if any(len(h) > 1 for held in owners for h in held.values()):
        handles.append(Patch(facecolor="#888888", hatch="xx", label="shared (reference count > 1)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8,
               frameon=False)
    return fig


def free_blocks_timeline(results: Mapping[str, SimResult], title: str | None = None,
                         width: float = 8.0) -> Figure:
    """Free KV blocks after every step, one line per run; a cross marks a step that preempted."""
    fig, (ax,) = new_figure(width, 3.0)
    for colour, (label, result) in zip(PALETTE * 4, results.items()):
        steps = [s.step for s in result.steps]
        free = [s.num_free_blocks for s in result.steps]
        preempted = sum(len(s.preempted) for s in result.steps)
        ax.step(steps, free, where="mid", color=colour, label=f"{label}: {preempted} preemptions")
        marks = [(s.step, s.num_free_blocks) for s in result.steps if s.preempted]
        if marks:
            ax.plot(*zip(*marks), "x", color=colour, markersize=7, markeredgewidth=2)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("engine step")
    ax.set_ylabel("free KV blocks")
    # below the axes: a run whose blocks all come back ends at the pool's size, top right, where
    # a legend inside the axes would sit on it
    fig.legend(loc="outside lower center", ncols=min(len(results), 3), fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    ax.set_title(title or "free blocks after each step (x: a request was preempted)", fontsize=10)
    return fig

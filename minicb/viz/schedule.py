"""Pictures of a schedule: which request occupied which batch slot at every step, and how much
of the KV memory the running requests reserved versus filled.

Both read `minicb.sim.SimResult.steps`, so every picture is drawn from the real scheduler's
decisions, never from a separate toy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from minicb.sim import SimResult, StepRecord
from minicb.viz.base import IDLE_HATCH, darker, new_figure, request_colour

Cell = tuple[str, str]   # (request id, "prefill" | "decode" | "idle")


def slot_grid(steps: Sequence[StepRecord], num_slots: int) -> list[list[Cell | None]]:
    """grid[slot][i]: what slot `slot` did in steps[i], or None when it was empty.

    A request keeps its slot for as long as it stays in the batch; a newcomer takes the lowest
    slot that is free this step, so a request that leaves hands its slot to the next arrival.
    """
    grid: list[list[Cell | None]] = [[None] * len(steps) for _ in range(num_slots)]
    slot_of: dict[str, int] = {}
    for column, step in enumerate(steps):
        present = {request_id for request_id, _, _ in step.rows}
        slot_of = {r: s for r, s in slot_of.items() if r in present}
        for request_id, kind, _ in step.rows:
            if request_id not in slot_of:
                taken = set(slot_of.values())
                free = next((s for s in range(num_slots) if s not in taken), None)
                if free is None:
                    raise ValueError(f"step {step.step} runs {len(step.rows)} requests but the "
                                     f"picture has only {num_slots} slots; pass a larger "
                                     "num_slots.")
                slot_of[request_id] = free
            grid[slot_of[request_id]][column] = (request_id, kind)
    return grid


def _runs(row: list[Cell | None]) -> list[tuple[int, int, Cell]]:
    """Consecutive equal cells of one slot as (first column, length, cell); empty cells skipped."""
    runs: list[tuple[int, int, Cell]] = []
    for column, cell in enumerate(row):
        if cell is None:
            continue
        if runs and runs[-1][2] == cell and runs[-1][0] + runs[-1][1] == column:
            start, length, _ = runs[-1]
            runs[-1] = (start, length + 1, cell)
        else:
            runs.append((column, 1, cell))
    return runs


def draw_slots(ax: Axes, result: SimResult, num_slots: int | None = None,
               names: Mapping[str, str] | None = None, title: str | None = None,
               num_steps: int | None = None) -> None:
    """Draw a slot timeline on `ax`: rows are slots, columns steps, colour the request.

    Prefill cells are darker; hatched cells are rows a static batch still computes for a
    request that has already finished (idle capacity); white is an empty slot.
    """
    num_slots = num_slots or result.config.max_num_seqs
    grid = slot_grid(result.steps, num_slots)
    names = names or {}
    total = num_steps or len(result.steps)
    # label a request where it enters a slot, if its stay there is wide enough to hold a label
    min_label_width = max(1.0, total / 25)
    for slot, row in enumerate(grid):
        for start, length, (request_id, kind) in _runs(row):
            colour = request_colour(request_id)
            x = start + 0.5        # step i (1-based) spans [i - 0.5, i + 0.5]
            if kind == "idle":
                ax.add_patch(Rectangle((x, slot - 0.4), length, 0.8, facecolor="white",
                                       edgecolor=colour, hatch=IDLE_HATCH, linewidth=0.8))
                continue
            face = darker(colour) if kind == "prefill" else colour
            ax.add_patch(Rectangle((x, slot - 0.4), length, 0.8, facecolor=face, edgecolor="white",
                                   linewidth=0.5))
        stays = _runs([None if cell is None else (cell[0], "") for cell in row])
        for start, length, (request_id, _) in stays:
            if length >= min_label_width:
                ax.text(start + 0.5 + min_label_width / 2, slot, names.get(request_id, request_id),
                        ha="center", va="center", color="white", fontsize=8, fontweight="bold")
            elif request_id in names:
                # a named request too short to hold its label: the label goes just after it,
                # so a short request at the end of a long schedule is still identified
                ax.text(start + 0.5 + length + total / 200, slot, names[request_id],
                        ha="left", va="center", color="black", fontsize=8, fontweight="bold")
    ax.set_xlim(0.5, total + 0.5)
    ax.set_ylim(num_slots - 0.5, -0.5)
    every = -(-num_slots // 8)          # at most eight slot labels
    ax.set_yticks(range(0, num_slots, every), [f"slot {s}" for s in range(0, num_slots, every)])
    ax.set_xlabel("engine step")
    if total <= 40:
        ax.set_xticks(range(1, total + 1, 1 if total <= 20 else 2))
    ax.axvline(len(result.steps) + 0.5, color="black", linestyle="--", linewidth=1)
    ax.set_title(title or f"{result.config.scheduler}: {result.num_steps} steps, "
                          f"{result.slot_utilisation():.0%} of slot-steps busy", fontsize=10)


def slots_height(num_slots: int) -> float:
    """Inches for the slot rows: roomy for a few slots, compressed beyond a dozen."""
    return min(0.3 * num_slots, 1.2 + 0.05 * num_slots)


def slot_legend(fig: Figure) -> None:
    handles = [Patch(facecolor="#555555", label="prefill (darker)"), Patch(
        facecolor="#aaaaaa", label="decode"),
               Patch(facecolor="white", edgecolor="#555555", hatch=IDLE_HATCH,
                     label="idle: finished, still holding its row"),
               Patch(facecolor="white", edgecolor="#cccccc", label="empty slot")]
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=8, frameon=False)


def slot_timeline(result: SimResult, num_slots: int | None = None,
                  names: Mapping[str, str] | None = None, title: str | None = None,
                  width: float = 8.0) -> Figure:
    """One schedule as a slot timeline (see `draw_slots`)."""
    num_slots = num_slots or result.config.max_num_seqs
    fig, (ax,) = new_figure(width, 1.3 + slots_height(num_slots))
    draw_slots(ax, result, num_slots, names, title)
    slot_legend(fig)
    return fig


def compare_timelines(results: Mapping[str, SimResult], num_slots: int | None = None,
                      names: Mapping[str, str] | None = None, width: float = 8.0,
                      share_steps: bool | None = None) -> Figure:
    """Several schedules of the same workload stacked, labelled by the keys; each drawn with its
    own max_num_seqs slots unless num_slots is given.

    They share one step axis when their lengths are comparable (the longest at most twice the
    shortest), so the eye compares lengths directly; otherwise each panel gets its own axis, so a
    short schedule is not squashed into a corner, and its end is marked with its step count.
    `share_steps` forces either."""
    slots = [num_slots or r.config.max_num_seqs for r in results.values()]
    heights = [0.6 + slots_height(n) for n in slots]
    lengths = [max(r.num_steps, 1) for r in results.values()]
    longest = max(lengths)
    if share_steps is None:
        share_steps = longest <= 2 * min(lengths)
    fig, axes = new_figure(width, sum(heights) + 0.6 + (0 if share_steps else 0.3 * len(results)),
                           rows=len(results), sharex=share_steps,
                           gridspec_kw={"height_ratios": heights})
    for ax, n, (label, result) in zip(axes, slots, results.items()):
        busy = f"{result.slot_utilisation():.0%} of slot-steps busy"
        title = f"{label}: {result.num_steps} steps, {busy}"
        if not share_steps and result.num_steps < longest:
            title += f" (its own step axis; the longest takes {longest})"
        draw_slots(ax, result, n, names, title, longest if share_steps else result.num_steps)
        if not share_steps:
            ax.axvline(result.num_steps + 0.5, color="black", linewidth=1.2)
            ax.annotate(f"end: step {result.num_steps}", (result.num_steps + 0.5, n - 0.5),
                        xytext=(-4, 0), textcoords="offset points", ha="right", va="bottom",
                        fontsize=8)
    if share_steps:
        for ax in axes[:-1]:
            ax.set_xlabel("")
    slot_legend(fig)
    return fig


# --- KV memory: reserved versus filled ---------------------------------------------------------
def kv_usage(result: SimResult) -> list[tuple[int, int]]:
    """Per step: (tokens whose K/V sit in the cache, slots the batch's requests have reserved).

    Needs `simulate(..., record_blocks=True)`; counts the requests that ran in each step.
    """
    if result.steps and not any(step.block_tables for step in result.steps):
        raise ValueError("this SimResult has no block tables; run simulate(..., "
                         "record_blocks=True).")
    block_size = result.config.block_size
    cached: dict[str, int] = {}
    usage = []
    for step in result.steps:
        for request_id in step.preempted:     # a preempted request's cache is dropped
            cached.pop(request_id, None)
        for request_id, kind, tokens in step.rows:
            if kind != "idle":
                cached[request_id] = cached.get(request_id, 0) + tokens
        used = sum(cached[r] for r, _, _ in step.rows)
        reserved = sum(len(step.block_tables.get(r, ())) for r, _, _ in step.rows) * block_size
        usage.append((used, reserved))
    return usage


def kv_usage_timeline(result: SimResult, title: str | None = None, width: float = 8.0) -> Figure:
    """Reserved KV slots versus those holding a token, step by step, against the pool's size."""
    usage = kv_usage(result)
    steps = [s.step for s in result.steps]
    used = [u for u, _ in usage]
    reserved = [r for _, r in usage]
    pool = result.config.num_kv_blocks * result.config.block_size
    filled = sum(used) / max(sum(reserved), 1)
    fig, (ax,) = new_figure(width, 3.0)
    ax.fill_between(steps, reserved, step="mid", color="#f4b183", label="reserved, still empty")
    ax.fill_between(steps, used, step="mid", color="#2e75b6", label="holding a token's K/V")
    ax.axhline(pool, color="black", linestyle="--", linewidth=1, label="KV pool")
    ax.set_xlabel("engine step")
    ax.set_ylabel("token slots")
    ax.set_xlim(steps[0] - 0.5, steps[-1] + 0.5)
    # headroom above the pool's line, and the legend below the axes, so nothing hides the line
    ax.set_ylim(0, 1.08 * max(pool, max(reserved, default=0)))
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    ax.set_title(
        title or f"{result.config.kv_cache} KV: {filled:.0%} of reserved slots hold a token",
        fontsize=10)
    return fig

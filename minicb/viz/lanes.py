"""Lanes: what the host and the device do over time, one horizontal lane each, as a profiler
draws them. A timeline is a mapping lane name -> [(start, end, phase), ...] in seconds (wall or
virtual); `python -m minicb bench timeline` records them on the real engine and builds them from
the cost model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minicb.viz.base import PALETTE, new_figure

PHASE_COLOURS = {"schedule": PALETTE[0], "pack": PALETTE[1], "launch": PALETTE[4],
                 "wait": "#dddddd", "update": PALETTE[2], "busy": PALETTE[3]}

Interval = tuple[float, float, str]


def busy_fraction(intervals: Sequence[Interval], start: float, end: float) -> float:
    """The share of [start, end] that the intervals cover (they may not overlap each other)."""
    if end <= start:
        raise ValueError(f"busy_fraction needs end > start (got {start}, {end}).")
    covered = sum(max(0.0, min(b, end) - max(a, start)) for a, b, _ in intervals)
    return covered / (end - start)


def lane_chart(timelines: Mapping[str, Mapping[str, Sequence[Interval]]],
               window: tuple[float, float] | None = None, unit: str = "ms",
               width: float = 9.0) -> Figure:
    """One panel per timeline (say "synchronous" and "overlapped"), one lane per entry of it
    (say "host" and "device"), each interval a bar coloured by its phase; the title of a panel
    gives each lane's busy share of the window. `window`: (start, end) seconds shown (default:
    everything)."""
    if not timelines:
        raise ValueError("lane_chart needs at least one timeline.")
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    fig, axes = new_figure(width, 1.1 + 1.0 * sum(len(t) for t in timelines.values()),
                           rows=len(timelines), sharex=window is not None)
    phases_seen: list[str] = []
    for ax, (title, lanes) in zip(axes, timelines.items()):
        spans = [iv for intervals in lanes.values() for iv in intervals]
        if not spans:
            raise ValueError(f"timeline {title!r} has no intervals.")
        start, end = window or (min(a for a, _, _ in spans), max(b for _, b, _ in spans))
        shares = []
        for row, (lane, intervals) in enumerate(lanes.items()):
            for a, b, phase in intervals:
                if b < start or a > end:
                    continue
                ax.broken_barh([((a - start) * scale, (b - a) * scale)], (row - 0.4, 0.8),
                               color=PHASE_COLOURS.get(phase, PALETTE[5]), edgecolor="white",
                               linewidth=0.3)
                if phase not in phases_seen:
                    phases_seen.append(phase)
            work = [iv for iv in intervals if iv[2] != "wait"]
            shares.append(f"{lane} {100 * busy_fraction(work, start, end):.0f}%")
        ax.set_yticks(range(len(lanes)), list(lanes))
        ax.set_ylim(len(lanes) - 0.5, -0.5)
        ax.set_xlim(0, (end - start) * scale)
        ax.set_title(f"{title}: busy {', '.join(shares)}", fontsize=9, loc="left")
    axes[-1].set_xlabel(f"time ({unit})")
    fig.legend(handles=[Patch(color=PHASE_COLOURS.get(p, PALETTE[5]), label=p)
                        for p in phases_seen], loc="outside upper right", ncols=len(phases_seen),
               fontsize=8, frameon=False)
    return fig

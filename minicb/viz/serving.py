"""A picture of how long each step of a simulated run took and what it carried, one of where a
router sent each request of a trace, and load studies: one server per line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import NullLocator

from minicb.sim import SimResult
from minicb.viz.base import PALETTE, new_figure


def step_costs(results: Mapping[str, SimResult], title: str | None = None,
               width: float = 8.0) -> Figure:
    """Each step's duration in time units against virtual time, one panel per run, coloured by
    what it carried: a tall step is one every running request waited through, and a step with
    prefill tokens but no decode is one in which the running requests got no token at all."""
    kinds = {"prefill only: the running requests get no token": "#d62728",
             "prefill and decodes": PALETTE[1], "decodes only": PALETTE[0]}
    fig, axes = new_figure(width, 1.0 + 1.6 * len(results), rows=len(results), sharex=True,
                           sharey=True)
    longest = max(s.end - s.start for r in results.values() for s in r.steps)
    for ax, (label, result) in zip(axes, results.items()):
        starts = np.array([s.start for s in result.steps])
        durations = np.array([s.end - s.start for s in result.steps])
        colours = []
        for step in result.steps:
            has_prefill = any(kind == "prefill" for _, kind, _ in step.rows)
            has_decode = any(kind == "decode" for _, kind, _ in step.rows)
            name = "decodes only" if not has_prefill else "prefill and decodes" if has_decode else \
                "prefill only: the running requests get no token"
            colours.append(kinds[name])
        ax.bar(starts, durations, width=durations, align="edge", color=colours, linewidth=0)
        ax.set_ylabel("step length")
        ax.set_ylim(0, longest * 1.1)
        ax.set_title(f"{label}: longest step {durations.max():.1f} units, {len(durations)} steps",
                     fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[-1].set_xlabel("virtual time (units)")
    handles = [Patch(facecolor=colour, label=name) for name, colour in kinds.items()]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def rate_label(rate: float) -> str:
    """An offered load as a reader says it: '4/s', or 'all at once' for an infinite rate."""
    return "all at once" if rate == float("inf") else f"{rate:g}/s"


def load_study_plot(rows: list[dict], title: str | None = None) -> Figure:
    """A load study (minicb.bench.load_study rows) drawn like chapters 00 and 03's trade-offs:
    throughput across, p95 time to first token up (log), one line per scheduler, each point
    labelled with the offered load."""
    from minicb.viz.curves import tradeoff_curve

    points = [{**r, "offered": rate_label(r["request_rate"])}
              for r in sorted(rows, key=lambda r: (r["scheduler"], r["request_rate"]))]
    fig = tradeoff_curve(points, x="output_throughput", y="ttft_p95_s", label="offered",
                         group="scheduler", logy=True, xlabel="output tokens per second",
                         ylabel="p95 time to first token (s)",
                         title=title or "each line a scheduler; each point an offered load")
    ax = fig.axes[0]
    ax.set_xlim(0, 1.25 * max(r["output_throughput"] for r in rows))
    return fig


def routing_strips(choices: Mapping[str, Sequence[int]], groups: Sequence[int],
                   replicas: int = 2, width: float = 9.0) -> Figure:
    """Where a router sent each request of a trace: one panel per policy, one lane per replica,
    a square per request at its place in the trace, coloured by its group (its chat). A policy
    with prefix affinity keeps each colour on one lane, so a chat's next turn finds its history
    cached; round robin scatters every colour over both lanes."""
    fig, axes = new_figure(width, 0.5 + (0.35 * replicas + 0.45) * len(choices),
                           rows=len(choices), sharex=True)
    for ax, (label, chosen) in zip(axes, choices.items()):
        for position, (replica, group) in enumerate(zip(chosen, groups)):
            ax.add_patch(Rectangle((position, replicas - 1 - replica - 0.4), 0.9, 0.8,
                                   facecolor=PALETTE[group % len(PALETTE)], edgecolor="none"))
        ax.set_xlim(-0.5, len(groups) + 0.5)
        ax.set_ylim(-0.6, replicas - 0.4)
        ax.set_yticks(range(replicas), [f"replica {replicas - 1 - r}" for r in range(replicas)],
                      fontsize=8)
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1].set_xlabel("request, in the order sent (colour: its chat)")
    return fig


def peer_load_plot(summary: Sequence[Mapping], title: str | None = None) -> Figure:
    """Servers under one load (minicb.bench.serve_peers summaries): output throughput and p95 time
    to first token against the offered rate, one line per server through the medians, a bar from
    the lowest to the highest repeat at every point."""
    names = list(dict.fromkeys(r["server"] for r in summary))
    fig, axes = new_figure(11, 4, cols=2)
    panels = (("output_throughput", "output tokens per second", False),
              ("ttft_p95_s", "p95 time to first token (s)", True))
    for ax, (metric, ylabel, log) in zip(axes, panels):
        for index, name in enumerate(names):
            rows = sorted((r for r in summary if r["server"] == name),
                          key=lambda r: r["request_rate"])
            # each server's points a little apart on the (log) rate axis, so the bars stay visible
            nudge = 1 + 0.04 * (index - (len(names) - 1) / 2)
            rates = np.array([r["request_rate"] for r in rows]) * nudge
            median = np.array([r[metric]["median"] for r in rows])
            spread = np.array([[m - r[metric]["min"] for m, r in zip(median, rows)],
                               [r[metric]["max"] - m for m, r in zip(median, rows)]])
            ax.errorbar(rates, median, yerr=spread, marker="o", capsize=4, label=name,
                        color=PALETTE[index % len(PALETTE)])
        ax.set(xscale="log", xlabel="offered load (requests per second)", ylabel=ylabel)
        if log:
            ax.set_yscale("log")
        ax.set_xticks(sorted({r["request_rate"] for r in summary}),
                      [rate_label(r) for r in sorted({r["request_rate"] for r in summary})])
        ax.xaxis.set_minor_locator(NullLocator())     # only the offered rates on the rate axis
        ax.grid(alpha=0.3)
    axes[0].legend()
    repeats = min(r["repeats"] for r in summary)
    fig.suptitle(title or f"one Poisson load, every server in turn: median of {repeats} or more "
                          "repeats, bars from the lowest to the highest", fontsize=10)
    return fig

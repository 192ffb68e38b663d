"""Pictures of measurements: a request's life on a time axis, latency/throughput curves, a
roofline, and the distribution of request lengths."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from minicb.metrics import RequestMetrics
from minicb.viz.base import PALETTE, new_figure, request_colour


def request_timelines(metrics: Sequence[RequestMetrics], virtual: bool = True,
                      names: Sequence[str] | None = None, annotate: int | None = None,
                      width: float = 8.0) -> Figure:
    """One lane per request: waiting (dotted), in the batch (bar), a tick per output token.

    `annotate` picks a lane whose TTFT, first inter-token latency and end-to-end latency are
    drawn as brackets under the lanes. `virtual=True` uses engine steps (a token made in step s
    is ready at s), otherwise seconds from the earliest arrival.
    """
    if not metrics:
        raise ValueError("request_timelines needs at least one request's metrics.")
    names = list(names) if names is not None else [f"r{i}" for i in range(len(metrics))]
    origin = 0.0 if virtual else min(m.arrival_time for m in metrics)
    extra = 1.2 if annotate is not None else 0.0
    fig, (ax,) = new_figure(width, 0.9 + 0.45 * (len(metrics) + extra))
    for lane, m in enumerate(metrics):
        if virtual:
            arrival, tokens = float(m.arrival_step), [float(s) for s in m.token_steps]
            started = None if m.first_scheduled_step is None else m.first_scheduled_step - 1.0
        else:
            arrival, tokens = m.arrival_time - origin, [t - origin for t in m.token_times]
            started = None if m.first_scheduled_time is None else m.first_scheduled_time - origin
        colour = request_colour(lane)
        end = tokens[-1] if tokens else arrival
        ax.plot([arrival, started if started is not None else end], [lane, lane], color=colour,
                linewidth=1.5, linestyle=":")
        if started is not None:
            ax.plot([started, end], [lane, lane], color=colour, linewidth=5, alpha=0.35,
                    solid_capstyle="butt")
        ax.plot(tokens, [lane] * len(tokens), "|", color=colour, markersize=12, markeredgewidth=2)
        ax.plot([arrival], [lane], "o", color=colour, markersize=5)
        if annotate == lane and tokens:
            _brackets(ax, lane, len(metrics), arrival, tokens, virtual)
    ax.set_yticks(range(len(metrics)), names)
    ax.set_ylim(len(metrics) - 0.5 + extra, -0.5)
    ax.set_xlabel("engine step" if virtual else "seconds")
    ax.set_title("o arrival · dotted: waiting · bar: in the batch · | an output token", fontsize=10)
    return fig


def _brackets(ax, lane: int, num_lanes: int, arrival: float, tokens: list[float],
              virtual: bool) -> None:
    """TTFT, ITL and E2E of one lane as labelled arrows below all the lanes."""
    if virtual:
        unit_text = lambda v: f"{v:g} step" + ("" if v == 1 else "s")
    else:
        unit_text = lambda v: f"{v * 1e3:.0f} ms"
    spans = [("TTFT", arrival, tokens[0])]
    if len(tokens) > 1:
        spans.append(("ITL", tokens[0], tokens[1]))
    spans.append(("E2E", arrival, tokens[-1]))
    for row, (label, start, stop) in enumerate(spans):
        y = num_lanes - 0.2 + 0.4 * row
        for x in (start, stop):
            ax.plot([x, x], [lane, y], color="grey", linewidth=0.6, linestyle=":")
        ax.annotate("", xy=(stop, y), xytext=(start, y),
                    arrowprops={"arrowstyle": "<->", "color": "black", "linewidth": 1})
        ax.text((start + stop) / 2, y - 0.04, f"{label} {unit_text(stop - start)}", ha="center",
                va="bottom", fontsize=8)


def tradeoff_curve(points: Sequence[Mapping], x: str, y: str, label: str | None = None,
                   group: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
                   title: str | None = None, logy: bool = False, width: float = 6.0) -> Figure:
    """A connected scatter of y against x over `points` (dicts); one line per value of `group`,
    each point annotated with its `label` field."""
    groups: dict = {}
    for point in points:
        groups.setdefault(point[group] if group else None, []).append(point)
    fig, (ax,) = new_figure(width, 3.6)
    # each line its own marker and its own side for the labels, so lines that run close together
    # (or on top of each other) stay readable: the first line is drawn last, on top
    markers, offsets = "osD^v", [(5, 5), (5, -11), (-16, 5), (-16, -11), (5, 12)]
    for index, (colour, (key, members)) in reversed(list(enumerate(zip(PALETTE * 4,
                                                                        groups.items())))):
        ax.plot([p[x] for p in members], [p[y] for p in members], marker=markers[index % 5],
                linestyle="-", color=colour, zorder=3 + len(groups) - index,
                markersize=7 - min(index, 3), label=None if key is None else f"{group}={key}")
        for p in members if label else ():
            ax.annotate(str(p[label]), (p[x], p[y]), textcoords="offset points",
                        xytext=offsets[index % 5], fontsize=8, color=colour)
    if group:
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], fontsize=8)      # back in the groups' order
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or y)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def line_plot(x: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str, ylabel: str,
              title: str | None = None, logx: bool = False, logy: bool = False,
              width: float = 6.0) -> Figure:
    """Several named series over one x axis."""
    fig, (ax,) = new_figure(width, 3.4)
    for colour, (name, values) in zip(PALETTE * 4, series.items()):
        ax.plot(list(x), list(values), "o-", color=colour, label=name)
    if logx:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(x), [f"{v:g}" for v in x])
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def bar_chart(labels: Sequence[str], values: Sequence[float], ylabel: str, title: str | None = None,
              xlabel: str | None = None, width: float = 6.0) -> Figure:
    fig, (ax,) = new_figure(width, 3.2)
    ax.bar([str(v) for v in labels], list(values),
           color=[request_colour(i) for i in range(len(values))])
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def roofline(peak_flops: float, bandwidth: float, points: Mapping[str, float],
             title: str | None = None, width: float = 6.0) -> Figure:
    """Attainable FLOP/s = min(peak, bandwidth × arithmetic intensity), on log-log axes.

    peak_flops in FLOP/s, bandwidth in bytes/s, points: label → intensity (FLOP per byte moved).
    Left of the ridge a kernel waits on memory; right of it, on arithmetic.
    """
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError("peak_flops and bandwidth must be positive (FLOP/s and bytes/s).")
    ridge = peak_flops / bandwidth
    low = min([ridge / 100, *points.values()]) / 2
    high = max([ridge * 100, *points.values()]) * 2
    intensity = np.geomspace(low, high, 200)
    attainable = np.minimum(peak_flops, bandwidth * intensity)
    fig, (ax,) = new_figure(width, 3.6)
    ax.loglog(intensity, attainable / 1e12, color="black")
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
    ax.text(ridge, peak_flops / 1e12 * 1.15, f"ridge ≈ {ridge:.0f} FLOP/B", ha="center", fontsize=8)
    for colour, (label, value) in zip(PALETTE * 4, points.items()):
        y = min(peak_flops, bandwidth * value) / 1e12
        ax.plot([value], [y], "o", color=colour, markersize=8)
        ax.annotate(label, (value, y), textcoords="offset points", xytext=(6, -12), fontsize=8,
                    color=colour)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_ylim(top=peak_flops / 1e12 * 2)
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title or "roofline", fontsize=10)
    return fig


def length_histogram(lengths: Sequence[int], bins: int = 30, xlabel: str = "tokens",
                     title: str | None = None, marks: Sequence[float] = (50, 95),
                     width: float = 6.0) -> Figure:
    """A histogram of lengths with the chosen percentiles marked."""
    data = np.asarray(lengths, dtype=float)
    if data.size == 0:
        raise ValueError("length_histogram needs at least one length.")
    fig, (ax,) = new_figure(width, 3.0)
    ax.hist(data, bins=bins, color=PALETTE[0], alpha=0.8)
    for colour, q in zip(PALETTE[1:], marks):
        value = float(np.percentile(data, q))
        ax.axvline(value, color=colour, linestyle="--", label=f"p{q:g} = {value:.0f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("requests")
    if marks:
        ax.legend(fontsize=8)
    ax.set_title(title or f"{data.size} requests, mean {data.mean():.0f}", fontsize=10)
    return fig


def length_spread(lengths: Sequence[int], cap: int, width: float = 9.0,
                  title: str | None = None) -> Figure:
    """Answer lengths when some answers never ended and were cut at `cap`: the answers that ended
    by themselves on a log-scale histogram (their real spread, undistorted by the cap), and
    beside it how many ended and how many were cut."""
    data = np.asarray(lengths, dtype=int)
    ended = data[data < cap]
    cut = int((data >= cap).sum())
    if ended.size == 0:
        raise ValueError(f"no answer ended before the cap of {cap}: nothing to spread.")
    fig, (ax, bar) = new_figure(width, 3.0, cols=2, gridspec_kw={"width_ratios": [3, 1]})
    edges = np.unique(np.geomspace(1, cap, 20).round().astype(int))
    ax.hist(ended, bins=edges, color=PALETTE[0], alpha=0.85)
    ax.set_xscale("log")
    ax.set_xlabel("output tokens, log scale (answers that ended by themselves)")
    ax.set_ylabel("answers")
    for colour, q in zip(PALETTE[1:], (10, 50, 90)):
        value = float(np.percentile(ended, q))
        ax.axvline(value, color=colour, linestyle="--", label=f"p{q} = {value:.0f}")
    ax.legend(fontsize=8)
    ax.set_title(title or f"{ended.size} answers that ended: {ended.min()} to {ended.max()} tokens",
                 fontsize=10)
    bars = bar.bar(["ended", f"cut at {cap}"], [ended.size, cut], color=[PALETTE[0], "#bbbbbb"])
    for rect, n in zip(bars, [ended.size, cut]):
        bar.text(rect.get_x() + rect.get_width() / 2, rect.get_height(), str(n), ha="center",
                 va="bottom", fontsize=8)
    bar.set_ylim(0, 1.15 * max(ended.size, cut))
    bar.set_title(f"all {data.size} answers", fontsize=10)
    return fig

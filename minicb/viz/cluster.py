"""Pictures of several GPUs: a disaggregated cluster's steps and transfers, SLO attainment and
goodput curves, and where a tensor-parallel step's time goes.

The inputs are `minicb.sim.cluster.ClusterResult`s and the rows `python -m minicb bench disagg`
writes (benchmarks/results/disagg.json), so a notebook can draw the committed results without
re-running them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from minicb.viz.base import PALETTE, new_figure

PREFILL_COLOUR, DECODE_COLOUR, MIXED_COLOUR, TRANSFER_COLOUR = (PALETTE[1], PALETTE[0],
                                                                PALETTE[4], PALETTE[2])
PART_COLOURS = {"fixed": "#bbbbbb", "weights": PALETTE[0], "compute": PALETTE[1],
                "kv read": PALETTE[2], "all-reduce": PALETTE[3]}


def _ordered(values) -> list:
    return list(dict.fromkeys(values))


def cluster_timeline(result, until: float | None = None, width: float = 10.0) -> Figure:
    """One lane per instance, one box per step: orange carries only prompt tokens, blue only
    decodes, purple both (a co-located step, where a prompt stalls the decodes beside it). Green
    bars under a prefill lane are its KV transfers, from sending to arrival."""
    instances = result.instances
    end = until if until is not None else max((s[1] for i in instances for s in i.steps),
                                               default=1.0)
    fig, (ax,) = new_figure(width, 0.55 * len(instances) + 1.2)
    lanes = {instance.name: len(instances) - 1 - k for k, instance in enumerate(instances)}
    for instance in instances:
        lane = lanes[instance.name]
        for start, stop, prompt_tokens, decode_rows in instance.steps:
            if start >= end:
                break
            colour = (MIXED_COLOUR if prompt_tokens and decode_rows else
                      PREFILL_COLOUR if prompt_tokens else DECODE_COLOUR)
            ax.add_patch(Rectangle((start, lane - 0.3), min(stop, end) - start, 0.6,
                                   facecolor=colour, edgecolor="white", linewidth=0.3))
    for sent in result.transfers:
        if sent.start < end:
            lane = lanes[sent.source]
            ax.add_patch(Rectangle((sent.start, lane - 0.45), min(sent.end, end) - sent.start,
                                   0.12, facecolor=TRANSFER_COLOUR, edgecolor="none"))
    ax.set_xlim(0, end)
    ax.set_ylim(-0.7, len(instances) - 0.3)
    ax.set_yticks([lanes[i.name] for i in instances], [i.name for i in instances])
    ax.set_xlabel(f"time ({'s' if result.instances[0].cost.unit == 's' else 'units'})")
    key = [Patch(color=colour, label=label) for colour, label in (
        (PREFILL_COLOUR, "prompt tokens only"), (DECODE_COLOUR, "decodes only"),
        (MIXED_COLOUR, "prompt + decodes"), (TRANSFER_COLOUR, "KV transfer"))]
    ax.legend(handles=key, fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return fig


def slo_attainment_curves(curves: Sequence[Mapping], goal: float = 0.9,
                          width: float = 11.0) -> Figure:
    """SLO attainment against request rate per GPU, one panel per workload, one line per system
    (`curves`: rows of workload, system and points [(rate per GPU, attainment)]); the dashed line
    is the goal, and where a curve crosses it is that system's per-GPU goodput."""
    workloads = _ordered(c["workload"] for c in curves)
    systems = _ordered(c["system"] for c in curves)
    fig, axes = new_figure(width, 3.2, cols=len(workloads))
    for ax, workload in zip(axes, workloads):
        for curve in (c for c in curves if c["workload"] == workload):
            rates, shares = zip(*curve["points"])
            ax.plot(rates, [100 * s for s in shares], "o-", markersize=3,
                    color=PALETTE[systems.index(curve["system"]) % len(PALETTE)],
                    label=curve["system"])
        ax.axhline(100 * goal, color="grey", linestyle="--", linewidth=1)
        ax.set_title(workload, fontsize=10)
        ax.set_xlabel("requests per second per GPU")
        ax.set_ylim(0, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("requests meeting both SLOs (%)")
    return fig


def goodput_bars(rows: Sequence[Mapping], width: float = 11.0) -> Figure:
    """Per-GPU goodput, grouped by workload: one bar per system (and link, where it is not
    NVLink). A hatched bar marked ≥ met the goal at the highest rate tried."""
    workloads = _ordered(r["workload"] for r in rows)

    def label(row: Mapping) -> str:
        link = row.get("link", "nvlink")
        return row["system"] if link == "nvlink" else f"{row['system']} over {link}"

    labels = _ordered(label(r) for r in rows)
    fig, (ax,) = new_figure(width, 3.6)
    bar = 0.8 / len(labels)
    for k, name in enumerate(labels):
        xs, heights, capped = [], [], []
        for w, workload in enumerate(workloads):
            match = [r for r in rows if r["workload"] == workload and label(r) == name]
            if match:
                xs.append(w + (k - (len(labels) - 1) / 2) * bar)
                heights.append(match[0]["per_gpu"])
                capped.append(bool(match[0].get("capped")))
        ax.bar(xs, heights, bar, color=PALETTE[k % len(PALETTE)], label=name,
               hatch=["//" if c else None for c in capped])
        for x, height, cap in zip(xs, heights, capped):
            if cap:     # the goal was met at the highest rate tried: at least this
                ax.text(x, height, "≥", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("goodput (requests/s per GPU)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    return fig


def slo_scale_plot(rows: Sequence[Mapping], width: float = 11.0) -> Figure:
    """Per-GPU goodput as the targets tighten (scale < 1) or loosen, one panel per workload, one
    line per system."""
    workloads = _ordered(r["workload"] for r in rows)
    fig, axes = new_figure(width, 3.2, cols=len(workloads))
    for ax, workload in zip(axes, workloads):
        mine = [r for r in rows if r["workload"] == workload]
        for k, system in enumerate(_ordered(r["system"] for r in mine)):
            points = sorted((r["scale"], r["per_gpu"]) for r in mine if r["system"] == system)
            ax.plot(*zip(*points), "o-", markersize=3, color=PALETTE[k], label=system)
        ax.set_title(workload, fontsize=10)
        ax.set_xlabel("SLO scale (x both targets)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("goodput (requests/s per GPU)")
    return fig


def tp_parts(rows: Sequence[Mapping], step: str = "decode_parts", width: float = 11.0) -> Figure:
    """A step's time by part (fixed, weights, compute, KV read, all-reduce) against the TP
    degree: one panel per model and link, a cross where the model does not fit the group."""
    models = _ordered(r["model"] for r in rows)
    links = _ordered(r["link"] for r in rows)
    fig, axes = new_figure(width, 2.8 * len(models), rows=len(models), cols=len(links))
    for m, model in enumerate(models):
        for k, link in enumerate(links):
            ax = axes[m * len(links) + k]
            mine = sorted((r for r in rows if (r["model"], r["link"]) == (model, link)),
                          key=lambda r: r["tp"])
            for x, row in enumerate(mine):
                bottom = 0.0
                for part, seconds in row[step].items():
                    ax.bar(x, seconds * 1e3, bottom=bottom, color=PART_COLOURS[part],
                           label=part if x == 0 else None, hatch=None if row["fits"] else "xx",
                           alpha=1.0 if row["fits"] else 0.35)
                    bottom += seconds * 1e3
            ax.set_xticks(range(len(mine)), [f"TP={r['tp']}" for r in mine])
            ax.margins(y=0.08)
            ax.set_title(f"{model}, {link}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
            if k == 0:
                ax.set_ylabel(f"{step.split('_')[0]} step (ms)")
    axes[0].legend(fontsize=7)
    return fig


def tp_tpot(rows: Sequence[Mapping], width: float = 9.0) -> Figure:
    """Simulated TPOT (p50) against the TP degree, one line per link, one panel per model; the
    degrees whose group cannot hold the model are left out."""
    models = _ordered(r["model"] for r in rows)
    fig, axes = new_figure(width, 3.2, cols=len(models))
    for ax, model in zip(axes, models):
        for k, link in enumerate(_ordered(r["link"] for r in rows)):
            points = [(r["tp"], r["tpot_p50"] * 1e3) for r in rows
                      if (r["model"], r["link"]) == (model, link) and r["fits"]]
            ax.plot(*zip(*points), "o-", color=PALETTE[k], label=link)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["tp"] for r in rows}), [str(t) for t in
                                                       sorted({r["tp"] for r in rows})])
        ax.set_title(model, fontsize=10)
        ax.set_xlabel("tensor-parallel GPUs")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TPOT p50 (ms)")
    axes[0].legend(fontsize=7)
    return fig

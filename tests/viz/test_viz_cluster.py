"""The pictures of several GPUs draw what their inputs say."""

from __future__ import annotations

import matplotlib.colors as mcolors
import pytest
from matplotlib.patches import Rectangle

from minicb import viz
from minicb.sim import CostModel
from minicb.sim.calibrate import A100_LLAMA2_7B
from minicb.sim.cluster import Pool, simulate_cluster
from minicb.sim.parallel import LLAMA2_7B, NVLINK, tp_step_parts
from minicb.sim.workload import Workload, WorkloadRequest
from minicb.viz.cluster import DECODE_COLOUR, MIXED_COLOUR, PREFILL_COLOUR, TRANSFER_COLOUR

UNIT = CostModel(step_overhead=1.0, prefill_token=0.01)


def boxes(ax, colour: str) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle)
            and mcolors.same_color(p.get_facecolor(), colour)]


def test_cluster_timeline_has_a_box_per_step_and_a_bar_per_transfer():
    w = Workload("two", [WorkloadRequest(10, 10, 0.0), WorkloadRequest(500, 3, 3.0)])
    apart = simulate_cluster(w, prefill=Pool(1, UNIT), decode=Pool(1, UNIT),
                             transfer=lambda tokens: 0.5)
    (ax,) = viz.cluster_timeline(apart).axes
    prefill, decode = apart.instances
    assert len(boxes(ax, PREFILL_COLOUR)) == len(prefill.steps) == 2     # A's prompt, then B's
    assert len(boxes(ax, DECODE_COLOUR)) == len(decode.steps) > 0
    assert len(boxes(ax, TRANSFER_COLOUR)) == len(apart.transfers) == 2
    assert boxes(ax, MIXED_COLOUR) == []               # disaggregated: no step does both
    together = simulate_cluster(w, colocated=Pool(1, UNIT, {"max_num_batched_tokens": 1024}))
    (ax,) = viz.cluster_timeline(together).axes
    assert len(boxes(ax, MIXED_COLOUR)) == 1           # B's prompt rides with A's decode
    assert [t.get_text() for t in ax.get_yticklabels()] == ["colocated-0"]


def test_attainment_curves_and_goodput_bars_follow_the_rows():
    curves = [{"workload": "chat", "system": "a", "points": [(1, 1.0), (2, 0.95), (3, 0.5)]},
              {"workload": "chat", "system": "b", "points": [(1, 1.0), (2, 0.8)]},
              {"workload": "long", "system": "a", "points": [(1, 0.9)]}]
    fig = viz.slo_attainment_curves(curves, goal=0.9)
    chat, long = fig.axes[:2]
    data = [list(map(float, line.get_ydata())) for line in chat.get_lines()]
    assert [100.0, 95.0, 50.0] in data and [100.0, 80.0] in data and [90.0, 90.0] in data
    assert len(long.get_lines()) == 2                  # its one system and the goal
    rows = [{"workload": "chat", "system": "a", "per_gpu": 3.5},
            {"workload": "chat", "system": "b", "per_gpu": 1.25},
            {"workload": "long", "system": "a", "per_gpu": 2.0},
            {"workload": "long", "system": "a", "link": "pcie", "per_gpu": 0.5}]
    (ax,) = viz.goodput_bars(rows).axes
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == [0.5, 1.25, 2.0, 3.5]
    assert "a over pcie" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_tp_parts_stack_to_the_step_and_unfitting_groups_are_left_out_of_tpot():
    rows = []
    for tp, fits in ((1, True), (2, True), (4, False)):
        parts = tp_step_parts(A100_LLAMA2_7B, LLAMA2_7B, tp, NVLINK, 0, 32, 32 * 1024)
        rows.append({"model": "m", "link": "nvlink", "tp": tp, "fits": fits,
                     "decode_parts": parts, "tpot_p50": sum(parts.values())})
    ax = viz.tp_parts(rows).axes[0]
    for x, row in enumerate(rows):
        top = max(p.get_y() + p.get_height() for p in ax.patches
                  if abs(p.get_x() + p.get_width() / 2 - x) < 1e-9)
        assert top == pytest.approx(sum(row["decode_parts"].values()) * 1e3)
    (line,) = viz.tp_tpot(rows).axes[0].get_lines()
    assert line.get_xdata().tolist() == [1, 2]
    assert line.get_ydata().tolist() == pytest.approx([r["tpot_p50"] * 1e3 for r in rows[:2]])


def test_routing_strips_puts_each_request_on_its_replicas_lane_in_its_chats_colour():
    choices = {"one way": [0, 1, 1], "another": [1, 1, 0]}
    groups = [0, 0, 2]
    fig = viz.routing_strips(choices, groups)
    assert len(fig.axes) == 2
    for ax, chosen in zip(fig.axes, choices.values()):
        squares = sorted((p for p in ax.patches if isinstance(p, Rectangle)),
                         key=lambda p: p.get_x())
        assert len(squares) == len(chosen)
        for square, replica, group in zip(squares, chosen, groups):
            lane = 1 - replica                        # replica 0's lane on top
            assert square.get_y() + square.get_height() / 2 == pytest.approx(lane)
            assert mcolors.same_color(square.get_facecolor(), viz.PALETTE[group])
        labels = {tick.get_text(): y for tick, y in zip(ax.get_yticklabels(), ax.get_yticks())}
        assert labels == {"replica 0": 1, "replica 1": 0}

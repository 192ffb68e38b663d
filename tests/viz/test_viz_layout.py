"""Figures stay readable: timelines of very different lengths, lines that run close together."""

from __future__ import annotations

from minicb import viz
from minicb.sim import simulate
from minicb.sim.workload import chat, seed_example


def test_timelines_of_comparable_length_share_one_step_axis():
    runs = {"static": simulate(seed_example(), scheduler="static", max_num_seqs=4),
            "continuous": simulate(seed_example(), scheduler="continuous", max_num_seqs=4)}
    fig = viz.compare_timelines(runs)
    limits = [ax.get_xlim() for ax in fig.axes[:2]]
    assert limits[0] == limits[1] == (0.5, 14.5)


def test_a_short_timeline_gets_its_own_axis_and_a_marked_end():
    traffic = chat(24, seed=0)
    runs = {f"{n} slots": simulate(traffic, max_num_seqs=n, max_num_batched_tokens=256)
            for n in (1, 8)}
    steps = [r.num_steps for r in runs.values()]
    assert steps[0] > 2 * steps[1]          # the case this layout exists for
    fig = viz.compare_timelines(runs)
    for ax, n in zip(fig.axes, steps):
        assert ax.get_xlim() == (0.5, n + 0.5)
        assert any(t.get_text() == f"end: step {n}" for t in ax.texts)
    forced = viz.compare_timelines(runs, share_steps=True)
    assert forced.axes[1].get_xlim() == (0.5, steps[0] + 0.5)


def test_tradeoff_lines_keep_their_own_markers_and_label_sides():
    points = [{"x": x, "y": 1.0, "budget": b, "seqs": s}          # two lines on top of each other
              for b in (64, 256) for s, x in ((4, 1.0), (16, 2.0))]
    fig = viz.tradeoff_curve(points, x="x", y="y", label="seqs", group="budget")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["budget=64"].get_marker() != lines["budget=256"].get_marker()
    # the first group is drawn on top of the others
    assert lines["budget=64"].get_zorder() > lines["budget=256"].get_zorder()
    offsets = {}
    for text in ax.texts:
        offsets.setdefault(text.get_color(), set()).add(tuple(text.xyann))
    assert len(offsets) == 2 and len(set.union(*offsets.values())) == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["budget=64", "budget=256"]


def test_load_study_plot_reads_like_the_other_trade_offs():
    import math

    rows = [{"scheduler": s, "request_rate": rate, "output_throughput": tput, "ttft_p95_s": ttft}
            for s, rate, tput, ttft in [("naive", 4.0, 60.0, 0.3), ("naive", math.inf, 250.0, 0.7),
                                        ("continuous", math.inf, 680.0, 0.07),
                                        ("continuous", 4.0, 61.0, 0.05)]]
    fig = viz.load_study_plot(rows)
    ax = fig.axes[0]
    # throughput across, latency up on a log axis, as in chapters 00 and 03
    assert "tokens per second" in ax.get_xlabel() and "first token" in ax.get_ylabel()
    assert ax.get_yscale() == "log" and ax.get_xscale() == "linear"
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == ["4/s", "4/s", "all at once", "all at once"]      # never "inf/s"
    assert viz.rate_label(0.5) == "0.5/s"
    # each scheduler's points joined in order of offered load
    line = {line.get_label(): line for line in ax.get_lines()}["scheduler=continuous"]
    assert list(line.get_xdata()) == [61.0, 680.0]


def test_length_spread_shows_the_answers_that_ended_apart_from_the_cap():
    lengths = [3, 5, 9, 40, 120, 256, 256, 256]
    fig = viz.length_spread(lengths, cap=256)
    hist, bars = fig.axes[0], fig.axes[1]
    counted = sum(p.get_height() for p in hist.patches)
    assert counted == 5                                     # the cut answers are not in it
    assert hist.get_xscale() == "log"
    assert [p.get_height() for p in bars.patches] == [5, 3]
    assert [t.get_text() for t in bars.get_xticklabels()] == ["ended", "cut at 256"]
    import pytest

    with pytest.raises(ValueError, match="no answer ended"):
        viz.length_spread([256, 256], cap=256)


def test_short_named_requests_keep_their_labels_on_a_long_schedule():
    from minicb.sim.workload import fixed

    spread = fixed("6/50/300 and three waiting", [8] * 6, [6, 50, 300, 6, 6, 6])
    wide = simulate(spread, scheduler="static", max_num_seqs=3)
    names = dict(zip("012345", "ABCDEF"))
    fig = viz.slot_timeline(wide, names=names)
    labels = sorted(t.get_text() for ax in fig.axes for t in ax.texts)
    assert labels == list("ABCDEF")


def test_kv_usage_legend_stays_off_the_pool_line():
    pool = dict(max_num_seqs=8, max_model_len=128, block_size=16, num_kv_blocks=32)
    run = simulate(chat(16, seed=0), kv_cache="contiguous", record_blocks=True, **pool)
    fig = viz.kv_usage_timeline(run)
    ax = fig.axes[0]
    assert ax.get_legend() is None and len(fig.legends) == 1        # outside the axes
    assert ax.get_ylim()[1] > 32 * 16                                # room above the pool line


def test_free_blocks_legend_sits_below_the_axes():
    runs = {"roomy": simulate(chat(12, seed=0), max_num_seqs=4, max_model_len=128, block_size=16,
                              num_kv_blocks=64),
            "tight": simulate(chat(12, seed=0), max_num_seqs=4, max_model_len=128, block_size=16,
                              num_kv_blocks=12)}
    fig = viz.free_blocks_timeline(runs)
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1
    assert [t.get_text().split(":")[0] for t in fig.legends[0].get_texts()] == ["roomy", "tight"]

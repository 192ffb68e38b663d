"""The lane chart and the busy share it reports; the timeline benchmark's virtual-time lanes."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from minicb.bench.timeline import virtual_lanes
from minicb.viz import busy_fraction, lane_chart

HOST = {"schedule": 1.0, "pack": 1.0, "update": 1.0}      # milliseconds


def test_busy_fraction_clips_to_the_window():
    intervals = [(0.0, 1.0, "busy"), (2.0, 4.0, "busy")]
    assert busy_fraction(intervals, 0.0, 4.0) == pytest.approx(0.75)
    assert busy_fraction(intervals, 0.5, 3.0) == pytest.approx(1.5 / 2.5)
    with pytest.raises(ValueError, match="end > start"):
        busy_fraction(intervals, 1.0, 1.0)


def test_synchronous_lanes_leave_the_device_idle_for_the_host_share():
    lanes = virtual_lanes([7e-3] * 10, HOST, overlap=False)
    end = lanes["host"][-1][1]
    assert end == pytest.approx(10 * 10e-3)
    assert busy_fraction(lanes["device"], 0.0, end) == pytest.approx(0.7)


def test_overlapped_lanes_hide_the_host_behind_the_device():
    lanes = virtual_lanes([7e-3] * 10, HOST, overlap=True)
    end = max(b for _, b, _ in lanes["host"] + lanes["device"])
    # the host's 3 ms hides under each 7 ms step but the first plan and the last update
    assert end == pytest.approx(2e-3 + 10 * 7e-3 + 1e-3)
    device = lanes["device"]
    assert all(a == pytest.approx(b_prev) for (a, _, _), (_, b_prev, _) in
               zip(device[1:], device[:-1]))                      # back to back
    # a host slower than the device: then the device waits for the host instead
    slow = virtual_lanes([1e-3] * 10, HOST, overlap=True)
    end = max(b for _, b, _ in slow["host"] + slow["device"])
    assert busy_fraction(slow["device"], 0.0, end) < 0.5


def test_lane_chart_draws_one_panel_per_timeline_with_each_lanes_share():
    timelines = {name: virtual_lanes([7e-3] * 6, HOST, overlap)
                 for name, overlap in (("sync", False), ("overlapped", True))}
    fig = lane_chart(timelines)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[0].startswith("sync: busy host") and "device 70%" in titles[0]
    assert "overlapped" in titles[1]
    with pytest.raises(ValueError, match="at least one"):
        lane_chart({})
    with pytest.raises(ValueError, match="no intervals"):
        lane_chart({"empty": {"host": []}})

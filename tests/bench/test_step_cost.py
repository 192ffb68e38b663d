"""bench step-cost: the summary pairs each row count with the one-row step of the same repeat, and
a real decode engine is timed on both clocks (one tiny run)."""

from __future__ import annotations

import pytest

from minicb.bench.step_cost import decoding_engine, summarize, timed_steps


def run(repeat: int, rows: int, wall: float, cpu: float) -> dict:
    return {"repeat": repeat, "rows": rows, "wall_ms": wall, "wall_min_ms": wall, "cpu_ms": cpu,
            "cpu_min_ms": cpu, "keys": 10.0 * rows, "model_ms": 1.0, "load_before": 0.1,
            "load_after": 0.1}


def test_ratios_are_paired_within_each_repeat():
    # repeat 0 is slow for everyone, repeat 1 fast: paired, 16 rows costs 2x one row in both;
    # pooled medians would mix a slow 16-row step with a fast 1-row one
    runs = [run(0, 1, 10.0, 5.0), run(0, 16, 20.0, 10.0), run(1, 1, 1.0, 0.5),
            run(1, 16, 2.0, 1.0), run(2, 16, 8.0, 4.0), run(2, 1, 4.0, 2.0)]
    summary = summarize(runs, (1, 16))
    for clock in ("wall", "cpu"):
        ratio = summary["ratios"][f"16_over_1_{clock}"]
        assert ratio["values"] == [2.0, 2.0, 2.0]
        assert ratio["reading"].startswith("no direction from 3")
    assert summary["per_rows"]["16"]["wall_over_cpu"] == pytest.approx(2.0)
    assert summary["per_rows"]["1"]["wall_ms"] == 4.0


@pytest.mark.slow           # it loads the shipped model
def test_a_decoding_engine_is_timed_on_both_clocks():
    engine = decoding_engine(rows=2, context=8, fused_rows=0)
    point = timed_steps(engine, steps=3)
    assert len(engine.scheduler.running) == 2
    assert 0 < point["cpu_min_ms"] <= point["cpu_ms"]
    assert 0 < point["wall_min_ms"] <= point["wall_ms"]
    assert point["keys"] >= 2 * 8

"""bench timeline records the host's phases and the device's busy intervals on the real engine,
for synchronous and overlapped steps."""

from __future__ import annotations

import pytest

from minicb.bench.common import resolve_model
from minicb.bench.timeline import engine_run, host_costs


@pytest.mark.parametrize("overlap", [False, True])
def test_engine_run_records_both_lanes(overlap):
    path, _ = resolve_model(None, None, "float32")
    run = engine_run(path, overlap, batch=3, context=8, steps=5, device="cpu", dtype="float32")
    assert run["tokens"] == 3 * 5
    assert 0 < run["device_busy"] <= 1 and 0 < run["host_busy"] <= 1
    phases = {phase for _, _, phase in run["lanes"]["host"]}
    assert {"schedule", "pack", "update", "wait"} <= phases
    assert ("launch" in phases) == overlap
    # every step the window waited for ran in it: all 5 synchronous ones; overlapped, the 4 it
    # queued and collected (the fifth may not have started when the window closed, and the step
    # in flight before it may have ended already)
    assert len(run["lanes"]["device"]) >= (4 if overlap else 5) and run["threads"]


def test_the_simulated_host_reads_bench_overheads_committed_record():
    host = host_costs(64, None)
    assert host["source"].endswith("overhead.json at batch 64")
    assert all(host[phase] > 0 for phase in ("schedule", "pack", "update"))
    assert host_costs(8, 3.0) == {"schedule": 1.0, "pack": 1.0, "update": 1.0,
                                  "source": "--host-ms"}

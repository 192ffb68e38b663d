"""The book's worked examples come out of the real scheduler driven by the cost model."""

from __future__ import annotations

import pytest

from minicb.sim import CostModel, simulate
from minicb.workload import (
    Workload,
    WorkloadRequest,
    chat,
    gamma_arrivals,
    seed_example,
    three_answers,
)


def test_seed_example_static_14_continuous_10():
    static = simulate(seed_example(), scheduler="static", max_num_seqs=4)
    continuous = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    assert static.num_steps == 14 and continuous.num_steps == 10
    finish = continuous.finish_steps()
    assert [finish[str(i)] for i in range(6)] == [4, 4, 10, 10, 8, 8]
    entered = {r.request_id: r.times.first_scheduled_step for r in continuous.requests}
    assert entered["4"] == entered["5"] == 5
    assert static.finish_steps()["4"] == 14
    assert continuous.slot_utilisation() > static.slot_utilisation()


def test_static_batch_rows_wait_for_the_longest():
    result = simulate(three_answers(), scheduler="static", max_num_seqs=3)
    assert result.num_steps == 300
    idle = sum(1 for s in result.steps for _, kind, _ in s.rows if kind == "idle")
    assert idle == (300 - 6) + (300 - 50)


def test_naive_runs_one_at_a_time():
    result = simulate(seed_example(), scheduler="naive", max_num_seqs=4)
    assert result.num_steps == sum(seed_example().output_lens)
    assert all(len(s.rows) == 1 for s in result.steps)


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_continuous_beats_static_on_a_busy_chat_trace(kv_cache):
    workload = chat(200, seed=1)
    workload = workload.with_arrivals(gamma_arrivals(len(workload), rate=0.5, burstiness=0.5,
                                                     seed=2))
    knobs = dict(max_num_seqs=16, max_num_batched_tokens=512, kv_cache=kv_cache)
    static = simulate(workload, scheduler="static", **knobs).summary(virtual=False)
    continuous = simulate(workload, scheduler="continuous", **knobs).summary(virtual=False)
    assert continuous.output_throughput > static.output_throughput
    assert continuous.ttft["p95"] < static.ttft["p95"]


def test_prefill_costs_time_and_idle_gaps_are_skipped():
    workload = Workload("two", [WorkloadRequest(64, 2, 0.0), WorkloadRequest(64, 2, 100.0)])
    result = simulate(workload, cost=CostModel(step_overhead=1.0, prefill_token=0.5),
                      scheduler="continuous")
    assert result.steps[0].end - result.steps[0].start == pytest.approx(1.0 + 32.0)
    assert result.steps[2].start == pytest.approx(100.0)

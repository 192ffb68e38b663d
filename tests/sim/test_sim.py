"""The book's worked examples come out of the real scheduler driven by the cost model."""

from __future__ import annotations

import pytest

from minicb.sim import CostModel, simulate
from minicb.sim.workload import (
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


def test_reference_cpu_calibration_is_the_committed_measurement():
    """The chapters' CPU cost model must be the fit recorded in benchmarks/results, not numbers
    typed in by hand: re-fitting the committed samples gives the same terms (both pieces: the
    fused decode layer's steps and the others), and the model predicts every recorded step
    within the recorded worst error, which is itself bounded."""
    import json
    from pathlib import Path

    import pytest

    from minicb.config import FUSED_DECODE_ROWS_PER_THREAD
    from minicb.sim.calibrate import PIECEWISE_TERMS, REFERENCE_CPU, StepSample, fit_piecewise

    record = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results"
                         / "calibration.json").read_text())
    samples = [StepSample(**s) for s in record["samples"]]
    result = fit_piecewise(samples, record["fit"]["fused_rows"])
    # the piece boundary is the engine's default on the recorded machine: a decode-only step of
    # up to this many rows runs the fused layer
    assert REFERENCE_CPU.fused_rows == record["fit"]["fused_rows"] == (
        FUSED_DECODE_ROWS_PER_THREAD * record["machine"]["cpu_cores"])
    for term in PIECEWISE_TERMS:
        assert getattr(REFERENCE_CPU, term) == pytest.approx(getattr(result.cost, term), rel=0.01)
        assert getattr(REFERENCE_CPU, term) == pytest.approx(record["fit"][term], rel=0.01)
    # both pieces were measured, and each is held to its samples
    fused = [s for s in samples if REFERENCE_CPU.uses_fused(s.prefill_tokens, s.decode_rows)]
    assert 6 <= len(fused) < len(samples)
    errors = [abs(REFERENCE_CPU.step_time(s.prefill_tokens, s.decode_rows, s.context_tokens)
                  - s.seconds) / s.seconds for s in samples]
    assert max(errors) <= record["worst_error"] * 1.05 and record["worst_error"] < 0.35
    assert record["r2"] > 0.95
    # a step with a prompt in it never runs the fused layer, whatever its rows
    assert not REFERENCE_CPU.uses_fused(1, 1) and not REFERENCE_CPU.uses_fused(0, 65)


def test_fit_recovers_known_terms_and_drops_negative_ones():
    from minicb.sim.calibrate import StepSample, fit

    truth = dict(step_overhead=2e-3, prefill_token=5e-5, decode_seq=1e-4, context_token=3e-7)
    samples = [StepSample(p, r, c, truth["step_overhead"] + truth["prefill_token"] * p
                          + truth["decode_seq"] * r + truth["context_token"] * c)
               for p in (0, 64, 256) for r in (1, 8, 32) for c in (100 * r, 400 * r)]
    result = fit(samples)
    for term, value in truth.items():
        assert abs(getattr(result.cost, term) - value) < 1e-6 * max(value, 1e-3) * 1e3
    assert result.r2 > 0.9999 and result.worst_error < 1e-6
    # a step that got cheaper with more context is noise: the term is dropped, not negative
    noisy = [StepSample(s.prefill_tokens, s.decode_rows, s.context_tokens,
                        s.seconds - 1e-7 * s.context_tokens) for s in samples]
    assert fit(noisy).cost.context_token >= 0

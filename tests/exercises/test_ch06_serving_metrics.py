"""Chapter 06: serving metrics from timestamps, against minicb.metrics on real and simulated
runs."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from adapter import chapter, run_docstring_examples
from engine_probe import greedy, random_prompts

from minicb import LLM
from minicb.metrics import RequestMetrics, percentiles, summarize
from minicb.sim import simulate
from minicb.sim.workload import chat, poisson_arrivals

ch06 = chapter("06")
QUANTILES = (0, 50, 90, 95, 99, 100)


@pytest.fixture(scope="module")
def engine_metrics(tiny_llama) -> list[RequestMetrics]:
    """Wall-clock timestamps of a real run: five requests on two slots, one of a single token."""
    llm = LLM(tiny_llama, max_num_seqs=2, block_size=4)
    lengths = [6, 1, 9, 4, 7]
    outputs = llm.generate(random_prompts([5, 9, 3, 12, 6], 512, seed=14),
                           [greedy(n) for n in lengths], use_tqdm=False)
    return [out.metrics for out in outputs]


def wall_clock(m: RequestMetrics):
    return ch06.RequestTimestamps(m.arrival_time, list(m.token_times), m.finished_time)


def close(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None
                                         and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12))


def test_ch06_worked_examples():
    run_docstring_examples(ch06)


def test_ch06_per_request_metrics_match_minicb(engine_metrics):
    for index, m in enumerate(engine_metrics):
        r = wall_clock(m)
        got = {"TTFT": ch06.time_to_first_token(r), "TPOT": ch06.time_per_output_token(r),
               "E2E": ch06.end_to_end_latency(r)}
        expected = {"TTFT": m.ttft, "TPOT": m.tpot, "E2E": m.e2e}
        for name in got:
            assert close(got[name], expected[name]), (f"request {index} ({len(m.token_times)} "
                                                      f"tokens, arrival {m.arrival_time:.6f}, "
                                                      "tokens at "
                                                      f"{[round(t, 6) for t in m.token_times]}): "
                                                      f"{name} should be {expected[name]}, got "
                                                      f"{got[name]}")
        itl = ch06.inter_token_latencies(r)
        assert len(itl) == len(m.itl) and all(close(a, b) for a, b in zip(itl, m.itl)), \
            f"request {index}: inter-token latencies should be {m.itl}, got {itl}"


def test_ch06_percentiles_match_numpy():
    rng = random.Random(15)
    for size in (1, 2, 7, 100):
        values = [rng.expovariate(1.0) for _ in range(size)]
        for q in QUANTILES:
            got, expected = ch06.percentile(values, q), float(np.percentile(values, q))
            assert close(got, expected), (f"the {q}th percentile of {size} values should be "
                                          f"{expected} (numpy.percentile, linear), got {got}. "
                                          "Hint: rank q / 100 * (n - 1) on the sorted values, "
                                          "0-based.")
    assert math.isnan(ch06.percentile([None, None], 50)), "no values: the percentile is NaN"


def test_ch06_run_percentiles_and_goodput_match_minicb(engine_metrics):
    requests = [wall_clock(m) for m in engine_metrics]
    ttfts = [ch06.time_to_first_token(r) for r in requests]
    tpots = [ch06.time_per_output_token(r) for r in requests]
    for name, mine, theirs in [("TTFT", ttfts, [m.ttft for m in engine_metrics]),
                               ("TPOT", tpots, [m.tpot for m in engine_metrics])]:
        expected = percentiles(theirs, QUANTILES)
        for q in QUANTILES:
            got = ch06.percentile(mine, q)
            assert close(got, expected[f"p{q}"]), \
                f"{name} p{q} over the run should be {expected[f'p{q}']}, got {got} (from {mine})"
    # targets at the run's own medians, so some requests meet them and some do not
    slo_ttft, slo_tpot = percentiles(ttfts)["p50"], percentiles(tpots)["p50"]
    for targets in [dict(slo_ttft=slo_ttft), dict(slo_tpot=slo_tpot),
                    dict(slo_ttft=slo_ttft, slo_tpot=slo_tpot)]:
        expected = summarize(engine_metrics, **targets).goodput
        got = ch06.goodput(requests, **targets)
        assert close(got, expected), (f"goodput with {targets} should be {expected} requests/s, "
                                      f"got {got}. Hint: a one-token request has no TPOT and "
                                      "passes a TPOT target; the run lasts from first arrival to "
                                      "last finish.")


def test_ch06_metrics_in_engine_steps_match_the_simulator():
    """Virtual time: the same functions on step numbers give minicb's *_steps metrics."""
    workload = chat(n=24, seed=16).with_arrivals(poisson_arrivals(24, rate=0.05, seed=16))
    metrics = simulate(workload, max_num_seqs=4).metrics
    requests = [
        ch06.RequestTimestamps(m.arrival_step, [float(s) for s in m.token_steps], m.finished_step)
        for m in metrics]
    for index, (r, m) in enumerate(zip(requests, metrics)):
        got = (ch06.time_to_first_token(r), ch06.time_per_output_token(r))
        assert close(got[0], m.ttft_steps) and close(got[1], m.tpot_steps), (
            f"request {index}: arrival step {m.arrival_step}, tokens at steps {m.token_steps}: "
            f"TTFT, TPOT in "
            f"steps should be {m.ttft_steps}, {m.tpot_steps}; got {got[0]}, {got[1]}")
    summary = summarize(metrics, virtual=True)
    got = ch06.percentile([ch06.time_to_first_token(r) for r in requests], 95)
    assert close(got, summary.ttft["p95"]), (f"p95 TTFT in steps should be {summary.ttft['p95']}, "
                                             f"got {got}")

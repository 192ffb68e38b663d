"""Chapter 00: percentiles, goodput and the knee from load-test traces, against minicb.metrics on
traces of the real scheduler (simulated at several offered rates) and of the real engine."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from adapter import chapter, run_docstring_examples
from engine_probe import greedy, random_prompts

from minicb import LLM
from minicb.metrics import RequestMetrics, summarize
from minicb.sim import CostModel, simulate
from minicb.sim.workload import chat, poisson_arrivals

ch00 = chapter("00")
QUANTILES = (0, 50, 90, 95, 99, 100)
# chapter 00's section 5: its cost model, its targets and offered rates (fewer requests)
COST = CostModel(step_overhead=1.0, decode_seq=0.05, prefill_token=1 / 64)
SLO_TTFT, SLO_TPOT = 20, 2.0
RATES = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5)


def close(a, b, rel=1e-9) -> bool:
    return (a is None and b is None) or (a is not None and b is not None
                                         and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12))


def trace_of(metrics: list[RequestMetrics]):
    return [ch00.TraceRow(m.arrival_time, m.token_times[0] if m.token_times else None,
                          m.token_times[-1] if m.token_times else None, len(m.token_times))
            for m in metrics]


@pytest.fixture(scope="module")
def sweep() -> dict[float, list[RequestMetrics]]:
    """The real continuous scheduler serving 120 chat requests at each offered rate."""
    workload = chat(120, seed=0)
    return {rate: simulate(workload.with_arrivals(poisson_arrivals(len(workload), rate, seed=1)),
                           cost=COST, max_num_seqs=16).metrics for rate in RATES}


def test_ch00_worked_examples():
    run_docstring_examples(ch00)


def test_ch00_percentiles_match_numpy():
    rng = random.Random(5)
    for size in (1, 2, 7, 100):
        values = [rng.expovariate(1.0) for _ in range(size)]
        for q in QUANTILES:
            got, expected = ch00.percentile(values, q), float(np.percentile(values, q))
            assert close(got, expected), (f"the {q}th percentile of {size} values should be "
                                          f"{expected} (numpy.percentile, linear), got {got}. "
                                          "Hint: rank q / 100 * (n - 1) on the sorted values, "
                                          "0-based.")
    assert math.isnan(ch00.percentile([None, None], 50)), "no values: the percentile is NaN"


def test_ch00_sim_traces_give_minicbs_percentiles_and_goodput(sweep):
    for rate, metrics in sweep.items():
        trace = trace_of(metrics)
        expected = summarize(metrics, slo_ttft=SLO_TTFT, slo_tpot=SLO_TPOT)
        for name, mine, theirs in [("TTFT", [ch00.ttft(r) for r in trace], expected.ttft),
                                   ("TPOT", [ch00.tpot(r) for r in trace], expected.tpot)]:
            for q in (50, 95, 99):
                got = ch00.percentile(mine, q)
                assert close(got, theirs[f"p{q}"]), (f"at rate {rate}: {name} p{q} should be "
                                                     f"{theirs[f'p{q}']}, got {got}")
        for targets in [dict(slo_ttft=SLO_TTFT), dict(slo_tpot=SLO_TPOT),
                        dict(slo_ttft=SLO_TTFT, slo_tpot=SLO_TPOT)]:
            want = summarize(metrics, **targets).goodput
            got = ch00.goodput(trace, **targets)
            assert close(got, want), (f"at rate {rate}: goodput with {targets} should be {want} "
                                      f"requests per time unit, got {got}. Hint: a request counts "
                                      "only if it meets every given target; the run lasts from "
                                      "the first arrival to the last token.")


def test_ch00_sim_knee_and_capacity_match_minicbs(sweep):
    summaries = {rate: summarize(m, slo_ttft=SLO_TTFT, slo_tpot=SLO_TPOT)
                 for rate, m in sweep.items()}
    best = max(s.goodput for s in summaries.values())
    knee = min(rate for rate, s in summaries.items() if s.goodput == best)
    busiest = max(summaries, key=lambda rate: summaries[rate].request_throughput)
    assert knee != busiest, "the sweep must put the knee below the highest throughput"
    traces = {rate: trace_of(m) for rate, m in sweep.items()}
    got = ch00.knee(traces, slo_ttft=SLO_TTFT, slo_tpot=SLO_TPOT)
    assert got == knee, (f"the knee should be rate {knee} (goodput {best:.4f}); got {got}. "
                         "Goodput by rate: " + ", ".join(f"{r}: {s.goodput:.4f}"
                                                         for r, s in summaries.items()))
    for target in (5.0, SLO_TTFT, 200.0):
        within = [rate for rate, s in summaries.items() if s.ttft["p95"] <= target]
        want = max(within, default=None)
        got = ch00.highest_rate_within(traces, slo_ttft=target)
        assert got == want, (f"the highest rate with p95 TTFT <= {target} should be {want}; got "
                             f"{got}. p95 TTFT by rate: "
                             + ", ".join(f"{r}: {s.ttft['p95']:.1f}" for r, s in summaries.items()))


def test_ch00_real_engine_trace(tiny_llama):
    llm = LLM(tiny_llama, max_num_seqs=2, block_size=4)
    lengths = [6, 1, 9, 4, 7]
    outputs = llm.generate(random_prompts([5, 9, 3, 12, 6], 512, seed=3),
                           [greedy(n) for n in lengths], use_tqdm=False)
    metrics = [o.metrics for o in outputs]
    for index, (row, m) in enumerate(zip(trace_of(metrics), metrics)):
        assert close(ch00.ttft(row), m.ttft) and close(ch00.tpot(row), m.tpot), (
            f"request {index} ({row}): TTFT, TPOT should be {m.ttft}, {m.tpot}; got "
            f"{ch00.ttft(row)}, {ch00.tpot(row)}")
    # the engine stamps a request finished a few microseconds after its last token
    summary = summarize(metrics, slo_ttft=float(np.median([m.ttft for m in metrics])))
    got = ch00.goodput(trace_of(metrics), slo_ttft=float(np.median([m.ttft for m in metrics])))
    assert close(got, summary.goodput, rel=1e-2), (f"goodput should be {summary.goodput} "
                                                   f"requests/s, got {got}")

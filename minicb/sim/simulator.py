"""simulate: serve a workload in virtual time, with the REAL scheduler and KV manager stepped by
the engine core (minicb.engine.core.EngineCore) on the cost-model executor (minicb.sim.cost_model).

No tensors, so notebooks can schedule thousands of requests in a second, and the book's worked
examples come out of the same code that serves real requests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from minicb.config import EngineConfig
from minicb.engine.core import EngineCore
from minicb.kv import make_kv_manager
from minicb.metrics import (
    RequestMetrics,
    StepStats,
    StepSummary,
    Summary,
    count_step,
    summarize,
    summarize_steps,
)
from minicb.params import SamplingParams
from minicb.request import Request
from minicb.scheduler import make_scheduler
from minicb.sim.cost_model import CostModel, CostModelExecutor
from minicb.sim.workload import Workload, poisson_arrivals


@dataclass
class StepRecord:
    step: int
    start: float
    end: float
    rows: list[tuple[str, str, int]]     # (request id, "prefill" | "decode" | "idle", tokens)
    # the counts the real engine keeps too (minicb.metrics.count_step)
    stats: StepStats
    num_free_blocks: int
    block_tables: dict[str, list[int]]
    preempted: list[str]
    # CPU seconds this step spent in schedule() + update(), the CPU side of the loop (thread time:
    # other processes sharing the core do not inflate it)
    scheduler_seconds: float = field(default=0.0, repr=False, compare=False)

    @property
    def num_pad_tokens(self) -> int:
        """Left padding + ghost rows."""
        return self.stats.num_pad_tokens

    @property
    def num_reserved_slots(self) -> int:
        """KV slots held by live requests after the step."""
        return self.stats.num_reserved_slots

    @property
    def num_kv_tokens(self) -> int:
        """Tokens whose K/V sit in those slots."""
        return self.stats.num_kv_tokens


@dataclass
class SimResult:
    config: EngineConfig
    requests: list[Request]
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def metrics(self) -> list[RequestMetrics]:
        return [RequestMetrics.from_request(r) for r in self.requests]

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def total_time(self) -> float:
        return self.steps[-1].end if self.steps else 0.0

    def summary(self, virtual: bool = True, **slo) -> Summary:
        return summarize(self.metrics, virtual=virtual, **slo)

    def step_summary(self) -> StepSummary:
        """Slot utilisation, padding waste and KV utilisation, as the engine's `step_stats` give
        them."""
        return summarize_steps(s.stats for s in self.steps)

    def slot_utilisation(self) -> float:
        """Share of slot-steps that produced a useful token (the rest idle or empty)."""
        return self.step_summary().slot_utilisation if self.steps else 0.0

    def finish_steps(self) -> dict[str, int]:
        return {r.request_id: r.times.finished_step for r in self.requests}


def simulate(workload: Workload, cost: CostModel | None = None, record_blocks: bool = False,
             max_steps: int = 1_000_000, **knobs) -> SimResult:
    """Serve `workload` with the scheduler and KV manager the knobs choose, in virtual time.

    knobs are EngineConfig's (scheduler, kv_cache, max_num_seqs, max_num_batched_tokens,
    max_model_len, block_size, num_kv_blocks, policy, ...). max_model_len defaults to the
    longest request of the workload.
    """
    cost = cost or CostModel()
    knobs.setdefault("max_model_len", max(r.prompt_len + r.output_len for r in workload.requests))
    asked = EngineConfig(**knobs)
    if asked.speculative_method is not None:
        raise ValueError("the simulator has no model to verify proposals with; leave "
                         "speculative_method unset here and measure speculation on the engine.")
    config = asked.resolve(asked.max_model_len)
    kv = make_kv_manager(config.kv_cache, config.num_kv_blocks, config.block_size,
                         config.max_model_len, config.enable_prefix_caching)
    executor = CostModelExecutor(cost)
    clock = executor.clock
    # the real scheduler's own stop checks (here: max_tokens and max_model_len; no EOS)
    scheduler = make_scheduler(config, kv, clock)
    core = EngineCore(scheduler, executor, host_timer=time.thread_time)
    pending = sorted(enumerate(workload.requests), key=lambda item: (item[1].arrival, item[0]))
    requests: list[Request] = []
    result = SimResult(config, requests)
    next_arrival = 0
    while next_arrival < len(pending) or scheduler.has_unfinished():
        if not scheduler.has_unfinished():
            clock.wait_until(pending[next_arrival][1].arrival)   # idle until the next arrival
        while next_arrival < len(pending) and pending[next_arrival][1].arrival <= clock.now:
            index, spec = pending[next_arrival]
            request = Request(
                str(index), [1] * spec.prompt_len,
                SamplingParams(max_tokens=spec.output_len, temperature=0, ignore_eos=True),
                arrival_time=spec.arrival, arrival_step=scheduler.step_count,
                priority=spec.priority, arrival_index=index)
            try:
                scheduler.check_fits(spec.prompt_len, spec.output_len)
            except ValueError as error:
                raise ValueError(f"request {index}: {error}") from None
            scheduler.add_request(request)
            requests.append(request)
            next_arrival += 1
        start = clock.now
        done = core.step()           # the step ends at start + its cost: the clock is there now
        plan = done.plan
        if plan is None:             # requests wait, none can run: only an arrival can change that
            if len(result.steps) >= max_steps or next_arrival >= len(pending):
                raise RuntimeError("the scheduler made no progress; check the knobs (KV pool too "
                                   "small?).")
            clock.wait_until(pending[next_arrival][1].arrival)
            continue
        rows = [(s.request.request_id,
                 "idle" if s.ghost else "decode" if s.is_decode else "prefill",
                 s.num_tokens) for s in plan.seqs]
        tables = {s.request.request_id: s.block_table for s in plan.seqs} if record_blocks else {}
        stats = count_step(plan, kv, scheduler.running, config.max_num_seqs)
        result.steps.append(StepRecord(plan.step, start, clock.now, rows, stats,
                                       kv.num_free_blocks(), tables,
                                       [r.request_id for r in plan.preempted],
                                       done.schedule_seconds + done.update_seconds))
    requests.sort(key=lambda r: r.arrival_index)
    return result


def serving_row(result: SimResult, slo_ttft: float | None = None,
                slo_tpot: float | None = None) -> dict:
    """Throughput, latency percentiles and goodput of one run, in cost-model time units.

    `slo_share` is the fraction of requests that met every given target; goodput is those
    requests per time unit."""
    summary = result.summary(virtual=False, slo_ttft=slo_ttft, slo_tpot=slo_tpot)
    met = summary.goodput / summary.request_throughput if summary.goodput is not None else None
    return {"requests_per_unit": summary.request_throughput,
            "tokens_per_unit": summary.output_throughput, "goodput": summary.goodput,
            "slo_share": met, "ttft_p50": summary.ttft["p50"], "ttft_p95": summary.ttft["p95"],
            "tpot_p95": summary.tpot["p95"], "itl_p99": summary.itl["p99"],
            "time_units": result.total_time,
            "preemptions": sum(len(s.preempted) for s in result.steps)}


def serve_at_rates(workload: Workload, rates: Sequence[float], cost: CostModel | None = None,
                   slo_ttft: float | None = None, slo_tpot: float | None = None, seed: int = 0,
                   **knobs) -> list[dict]:
    """The workload arriving as a Poisson process at each rate (requests per time unit; inf: all
    at once, an offline batch job), served by the scheduler the knobs choose: one row per rate."""
    rows = []
    for rate in rates:
        timed = workload.with_arrivals(poisson_arrivals(len(workload), rate, seed=seed))
        result = simulate(timed, cost=cost, **knobs)
        rows.append({"rate": rate, **serving_row(result, slo_ttft, slo_tpot)})
    return rows

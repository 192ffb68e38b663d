"""Serving metrics, defined once for the whole book.

Per request (from its timestamps):
  TTFT  time to first token   = first token − arrival            (includes queueing)
  TPOT  time per output token = (last token − first token) / (output tokens − 1)
  ITL   inter-token latencies = gaps between consecutive tokens
  E2E   end-to-end latency    = finish − arrival
  queue time                  = first scheduled − arrival
Each exists in seconds (wall clock) and in engine steps (virtual time: deterministic, so the
notebooks can print exact tables). The definitions follow vLLM's serving benchmark.

Per step (counts, so deterministic): `count_step` turns one step's plan and the KV it left held
into a `StepStats`; the engine and the cost-model runner (minicb.sim) both call it.
`summarize_steps` folds them into
  slot utilisation  useful rows / request slots (max_num_seqs) over all steps; a static batch's
                    finished ("ghost") rows and empty slots are the rest
  padding waste     padding + ghost tokens / all token rows computed (static batching's loss)
  KV utilisation    tokens stored / KV slots reserved, summed over steps (so each step weighs by
                    what it reserved); 1 - it is the share of reserved KV that sat empty
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float | None
    token_times: list[float]
    arrival_step: int
    first_scheduled_step: int | None
    first_token_step: int | None
    finished_step: int | None
    token_steps: list[int]
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    # speculative decoding: tokens proposed, proposals accepted, verification rows run
    num_proposed_tokens: int = 0
    num_accepted_tokens: int = 0
    num_verify_steps: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        """Share of the proposed tokens the target accepted (None: nothing was proposed)."""
        return self.num_accepted_tokens / self.num_proposed_tokens \
            if self.num_proposed_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens a verification step emitted on average: accepted proposals + the target's one."""
        return (self.num_accepted_tokens + self.num_verify_steps) / self.num_verify_steps \
            if self.num_verify_steps else None

    @classmethod
    def from_request(cls, request) -> RequestMetrics:
        t = request.times
        return cls(t.arrival, t.first_scheduled, t.first_token,
                   t.token_times[-1] if t.token_times else None, t.finished, list(t.token_times),
                   t.arrival_step, t.first_scheduled_step, t.first_token_step, t.finished_step,
                   list(t.token_steps), request.num_prompt_tokens, request.num_output_tokens,
                   request.num_preemptions, request.num_cached_tokens,
                   request.num_proposed_tokens, request.num_accepted_tokens,
                   request.num_verify_steps)

    # wall clock (seconds)
    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        if self.num_output_tokens < 2 or self.last_token_time is None:
            return None
        return (self.last_token_time - self.first_token_time) / (self.num_output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        return list(np.diff(self.token_times)) if len(self.token_times) > 1 else []

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        return (None if self.first_scheduled_time is None else self.first_scheduled_time
                - self.arrival_time)

    # virtual time (engine steps); a token made in step s is "ready" at the end of step s
    @property
    def ttft_steps(self) -> int | None:
        return None if self.first_token_step is None else self.first_token_step - self.arrival_step

    @property
    def tpot_steps(self) -> float | None:
        if len(self.token_steps) < 2:
            return None
        return (self.token_steps[-1] - self.token_steps[0]) / (len(self.token_steps) - 1)

    @property
    def e2e_steps(self) -> int | None:
        return None if not self.token_steps else self.token_steps[-1] - self.arrival_step

    @property
    def queue_steps(self) -> int | None:
        return (None if self.first_scheduled_step is None else self.first_scheduled_step - 1
                - self.arrival_step)


def percentiles(values: Iterable[float],
                qs: Sequence[float] = (50, 90, 95, 99)) -> dict[str, float]:
    """{'mean', 'p50', 'p90', ...} of the values that are not None; NaN when there are none."""
    data = np.array([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return {"mean": float("nan"), **{f"p{q:g}": float("nan") for q in qs}}
    return {"mean": float(data.mean()), **{f"p{q:g}": float(np.percentile(data, q)) for q in qs}}


@dataclass
class Summary:
    """Aggregates over a finished run."""

    num_requests: int
    duration: float
    output_tokens: int
    prompt_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: dict[str, float]
    tpot: dict[str, float]
    itl: dict[str, float]
    e2e: dict[str, float]
    queue: dict[str, float]
    goodput: float | None = None
    extra: dict = field(default_factory=dict)
    steps: StepSummary | None = None   # slot, padding and KV use, when summarize() was given steps

    def row(self) -> dict[str, float]:
        """A flat dict, handy for tables."""
        return {"requests": self.num_requests, "duration_s": self.duration,
                "out_tok/s": self.output_throughput, "req/s": self.request_throughput,
                "ttft_p50": self.ttft["p50"], "ttft_p95": self.ttft["p95"],
                "tpot_p50": self.tpot["p50"], "tpot_p95": self.tpot["p95"],
                "e2e_p95": self.e2e["p95"]}


def meets_slo(m: RequestMetrics, ttft: float | None = None, tpot: float | None = None,
              virtual: bool = False) -> bool:
    """Goodput's test: did this request meet every given target?"""
    got_ttft, got_tpot = (m.ttft_steps, m.tpot_steps) if virtual else (m.ttft, m.tpot)
    if ttft is not None and (got_ttft is None or got_ttft > ttft):
        return False
    return not (tpot is not None and got_tpot is not None and got_tpot > tpot)


def summarize(metrics: Sequence[RequestMetrics], virtual: bool = False,
              slo_ttft: float | None = None, slo_tpot: float | None = None,
              steps: StepTotals | Iterable[StepStats] | None = None) -> Summary:
    """Throughput, latency percentiles and goodput; `virtual=True` measures in engine steps.

    `steps` (an engine's `step_stats`, or StepStats records) adds `Summary.steps`."""
    if virtual:
        start = min(m.arrival_step for m in metrics)
        end = max(m.finished_step or m.arrival_step for m in metrics)
        duration = float(end - start + 1)
        ttfts, tpots = [m.ttft_steps for m in metrics], [m.tpot_steps for m in metrics]
        e2es, queues = [m.e2e_steps for m in metrics], [m.queue_steps for m in metrics]
        itls = [float(g) for m in metrics for g in np.diff(m.token_steps)]
    else:
        start = min(m.arrival_time for m in metrics)
        end = max(m.finished_time or m.arrival_time for m in metrics)
        duration = max(end - start, 1e-9)
        ttfts, tpots = [m.ttft for m in metrics], [m.tpot for m in metrics]
        e2es, queues = [m.e2e for m in metrics], [m.queue_time for m in metrics]
        itls = [g for m in metrics for g in m.itl]
    output_tokens = sum(m.num_output_tokens for m in metrics)
    prompt_tokens = sum(m.num_prompt_tokens for m in metrics)
    goodput = None
    if slo_ttft is not None or slo_tpot is not None:
        goodput = sum(meets_slo(m, slo_ttft, slo_tpot, virtual) for m in metrics) / duration
    return Summary(len(metrics), duration, output_tokens, prompt_tokens, len(metrics) / duration,
                   output_tokens / duration, (output_tokens + prompt_tokens) / duration,
                   percentiles(ttfts), percentiles(tpots), percentiles(itls), percentiles(e2es),
                   percentiles(queues), goodput,
                   steps=None if steps is None else summarize_steps(steps))


# --- per step
# ---------------------------------------------------------------------------------------
@dataclass(slots=True)
class StepStats:
    """One step that ran the model. KV counts are read after the step's update: what it left
    held."""

    step: int
    num_slots: int            # request slots the engine has (max_num_seqs)
    num_rows: int             # rows in the batch, a static batch's ghost rows included
    num_useful_rows: int      # rows that are not ghosts: the slots doing useful work
    num_tokens: int           # token rows computed: real tokens + left padding + ghost rows
    num_pad_tokens: int       # left padding + ghost rows: computed, then thrown away
    num_prefill_tokens: int
    num_decode_tokens: int    # ghost rows excluded
    num_reserved_slots: int   # KV slots held by live requests
    num_kv_tokens: int        # tokens whose K/V sit in those slots
    num_preempted: int = 0


def count_step(plan, kv, running: Iterable, num_slots: int) -> StepStats:
    """The counts of one step: `plan` is its SchedulerOutput (which counts its own rows and
    tokens), `kv` the KV manager and `running` the scheduler's running requests, both read after
    the step's update. No per-token work."""
    return StepStats(plan.step, num_slots, len(plan.seqs), plan.num_useful_rows, plan.num_tokens,
                     plan.num_pad_tokens, plan.num_prefill_tokens, plan.num_decode_tokens,
                     kv.num_reserved_slots(), sum(r.num_computed_tokens for r in running),
                     len(plan.preempted))


class StepTotals:
    """Running sums of StepStats (constant memory, so a long-running server can keep one) and the
    last `window` steps themselves in `recent`."""

    def __init__(self, window: int = 1024):
        self.recent: deque[StepStats] = deque(maxlen=window)
        self.reset()

    def reset(self) -> None:
        """Start counting afresh (say, before the run to measure)."""
        self.num_steps = self.num_slots = self.num_rows = self.num_useful_rows = 0
        self.num_tokens = self.num_pad_tokens = self.num_prefill_tokens = self.num_decode_tokens = 0
        self.num_reserved_slots = self.num_kv_tokens = self.num_preempted = 0
        self.peak_reserved_slots = 0      # the most KV slots reserved after any one step
        self.recent.clear()

    def add(self, stats: StepStats) -> None:
        self.num_steps += 1
        self.num_slots += stats.num_slots
        self.num_rows += stats.num_rows
        self.num_useful_rows += stats.num_useful_rows
        self.num_tokens += stats.num_tokens
        self.num_pad_tokens += stats.num_pad_tokens
        self.num_prefill_tokens += stats.num_prefill_tokens
        self.num_decode_tokens += stats.num_decode_tokens
        self.num_reserved_slots += stats.num_reserved_slots
        self.peak_reserved_slots = max(self.peak_reserved_slots, stats.num_reserved_slots)
        self.num_kv_tokens += stats.num_kv_tokens
        self.num_preempted += stats.num_preempted
        self.recent.append(stats)

    def summary(self) -> StepSummary:
        return summarize_steps(self)

    def __repr__(self) -> str:
        return f"StepTotals(num_steps={self.num_steps}, {self.summary()})"


@dataclass
class StepSummary:
    """Aggregates over steps; NaN where there is nothing to divide by."""

    num_steps: int
    slot_utilisation: float   # useful rows / (steps × max_num_seqs)
    padding_waste: float      # padding + ghost tokens / token rows computed
    kv_utilisation: float     # Σ tokens stored / Σ KV slots reserved, over steps
    mean_running: float       # useful rows per step
    num_preempted: int

    def row(self) -> dict[str, float]:
        return {"steps": self.num_steps, "slot_util": self.slot_utilisation,
                "pad_waste": self.padding_waste, "kv_util": self.kv_utilisation}


def summarize_steps(steps: StepTotals | Iterable[StepStats]) -> StepSummary:
    """Slot utilisation, padding waste and KV utilisation of an engine's `step_stats` (all steps
    since
    its last reset) or of any StepStats records (e.g. a simulation's)."""
    if not isinstance(steps, StepTotals):
        totals = StepTotals(window=0)
        for stats in steps:
            totals.add(stats)
        steps = totals

    def ratio(a: int, b: int) -> float:
        return a / b if b else float("nan")

    return StepSummary(steps.num_steps, ratio(steps.num_useful_rows, steps.num_slots),
                       ratio(steps.num_pad_tokens, steps.num_tokens),
                       ratio(steps.num_kv_tokens, steps.num_reserved_slots),
                       ratio(steps.num_useful_rows, steps.num_steps), steps.num_preempted)

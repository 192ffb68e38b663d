"""Serving metrics, defined once for the whole book.

Per request (from its timestamps):
  TTFT  time to first token   = first token − arrival            (includes queueing)
  TPOT  time per output token = (last token − first token) / (output tokens − 1)
  ITL   inter-token latencies = gaps between consecutive tokens
  E2E   end-to-end latency    = finish − arrival
  queue time                  = first scheduled − arrival
Each exists in seconds (wall clock) and in engine steps (virtual time: deterministic, so the
notebooks can print exact tables). The definitions follow vLLM's serving benchmark.
"""

from __future__ import annotations

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

    @classmethod
    def from_request(cls, request) -> RequestMetrics:
        t = request.times
        return cls(t.arrival, t.first_scheduled, t.first_token, t.token_times[-1] if t.token_times else None,
                   t.finished, list(t.token_times), t.arrival_step, t.first_scheduled_step, t.first_token_step,
                   t.finished_step, list(t.token_steps), request.num_prompt_tokens, request.num_output_tokens,
                   request.num_preemptions, getattr(request, "num_cached_tokens", 0))

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
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

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
        return None if self.first_scheduled_step is None else self.first_scheduled_step - 1 - self.arrival_step


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 90, 95, 99)) -> dict[str, float]:
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

    def row(self) -> dict[str, float]:
        """A flat dict, handy for tables."""
        return {"requests": self.num_requests, "duration_s": self.duration, "out_tok/s": self.output_throughput,
                "req/s": self.request_throughput, "ttft_p50": self.ttft["p50"], "ttft_p95": self.ttft["p95"],
                "tpot_p50": self.tpot["p50"], "tpot_p95": self.tpot["p95"], "e2e_p95": self.e2e["p95"]}


def meets_slo(m: RequestMetrics, ttft: float | None = None, tpot: float | None = None,
              virtual: bool = False) -> bool:
    """Goodput's test: did this request meet every given target?"""
    got_ttft, got_tpot = (m.ttft_steps, m.tpot_steps) if virtual else (m.ttft, m.tpot)
    if ttft is not None and (got_ttft is None or got_ttft > ttft):
        return False
    return not (tpot is not None and got_tpot is not None and got_tpot > tpot)


def summarize(metrics: Sequence[RequestMetrics], virtual: bool = False, slo_ttft: float | None = None,
              slo_tpot: float | None = None) -> Summary:
    """Throughput, latency percentiles and goodput; `virtual=True` measures in engine steps."""
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
                   percentiles(queues), goodput)

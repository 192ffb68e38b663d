"""Chapter 06 exercise: serving metrics from timestamps: TTFT, TPOT, ITL, percentiles, goodput.

A server is judged by what its users feel, measured per request from three kinds of timestamps:
when the request arrived, when each output token came out, and when it finished.

    arrival        token 1      token 2   token 3         finished
       |──── TTFT ────|── ITL ──|── ITL ──|                   |
       |─────────────────────── E2E ──────────────────────────|
    TPOT = (last token - first token) / (tokens - 1): the mean gap once tokens flow

TTFT includes the time spent queueing: that is what a user waits before anything appears.
Means hide the unlucky; serving reports percentiles (p50, p90, p99). Goodput counts only the
requests that met every latency target (SLO), per second: a server that floods out tokens while
each user waits ten seconds for the first one has high throughput and no goodput.

The definitions follow vLLM's serving benchmark, as minicb.metrics does; the tests compare your
functions with minicb.metrics on the timestamps of real engine runs and simulated ones. The
same functions work in seconds and in engine steps: a timestamp is just a number.

Grade it: make grade CH=06
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class RequestTimestamps:
    arrival: float
    token_times: list[float]        # when each output token came out, in order
    finished: float | None = None   # None while the request is still running


def time_to_first_token(request: RequestTimestamps) -> float | None:
    """First token - arrival; None before the first token.

    >>> time_to_first_token(RequestTimestamps(arrival=1.0, token_times=[1.5, 1.75, 2.5]))
    0.5
    """
    # BEGIN SOLUTION: first token time minus arrival, None if there is no token yet
    return request.token_times[0] - request.arrival if request.token_times else None
    # END SOLUTION


def inter_token_latencies(request: RequestTimestamps) -> list[float]:
    """The gaps between consecutive output tokens (empty with fewer than two tokens).

    >>> inter_token_latencies(RequestTimestamps(arrival=1.0, token_times=[1.5, 1.75, 2.5]))
    [0.25, 0.75]
    """
    # BEGIN SOLUTION: differences of consecutive token times
    times = request.token_times
    return [later - earlier for earlier, later in zip(times, times[1:])]
    # END SOLUTION


def time_per_output_token(request: RequestTimestamps) -> float | None:
    """(last token - first token) / (number of tokens - 1); None with fewer than two tokens.

    The first token's wait is TTFT's, not TPOT's. Below, (2.5 - 1.5) / 2 = 0.5: the mean of the
    inter-token latencies.

    >>> time_per_output_token(RequestTimestamps(arrival=1.0, token_times=[1.5, 1.75, 2.5]))
    0.5
    >>> time_per_output_token(RequestTimestamps(arrival=1.0, token_times=[1.5])) is None
    True
    """
    # BEGIN SOLUTION: span from first to last token over the gaps between them; None for < 2 tokens
    times = request.token_times
    if len(times) < 2:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)
    # END SOLUTION


def end_to_end_latency(request: RequestTimestamps) -> float | None:
    """Finished - arrival; None while running.

    >>> end_to_end_latency(RequestTimestamps(arrival=1.0, token_times=[1.5, 2.5], finished=2.5))
    1.5
    """
    # BEGIN SOLUTION: finish time minus arrival, None if not finished
    return None if request.finished is None else request.finished - request.arrival
    # END SOLUTION


def percentile(values: Sequence[float | None], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of the values that are not None; NaN if none are.

    Linear interpolation between the two nearest ranks, as numpy.percentile does by default:
    sort the n values; the percentile sits at rank r = q / 100 * (n - 1) (0-based); between
    ranks floor(r) and ceil(r), interpolate linearly.

    >>> percentile([4.0, 1.0, 3.0, 2.0], 50)    # rank 1.5: halfway between 2 and 3
    2.5
    >>> percentile([10.0, 20.0, None], 90)      # rank 0.9 of [10, 20]
    19.0
    >>> percentile([3.0, 1.0, 2.0], 100), percentile([], 50)
    (3.0, nan)
    """
    data = sorted(v for v in values if v is not None)
    if not data:
        return math.nan
    # BEGIN SOLUTION: interpolate linearly between the sorted values at rank q / 100 * (n - 1)
    rank = q / 100 * (len(data) - 1)
    below, above = math.floor(rank), math.ceil(rank)
    return data[below] + (data[above] - data[below]) * (rank - below)
    # END SOLUTION


def meets_slo(request: RequestTimestamps, slo_ttft: float | None = None,
              slo_tpot: float | None = None) -> bool:
    """Whether the request met every given target (None = no target on that metric).

    TTFT must be at most slo_ttft (a request with no token yet fails it); TPOT at most slo_tpot
    (a one-token request has no TPOT and passes that target).

    >>> fast_start = RequestTimestamps(arrival=0.0, token_times=[0.1, 1.1, 2.1])  # TTFT .1
    >>> meets_slo(fast_start, slo_ttft=0.2), meets_slo(fast_start, slo_ttft=0.2, slo_tpot=0.5)
    (True, False)
    """
    # BEGIN SOLUTION: check TTFT (missing fails) and TPOT (missing passes) against the given targets
    ttft, tpot = time_to_first_token(request), time_per_output_token(request)
    if slo_ttft is not None and (ttft is None or ttft > slo_ttft):
        return False
    return slo_tpot is None or tpot is None or tpot <= slo_tpot
    # END SOLUTION


def goodput(requests: Sequence[RequestTimestamps], slo_ttft: float | None = None,
            slo_tpot: float | None = None) -> float:
    """Requests that met every target, per unit of time of the run.

    The run lasts from the earliest arrival to the latest finish (a request not finished counts
    as finishing at its arrival).

    Worked example: three requests over 0 → 4 s; two start within 0.5 s, the third waits 2 s,
    so with slo_ttft = 0.5 s the goodput is 2 requests / 4 s.

    >>> run = [RequestTimestamps(0.0, [0.2, 0.4], 0.4), RequestTimestamps(1.0, [1.5, 2.0], 2.0),
    ...        RequestTimestamps(1.0, [3.0, 4.0], 4.0)]
    >>> goodput(run, slo_ttft=0.5)
    0.5
    """
    # BEGIN SOLUTION: count meets_slo over the run's duration (earliest arrival to latest finish)
    start = min(r.arrival for r in requests)
    end = max(r.arrival if r.finished is None else r.finished for r in requests)
    good = sum(meets_slo(r, slo_ttft, slo_tpot) for r in requests)
    return good / max(end - start, 1e-9)
    # END SOLUTION

"""Chapter 00 exercise: read a load test: percentiles, goodput, and where the knee is.

A load test leaves a trace behind: one row per request, with when it arrived, when its first
token came out, when its last one did and how many tokens it wrote. Chapter 00's numbers all come
from such traces:

* the percentiles of TTFT (p50, p95, p99): the mean hides the users at the back of the queue;
* goodput: the requests that met *every* target (TTFT and TPOT), per unit of time of the run;
* from traces at several offered rates, the **knee**: the rate with the highest goodput, and the
  highest rate whose p95 TTFT still meets its target. Past the knee throughput keeps rising a
  little while goodput falls, because the extra requests only lengthen the queue.

The tests compare your functions with `minicb.metrics.summarize` on traces of the real
scheduler (in the simulator, at the offered rates of chapter 00's section 5) and of the real
engine. A trace's times can be seconds or cost-model time units: a time is just a number.

Grade it: make grade CH=00
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass
class TraceRow:
    arrival: float
    first_token: float | None      # None: the request never produced a token
    last_token: float | None       # when its last token came out (None: no token)
    output_tokens: int


def ttft(row: TraceRow) -> float | None:
    """Time to first token: first token - arrival (queueing included); None without a token.

    >>> ttft(TraceRow(arrival=2.0, first_token=2.5, last_token=4.0, output_tokens=5))
    0.5
    """
    # BEGIN SOLUTION: first token minus arrival; None when there is no first token
    if row.first_token is None:
        return None
    return row.first_token - row.arrival
    # END SOLUTION


def tpot(row: TraceRow) -> float | None:
    """Time per output token once tokens flow: (last token - first token) / (tokens - 1).

    The wait for the first token is TTFT's, so the gaps are one fewer than the tokens. None with
    fewer than two tokens.

    >>> tpot(TraceRow(arrival=2.0, first_token=2.5, last_token=4.5, output_tokens=5))   # 2 / 4
    0.5
    >>> tpot(TraceRow(arrival=2.0, first_token=2.5, last_token=2.5, output_tokens=1)) is None
    True
    """
    # BEGIN SOLUTION: the span from first to last token over the gaps between the tokens
    if row.first_token is None or row.last_token is None or row.output_tokens < 2:
        return None
    return (row.last_token - row.first_token) / (row.output_tokens - 1)
    # END SOLUTION


def percentile(values: Sequence[float | None], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of the values that are not None; NaN if none are.

    As numpy.percentile does by default: sort the n values, find rank r = q / 100 * (n - 1)
    (0-based) and interpolate linearly between the values at ranks floor(r) and ceil(r). With
    few values, p95 and p99 both fall between the two largest: chapter 00 shows why.

    >>> percentile([4.0, 1.0, 3.0, 2.0], 50)        # rank 1.5: halfway between 2 and 3
    2.5
    >>> percentile([1.0, 2.0, 3.0, 4.0, 100.0], 87.5)  # rank 3.5: halfway between 4 and 100
    52.0
    >>> percentile([None, 7.0], 99), percentile([], 50)
    (7.0, nan)
    """
    data = sorted(v for v in values if v is not None)
    if not data:
        return math.nan
    # BEGIN SOLUTION: interpolate linearly between the sorted values around rank q / 100 * (n - 1)
    rank = q / 100 * (len(data) - 1)
    below, above = math.floor(rank), math.ceil(rank)
    if below == above:                  # on a rank exactly (an infinite value stays infinite)
        return data[below]
    return data[below] + (data[above] - data[below]) * (rank - below)
    # END SOLUTION


def duration(trace: Sequence[TraceRow]) -> float:
    """How long the run lasted: from the earliest arrival to the latest last token (a request
    without a token counts as ending at its arrival).

    >>> duration([TraceRow(1.0, 1.5, 3.0, 4), TraceRow(2.0, None, None, 0)])
    2.0
    """
    start = min(row.arrival for row in trace)
    end = max(row.last_token if row.last_token is not None else row.arrival for row in trace)
    return end - start


def goodput(trace: Sequence[TraceRow], slo_ttft: float | None = None,
            slo_tpot: float | None = None) -> float:
    """Requests that met every given target, per unit of time of the run (`duration`).

    A target left at None is not checked. TTFT must be at most `slo_ttft` (a request without a
    token fails it); TPOT at most `slo_tpot` (a one-token request has no TPOT and passes it).

    Worked example: over 0 → 4, the first request starts at once and streams fast; the second
    starts fast but streams slowly; the third waits 2 for its first token. Only the first meets
    both targets: 1 request in 4 time units.

    >>> run = [TraceRow(0.0, 0.2, 1.0, 5), TraceRow(0.0, 0.3, 4.0, 5), TraceRow(1.0, 3.0, 3.4, 5)]
    >>> goodput(run, slo_ttft=0.5, slo_tpot=0.25), goodput(run, slo_ttft=0.5)
    (0.25, 0.5)
    """
    # BEGIN SOLUTION: requests meeting both targets / duration(); no TTFT fails, no TPOT passes
    def met(row: TraceRow) -> bool:
        first, rate = ttft(row), tpot(row)
        if slo_ttft is not None and (first is None or first > slo_ttft):
            return False
        return slo_tpot is None or rate is None or rate <= slo_tpot

    return sum(met(row) for row in trace) / duration(trace)
    # END SOLUTION


def knee(traces: Mapping[float, Sequence[TraceRow]], slo_ttft: float | None = None,
         slo_tpot: float | None = None) -> float:
    """The offered rate (a key of `traces`, one trace per rate) with the highest goodput; on a
    tie, the lowest such rate (the same goodput for less load).

    >>> calm = [TraceRow(0.0, 0.1, 1.0, 10), TraceRow(1.0, 1.1, 2.0, 10)]
    >>> busy = [TraceRow(0.0, 0.1, 1.0, 10), TraceRow(0.5, 2.0, 3.0, 10)]
    >>> knee({1.0: calm, 4.0: busy}, slo_ttft=0.5)
    1.0
    """
    # BEGIN SOLUTION: the rate whose trace has the highest goodput, the lowest rate on a tie
    return min(traces, key=lambda rate: (-goodput(traces[rate], slo_ttft, slo_tpot), rate))
    # END SOLUTION


def highest_rate_within(traces: Mapping[float, Sequence[TraceRow]], slo_ttft: float,
                        q: float = 95) -> float | None:
    """The highest offered rate whose q-th percentile TTFT is at most `slo_ttft`; None if no
    rate meets it. (A request without a first token counts as an infinite TTFT.)

    >>> calm = [TraceRow(0.0, 0.1, 1.0, 10), TraceRow(1.0, 1.1, 2.0, 10)]
    >>> busy = [TraceRow(0.0, 0.1, 1.0, 10), TraceRow(0.5, 2.0, 3.0, 10)]
    >>> highest_rate_within({1.0: calm, 4.0: busy}, slo_ttft=0.5)
    1.0
    """
    # BEGIN SOLUTION: the largest rate whose TTFT percentile (missing: infinite) meets the target
    meeting = [rate for rate, trace in traces.items()
               if percentile([math.inf if ttft(row) is None else ttft(row) for row in trace], q)
               <= slo_ttft]
    return max(meeting, default=None)
    # END SOLUTION

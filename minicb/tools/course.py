"""The course track: four milestones that build a serving engine, each graded in three layers.

1. Correctness: the chapters' exercise checks (parity with transformers and minicb; the mutants
   prove they catch wrong answers). The other two layers count only once every check passes.
2. Accuracy gate: the project's lm-eval tasks scored through the engine built from the
   student's parts, within one point of the same engine on the reference solution.
3. Performance: each bar's workload timed on the student's build and on the reference solution,
   on the same machine, alternating in fresh processes (forward then reverse order); the score
   is the ratio (1.0: as fast as the reference), so a bar holds on a laptop, a course's VM or
   a GPU. A ratio is judged against a bar by the book's rule (minicb.repeats): the sign test
   over the paired repeats must put it on one side of the bar (five of five, up to 12 of 15);
   when the repeats straddle the bar the grader says "no verdict" rather than guess.

course/README.md states the milestones and their bars for students; course/guide.md is the
instructor's guide. `python -m minicb grade PATH --milestone N` grades one.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from minicb.repeats import MIN_REPEATS, Repeats

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "solutions"
# pairs of runs (reference, student): the sign test's fewest, more while the repeats straddle a
# bar, up to 15 (which allows three repeats on the other side): a burst of other work that
# lands on a few pairs, as a shared core's neighbour does, is then outvoted by later pairs
FIRST_PAIRS, MAX_PAIRS = MIN_REPEATS, 15
RUN_TIMEOUT_S = 120


@dataclass(frozen=True)
class Bar:
    """One performance bar: a workload, what it measures, and the ratios that earn credit."""

    name: str
    workload: str
    metric: str                  # what one run returns, with its unit
    measure: str                 # the function in minicb.tools.course_bench that runs it
    unit: str
    lower_is_better: bool = True
    full: float = 0.67           # ratio to the reference for full credit (within 1.5x of it)
    partial: float = 0.33        # ratio for half the points (within 3x of it)
    points: float = 4.0
    timed: bool = True           # False: a count, the same in every run (measured once each)


@dataclass(frozen=True)
class Milestone:
    number: str
    title: str
    chapters: tuple[str, ...]    # whose exercise checks are the correctness layer
    builds: str
    runs: str
    parts: tuple[str, ...]       # the student's parts in the engine (course_bench.PARTS)
    engine: dict = field(default_factory=dict)  # the accuracy gate's engine knobs
    bars: tuple[Bar, ...] = ()


MILESTONES = {m.number: m for m in [
    Milestone(
        "1", "continuous batching and the KV loop", ("01", "02", "03"),
        "the prefill + decode loop with a KV cache (ch01), left-padded static batches (ch02) and "
        "one continuous-batching scheduler step: budget, eviction, admission (ch03)",
        "minicb's engine with your scheduler as its continuous scheduler",
        ("scheduler",), {},
        (Bar("scheduler step", "512 requests at once on 512 slots (8-token prompts, 4 out), in "
             "the cost-model simulator", "CPU time of the median step in schedule() and update()",
             "scheduler_step_us", "us/step"),)),
    Milestone(
        "2", "the paged KV cache", ("04", "05"),
        "the block allocator, the slot mapping and the paged KV manager with fork and "
        "copy-on-write (ch04), and the Triton paged-attention decode kernel (ch05)",
        "minicb's engine on your paged manager (and so your allocator)",
        ("kv_manager",), {"kv_cache": "paged"},
        (Bar("KV manager step", "128 requests of 24 + 24 tokens on 128 slots and a pool of "
             "30,000 blocks, in the cost-model simulator",
             "CPU time per step in schedule() and update(), your manager's calls included",
             "kv_manager_step_us", "us/step"),)),
    Milestone(
        "3", "prefix caching and chunked prefill", ("07", "03"),
        "the prefix cache: chained block hashes, collision-safe lookup, LRU eviction (ch07); "
        "chunked prefill in the scheduler step (ch03)",
        "minicb's paged manager keeping your prefix cache",
        ("prefix_cache",), {"kv_cache": "paged", "enable_prefix_caching": True},
        (Bar("prefix cache per request", "24 requests sharing a 2,000-token prefix, 48 tokens "
             "of their own and 16 generated, through minicb's paged manager",
             "CPU time per request of match, allocate, cache full blocks, free",
             "prefix_cache_request_us", "us/request"),)),
    Milestone(
        "4", "a track of your own: speculative decoding", ("08",),
        "prompt lookup (the n-gram proposer) and the acceptance rule, greedy and sampled (ch08)",
        "minicb's engine speculating with your proposer and your rule",
        ("speculation",), {"speculative_method": "ngram", "num_speculative_tokens": 4},
        (Bar("proposer", "prompt lookup (k=4, n 3..1) after each of the last 400 tokens of a "
             "1,600-token code-like context", "CPU time per proposal", "proposer_call_us",
             "us/call"),
         Bar("acceptance length", "the shipped model on three code prompts, 48 greedy tokens "
             "each, 4 tokens proposed per step", "tokens emitted per verification step",
             "acceptance_length", "tokens", lower_is_better=False, full=0.95, partial=0.8,
             timed=False))),
]}


@dataclass
class BarResult:
    bar: Bar
    verdict: str                 # "full", "partial", "zero", "no verdict", "not measured"
    points: float = 0.0
    ratios: Repeats | None = None
    yours: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    reason: str = ""

    def ratio_text(self) -> str:
        if self.ratios is None:
            return "-"
        return f"{self.ratios.median:.2f}" if len(self.ratios.values) == 1 else str(self.ratios)


def verdict(ratios: Repeats, full: float, partial: float) -> str:
    """full, partial or zero when the sign test puts the ratios on one side of each bar that
    decides (minicb.repeats); "no verdict" when they straddle it."""
    for bar, above in ((full, "full"), (partial, "partial")):
        side = ratios.direction(bar)
        if side == 0:
            return "no verdict"
        if side > 0:
            return above
    return "zero"


def _run_forked(measure: str, folder: Path) -> float:
    """One run of `measure` on `folder` in a fresh process, forked from this one: the child
    imports the graded code for the first time, so no run sees another's state. (A fork, not a
    new interpreter: torch's import would cost seconds a run; the timed workloads are Python.)"""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child: measure, report, vanish
        os.close(read)
        try:
            from minicb.tools import course_bench
            payload = {"value": getattr(course_bench, measure)(folder)}
        except BaseException as error:                 # noqa: BLE001 (the student's code)
            payload = {"error": f"{type(error).__name__}: {error}"}
        os.write(write, json.dumps(payload).encode())
        os._exit(0)
    os.close(write)
    return _collect(pid, read)


def _collect(pid: int, read: int) -> float:
    chunks, deadline = [], time.monotonic() + RUN_TIMEOUT_S
    try:
        while True:
            ready, _, _ = select.select([read], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise RuntimeError(f"a run took over {RUN_TIMEOUT_S} s and was stopped")
            chunk = os.read(read, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return _value(b"".join(chunks).decode())


def _run_spawned(measure: str, folder: Path) -> float:
    """One run in a new interpreter: for workloads that run the model (a fork of a process
    whose torch already started its threads may hang)."""
    code = ("import json, sys; from pathlib import Path; from minicb.tools import course_bench; "
            f"print(json.dumps({{'value': course_bench.{measure}(Path(sys.argv[1]))}}))")
    run = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                         text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines()
        return _value(json.dumps({"error": lines[-1] if lines else f"exit {run.returncode}"}))
    return _value(run.stdout.strip().splitlines()[-1])


def _value(text: str) -> float:
    payload = json.loads(text or '{"error": "the run died without a word"}')
    if "error" in payload:
        raise RuntimeError(payload["error"])
    return float(payload["value"])


def measure_bar(bar: Bar, folder: Path, reference: Path = REFERENCE) -> BarResult:
    """The bar's ratio on this machine: pairs of fresh runs, the reference first in even pairs
    and second in odd ones (forward and reverse order), until a verdict or MAX_PAIRS."""
    run = _run_forked if bar.timed else _run_spawned
    if bar.timed:
        from minicb.tools.course_bench import preload
        preload()
    yours: list[float] = []
    theirs: list[float] = []
    pairs = FIRST_PAIRS if bar.timed else 1
    try:
        while True:
            while len(yours) < pairs:
                order = [(reference, theirs), (folder, yours)]
                for source, into in order if len(yours) % 2 == 0 else order[::-1]:
                    into.append(run(bar.measure, source))
            ratios = Repeats.of(t / y if bar.lower_is_better else y / t
                                for y, t in zip(yours, theirs))
            if not bar.timed:            # a count: exact, so a plain comparison decides
                found = ("full" if ratios.median >= bar.full else
                         "partial" if ratios.median >= bar.partial else "zero")
            else:
                found = verdict(ratios, bar.full, bar.partial)
            if found != "no verdict" or pairs >= MAX_PAIRS:
                break
            pairs += 1
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        return BarResult(bar, "not measured", yours=yours, reference=theirs,
                         reason=f"the run failed: {error}")
    points = {"full": bar.points, "partial": bar.points / 2}.get(found, 0.0)
    reason = ""
    if found == "no verdict":
        reason = (f"the ratios {ratios} straddle a bar ({bar.full:g} or {bar.partial:g}) in "
                  f"{len(ratios.values)} alternated pairs: re-grade on a quieter machine")
    return BarResult(bar, found, points, ratios, yours, theirs, reason)


def not_measured(milestone: Milestone, reason: str) -> list[BarResult]:
    return [BarResult(bar, "not measured", reason=reason) for bar in milestone.bars]

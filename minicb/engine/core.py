"""The engine core: the one step loop, schedule → execute → update, with a swappable executor.

Everything that steps a scheduler goes through `EngineCore`:

* `LLMEngine` (minicb/engine/llm_engine.py) with `ModelExecutor`: the model runs the plan, real
  tokens come back;
* `minicb.sim.simulate` with a `CostModelExecutor`: the plan's cost advances a virtual clock and
  every row that needs a token gets one (no model, no tensors);
* each instance of the cluster simulator (minicb.sim.cluster): a core with its own cost-model
  executor and clock, stepped by the cluster's event loop.

A step is two halves. `begin_step` plans the step and hands it to the executor, which returns a
handle at once; `end_step` waits on the handle and applies the results. `step()` is the two back
to back. The split is what lets the cluster simulator keep several instances' steps in flight at
once, and what overlapped scheduling needs: plan step n + 1 (`begin_step`) before collecting step
n (`end_step`), as vLLM's `step_with_batch_queue` does.

Overlapped scheduling (`EngineConfig.async_scheduling`): `OverlappedModelExecutor` runs each
step in a thread of its own and returns a Future at once; the core commits each plan as it is
launched (`OverlapScheduler.commit`, minicb.scheduler.overlap: tokens in flight become
placeholders), so `step()` plans and packs step n + 1 while step n runs, then collects step n. The
host learns step n's tokens one step late; the runner fills step n + 1's placeholders from step
n's sampled tensor, and stops are applied when the tokens arrive, which discards the token a
request computed past its stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from minicb.plan import ModelRunnerOutput, SamplerOutput, SchedulerOutput
from minicb.request import Request
from minicb.scheduler.base import Scheduler
from minicb.scheduler.overlap import OverlapScheduler

# one entry per row that needs logits, in any of these shapes: `end_step` reads each as a
# ModelRunnerOutput (ModelRunnerOutput.of), the one shape Scheduler.update takes
StepOutput = ModelRunnerOutput | SamplerOutput | Sequence[int]
log = logging.getLogger("minicb.engine.llm_engine")


class StepFuture(Protocol):
    """A launched step (concurrent.futures.Future has this shape): `result()` waits for it and
    returns one entry per row that needs a token (a StepOutput)."""

    def result(self) -> StepOutput: ...


class Executor(Protocol):
    """Runs a plan: the model, or a cost model. `execute` returns at once with a handle; the
    step's tokens come from the handle's `result()`."""

    def execute(self, plan: SchedulerOutput) -> StepFuture: ...


@dataclass
class Done:
    """The handle of a step that already ran (a synchronous executor)."""

    output: StepOutput

    def result(self) -> StepOutput:
        return self.output


class ModelExecutor:
    """The model as the core's executor: the runner packs the plan, runs the forward and samples,
    on this thread, before `execute` returns (a synchronous step)."""

    def __init__(self, runner, threads=None):
        """`runner`: a minicb.runner.model_runner.ModelRunner; `threads`: the CPU thread policy
        (minicb.runner.threads.ThreadPolicy), asked before each step how many threads to use."""
        self.runner = runner
        self.threads = threads

    def execute(self, plan: SchedulerOutput) -> Done:
        if self.threads is not None:
            self.threads.before_step()
        return Done(self.runner.execute(plan))


class OverlappedModelExecutor(ModelExecutor):
    """The model in a thread of its own (torch's operators and the C kernels release the GIL, so
    the host plans the next step meanwhile). `execute` packs the plan on the calling thread and
    queues the step; steps run one at a time, in order, each reading the one before's sampled
    tokens for its placeholders."""

    def __init__(self, runner, threads=None):
        super().__init__(runner, threads)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minicb-step")

    def execute(self, plan: SchedulerOutput) -> Future:
        return self.pool.submit(self._run, plan, self.runner.prepare(plan))

    def _run(self, plan: SchedulerOutput, packed: tuple):
        if self.threads is not None:     # a thread's torch thread count is its own: set it here
            self.threads.before_step()
        return self.runner.run(plan, packed, self.runner.sampled)


@dataclass
class InFlightStep:
    """A step between its two halves: the plan, and the executor's handle on it."""

    plan: SchedulerOutput
    future: StepFuture
    schedule_seconds: float = 0.0


@dataclass
class StepResult:
    """What one step did: its plan, the requests that got tokens or finished, the requests aborted
    before it was planned, and the host's time in schedule() and update() (0.0 when untimed)."""

    plan: SchedulerOutput | None
    touched: list[Request]
    aborted: list[Request]
    schedule_seconds: float = 0.0
    update_seconds: float = 0.0


class EngineCore:
    """One scheduler and one executor, stepped: the only caller of `Scheduler.schedule()`."""

    def __init__(self, scheduler: Scheduler, executor: Executor,
                 host_timer: Callable[[], float] | None = None, overlap: bool = False):
        """`host_timer`: a clock for the host's share of each step (time.thread_time: CPU time
        of this thread, which other processes do not inflate); None: not timed. `overlap`:
        plan step n + 1 while step n runs (an executor whose `execute` returns at once, such as
        OverlappedModelExecutor) and a scheduler that keeps overlap's books (make_scheduler's
        `overlap=True`); `step()` then returns step n's results."""
        if overlap and not isinstance(scheduler, OverlapScheduler):
            raise ValueError("overlapped steps need a scheduler with overlap's bookkeeping: build "
                             "it with minicb.scheduler.make_scheduler(..., overlap=True).")
        self.scheduler = scheduler
        self.executor = executor
        self.host_timer = host_timer
        self.overlap = overlap
        self._in_flight: InFlightStep | None = None    # overlap: the step launched, uncollected
        self._said_why_synchronous = False
        # request ids to abort, applied at the start of the next step (events, not a scan)
        self._aborts: list[str] = []

    def abort(self, request_ids: Iterable[str]) -> None:
        """Queue aborts: the next step removes those requests, frees their blocks and reports
        them in `StepResult.aborted` (an id no longer here is skipped)."""
        self._aborts.extend(request_ids)

    def has_unfinished(self) -> bool:
        """Work left: requests queued or running, aborts not yet applied, or a step in flight."""
        return self.scheduler.has_unfinished() or bool(self._aborts) or \
            self._in_flight is not None

    def _apply_aborts(self) -> list[Request]:
        if not self._aborts:                 # most steps
            return []
        ids, self._aborts = self._aborts, []
        return [request for request in map(self.scheduler.abort, ids) if request is not None]

    def begin_step(self) -> InFlightStep | None:
        """Plan the next step and launch it; None when there is nothing to run (no request, or
        none the scheduler can run now)."""
        if not self.scheduler.has_unfinished():
            return None
        timer = self.host_timer
        start = timer() if timer else 0.0
        plan = self.scheduler.schedule()
        schedule_seconds = timer() - start if timer else 0.0
        if plan.is_empty:
            return None
        if self._overlapping():
            self.scheduler.commit(plan)
        return InFlightStep(plan, self.executor.execute(plan), schedule_seconds)

    def end_step(self, step: InFlightStep) -> StepResult:
        """Wait for a launched step's tokens and apply them (Scheduler.update)."""
        output = ModelRunnerOutput.of(step.future.result())
        timer = self.host_timer
        start = timer() if timer else 0.0
        touched = self.scheduler.update(step.plan, output)
        update_seconds = timer() - start if timer else 0.0
        return StepResult(step.plan, touched, [], step.schedule_seconds, update_seconds)

    def step(self) -> StepResult:
        """Apply the queued aborts, then one step: schedule, execute, update. `plan` is None when
        no step ran. Overlapped: launch step n + 1, then collect step n (the first call collects
        nothing)."""
        aborted = self._apply_aborts()
        if self._overlapping():
            return self._step_overlapped(aborted)
        if self._in_flight is not None:    # back to synchronous steps: collect the last one first
            previous, self._in_flight = self._in_flight, None
            result = self.end_step(previous)
            result.aborted = aborted
            return result
        step = self.begin_step()
        if step is None:
            return StepResult(None, [], aborted)
        result = self.end_step(step)
        result.aborted = aborted
        return result

    def _overlapping(self) -> bool:
        """Whether this step overlaps: asked for, and no live request's logits processing reads
        its last token on the host (then steps are synchronous until it ends, said once)."""
        if not self.overlap:
            return False
        if self.scheduler.num_host_state_requests and not self._said_why_synchronous:
            self._said_why_synchronous = True
            log.warning("async_scheduling: running synchronous steps while a request with "
                        "penalties, min_tokens or structured output is live: its logits "
                        "processing reads each token it produced, which an overlapped step does "
                        "not know yet.")
        return not self.scheduler.num_host_state_requests

    def _step_overlapped(self, aborted: list[Request]) -> StepResult:
        launched = self.begin_step()          # planned and packed while the last step runs
        previous, self._in_flight = self._in_flight, launched
        if previous is None:
            return StepResult(None, [], aborted)
        try:
            result = self.end_step(previous)
        except BaseException:
            # the step failed: the one queued behind it read its tokens, so it goes too
            self._in_flight = None
            if launched is not None:
                _wait_quietly(launched.future)
            raise
        result.aborted = aborted
        return result


def _wait_quietly(future: StepFuture) -> None:
    try:
        future.result()
    except Exception:      # noqa: S110 (its own failure adds nothing to the one being raised)
        pass

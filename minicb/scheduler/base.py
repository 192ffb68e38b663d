"""What every scheduler shares: the queues, the step's plan, and the update after a step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from minicb.config import EngineConfig
from minicb.kv.base import KVManager
from minicb.request import Request, RequestStatus
from minicb.scheduler.queue import WaitingQueue


@dataclass
class ScheduledSeq:
    """One row of the packed batch: `num_tokens` real tokens of `request` this step."""

    request: Request
    num_tokens: int
    num_pad: int = 0          # left padding before the real tokens (static prefill)
    ghost: bool = False       # a finished request kept in a static batch: computed, then discarded
    needs_logits: bool = False
    is_prefill: bool = False  # prompt tokens (or a recompute after preemption), not one decode

    @classmethod
    def plan(cls, request: Request, num_tokens: int, num_pad: int = 0) -> ScheduledSeq:
        """A real row: it needs logits when this step leaves no token of the request uncomputed."""
        return cls(request, num_tokens, num_pad=num_pad,
                   needs_logits=request.num_computed_tokens + num_tokens == request.num_tokens,
                   is_prefill=request.is_prefilling)


@dataclass
class SchedulerOutput:
    step: int
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # (source, destination) blocks the runner copies before the forward: copy-on-write
    block_copies: list[tuple[int, int]] = field(default_factory=list)

    # every count of a step's rows and tokens is defined here, once
    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens + s.num_pad for s in self.seqs)

    @property
    def num_useful_rows(self) -> int:
        """Rows whose output is kept (not a static batch's finished ghost)."""
        return sum(not s.ghost for s in self.seqs)

    @property
    def num_decode_rows(self) -> int:
        return sum(not s.is_prefill for s in self.seqs)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs if s.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs if not s.is_prefill and not s.ghost)

    @property
    def num_pad_tokens(self) -> int:
        return sum(s.num_pad + (s.num_tokens if s.ghost else 0) for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


StopChecker = Callable[[Request], "RequestStatus | None"]


class Scheduler:
    """Queues plus bookkeeping. Subclasses implement `schedule()` (which rows run this step)."""

    def __init__(self, config: EngineConfig, kv: KVManager, stop_checker: StopChecker,
                 clock: Callable[[], float]):
        self.config = config
        self.kv = kv
        self.stop_checker = stop_checker
        self.clock = clock
        self.waiting = WaitingQueue()
        self.running: list[Request] = []
        self.step_count = 0
        self.num_preemptions = 0
        self.fork_parents: dict[str, Request] = {}   # parallel sample's id → its first sample

    # --- queue -----------------------------------------------------------------------------
    def add_request(self, request: Request, fork_of: Request | None = None) -> None:
        """Queue a request; `fork_of` makes it a parallel sample of that request (same prompt),
        admitted once the first sample's prompt is computed and sharing its blocks."""
        request.status = RequestStatus.WAITING
        if fork_of is not None:
            self.fork_parents[request.request_id] = fork_of
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or self.num_running > 0

    @property
    def num_running(self) -> int:
        """Running requests that have not finished (a static batch keeps its finished members'
        rows until the batch ends; they are not counted)."""
        return sum(not request.finished for request in self.running)

    def abort(self, request_id: str) -> Request | None:
        """Remove a request wherever it is and free its blocks; None if it is not here."""
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self.kv.free(request)
                    self._mark_finished(request, RequestStatus.FINISHED_ABORTED)
                    return request
        return None

    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError

    # --- after the model ran -----------------------------------------------------------------
    def update(self, output: SchedulerOutput, token_ids: list[int]) -> list[Request]:
        """Record this step's tokens. `token_ids` has one entry per row that needed logits.

        Returns the requests that got a token or finished this step.
        """
        now, step = self.clock(), output.step
        tokens = iter(token_ids)
        touched: list[Request] = []
        for seq in output.seqs:
            request = seq.request
            if seq.ghost:
                continue
            request.num_computed_tokens += seq.num_tokens
            self.kv.cache_full_blocks(request)
            if not seq.needs_logits:
                continue
            token = next(tokens)
            if token is None:        # this row could not be sampled (the engine set its error)
                self.finish(request, RequestStatus.FINISHED_ERROR)
                touched.append(request)
                continue
            request.output_token_ids.append(token)
            request.times.token_times.append(now)
            request.times.token_steps.append(step)
            if request.times.first_token is None:
                request.times.first_token, request.times.first_token_step = now, step
            touched.append(request)
            try:
                reason = self.stop_checker(request)
            except Exception as error:     # one request's stop check must not stop the others
                request.error = f"the stop check failed: {type(error).__name__}: {error}"
                reason = RequestStatus.FINISHED_ERROR
            if reason is not None:
                self.finish(request, reason)
        self.after_update(output)
        return touched

    def after_update(self, output: SchedulerOutput) -> None:
        """Hook for subclasses (the static scheduler ends its batch here)."""

    def finish(self, request: Request, status: RequestStatus) -> None:
        self.running.remove(request)
        self.kv.free(request)
        self._mark_finished(request, status)

    def _mark_finished(self, request: Request, status: RequestStatus) -> None:
        self.fork_parents.pop(request.request_id, None)
        request.status = status
        request.times.finished = self.clock()
        request.times.finished_step = self.step_count

    def _claim_computed_prefix(self, request: Request) -> bool:
        """Before admitting a waiting request (nothing computed), start it from KV already computed.

        A parallel sample shares its first sample's prompt blocks, all but the last prompt token,
        which it computes itself to draw its own first token. Any other request claims the
        cached blocks of its longest cached prefix. Returns False while the first sample is still
        prefilling: admitting the sample now would compute the prompt twice.
        """
        parent = self.fork_parents.get(request.request_id)
        if parent is not None and parent.status is RequestStatus.RUNNING:
            if parent.num_computed_tokens < parent.num_prompt_tokens:
                return False
            request.num_computed_tokens = self.kv.fork(parent, request,
                                                       request.num_prompt_tokens - 1)
        else:
            request.num_computed_tokens = self.kv.claim_cached_prefix(request)
        return True

    def _start_running(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self.fork_parents.pop(request.request_id, None)
        if request.times.first_scheduled is None:
            request.num_cached_tokens = request.num_computed_tokens   # read by RequestMetrics
            request.times.first_scheduled = self.clock()
            request.times.first_scheduled_step = self.step_count

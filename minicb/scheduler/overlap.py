"""Overlapped scheduling's bookkeeping: plan step n + 1 while step n runs.

`OverlapScheduler` is mixed into a scheduler class when the engine overlaps steps
(EngineConfig.async_scheduling; `overlapped(ContinuousScheduler)` and the like, built by
minicb.scheduler.make_scheduler), as vLLM keeps its AsyncScheduler apart from its Scheduler. The
base class plans and updates as if steps never overlapped; this class adds what overlapping
needs, and nothing else changes:

* the commit at launch (`commit`): a plan's tokens count as computed when it is launched, and
  each row that samples leaves its request a placeholder for its token, which the next plan
  feeds (the runner fills it on the device from the step before's sampled tokens);
* a decode row feeds its request's newest placeholder (`decode_row`), and a request whose token
  in flight is its last gets no further row (`fully_planned`);
* the tokens reach the host one step late (`update` on a committed plan): each replaces its
  request's oldest placeholder and meets the stop rule then (`_resolve_placeholder`), so a stop
  discards the token the request computed past it (`_mark_finished` drops its placeholders);
* a request preempted while its last step was in flight may end from the waiting queue.

While a request whose logits processing reads each of its tokens on the host is live, the engine
core runs synchronous steps (minicb.engine.core): their plans are not committed, and `update`
applies them as the base class does.
"""

from __future__ import annotations

from functools import cache

from minicb.plan import Logprob, ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from minicb.request import Request, RequestStatus
from minicb.scheduler.base import Scheduler


class OverlapScheduler(Scheduler):
    """The overlap bookkeeping, mixed in before a scheduler class (see `overlapped`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # ids of running requests whose token in flight is their last: each ends when that
        # token arrives, whatever it is, so no step is planned for it meanwhile
        self.last_token_in_flight: set[str] = set()

    def commit(self, output: SchedulerOutput) -> None:
        """Apply a plan as it is launched, before its tokens exist, so the next step can be
        planned while this one runs (vLLM's _update_after_schedule): every row's tokens count as
        computed, and each row that samples gets a placeholder for its token, which the next
        step feeds and `update` later replaces with the real token. Stops wait for the token:
        they are applied one step late, in `update`."""
        output.committed = True
        row = 0                          # the row of the step's sampled tokens
        for seq in output.seqs:
            if seq.ghost:
                continue
            request = seq.request
            request.num_computed_tokens = seq.start + seq.num_tokens
            if seq.needs_logits:
                request.placeholders.append(-1 - row)
                row += 1
                if self.awaits_last_token(request):
                    self.last_token_in_flight.add(request.request_id)
            else:
                self.kv.cache_full_blocks(request)       # a prompt chunk: its tokens are known

    def awaits_last_token(self, request: Request) -> bool:
        """A request whose token in flight is its last (max_tokens or max_model_len): it ends
        when that token arrives, whatever it is."""
        return bool(request.placeholders) and \
            request.num_tokens >= request.max_total_tokens(self.config.max_model_len)

    def fully_planned(self) -> set[str]:
        return set(self.last_token_in_flight)

    def decode_row(self, request: Request, block_table: list[int]) -> ScheduledSeq:
        """A decode row whose token may still be in flight: then it feeds the newest
        placeholder, which the runner fills from the step before's sampled tokens."""
        seq = super().decode_row(request, block_table)
        if request.placeholders:
            seq.token_ids = request.placeholders[-1:]
        return seq

    def update(self, output: SchedulerOutput, sampled: ModelRunnerOutput) -> list[Request]:
        """A committed plan's tokens, arriving a step late: each row that sampled resolves its
        request's oldest placeholder (its prompt chunks were counted at launch); a request that
        ended after the step was launched discards its row's token. A plan not committed (a
        synchronous step) is the base class's."""
        if not output.committed:
            return super().update(output, sampled)
        now, step = self.clock(), output.step
        if sampled.prompt_logprobs:
            self._record_prompt_logprobs(output, sampled)
        touched: list[Request] = []
        rows = [seq for seq in output.seqs if seq.needs_logits]
        for seq, tokens, logprobs, error in zip(rows, sampled.sampled_token_ids, sampled.logprobs,
                                                sampled.errors):
            request = seq.request
            if request.finished:
                continue        # it ended after this step was launched: the token is discarded
            touched.append(request)
            if tokens is None:
                self._fail(request, error)
            else:
                self._resolve_placeholder(request, tokens[0],
                                          None if logprobs is None else logprobs[0], now, step)
        self.after_update(output)
        return touched

    def _resolve_placeholder(self, request: Request, token: int, logprob: Logprob | None,
                             now: float, step: int) -> None:
        """A committed step's token arrives: it replaces the request's oldest placeholder, and
        the stop rule runs on it now, one step late (what ends the request also discards the
        token computed past it: `_mark_finished` drops the placeholders left)."""
        request.placeholders.pop(0)
        reason = self._append_token(request, token, logprob, now, step)
        # a running request offers its full blocks of known tokens to the prefix cache
        if reason is not RequestStatus.FINISHED_ERROR and request.status is RequestStatus.RUNNING:
            self.kv.cache_full_blocks(request, min(request.num_computed_tokens,
                                                   request.num_tokens - len(request.placeholders)))
        if reason is not None:
            self.finish(request, reason)

    def finish(self, request: Request, status: RequestStatus) -> None:
        if request.status is RequestStatus.WAITING:   # preempted while its last step was in flight
            self.waiting.remove(request)
            self.kv.free(request)
            self._mark_finished(request, status)
        else:
            super().finish(request, status)

    def _mark_finished(self, request: Request, status: RequestStatus) -> None:
        if request.placeholders:   # tokens in flight past its end: never reported
            request.num_computed_tokens = max(
                request.num_computed_tokens - len(request.placeholders), 0)
            request.placeholders.clear()
        self.last_token_in_flight.discard(request.request_id)
        super()._mark_finished(request, status)


@cache
def overlapped(scheduler_class: type[Scheduler]) -> type[Scheduler]:
    """`scheduler_class` with the overlap bookkeeping mixed in (one class per scheduler class,
    made once: OverlapScheduler's methods come first, then the scheduler's own)."""
    if issubclass(scheduler_class, OverlapScheduler):
        return scheduler_class
    return type(f"Overlapped{scheduler_class.__name__}", (OverlapScheduler, scheduler_class),
                {"__doc__": f"{scheduler_class.__name__} with overlapped scheduling's bookkeeping "
                            "(minicb.scheduler.overlap)."})

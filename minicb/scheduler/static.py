"""Static batching (and naive serving, its batch-of-one special case).

A batch of up to max_num_seqs waiting requests is formed, prefilled together with left padding,
and decoded together until its LONGEST member finishes. A member that finishes early keeps its
row (a "ghost": computed every step, output thrown away) and its KV reservation until the batch
ends; waiting requests cannot enter. That idle capacity is what continuous batching reclaims.
"""

from __future__ import annotations

from minicb.plan import SchedulerOutput
from minicb.request import RequestStatus
from minicb.scheduler.base import Scheduler


class StaticScheduler(Scheduler):
    def batch_capacity(self) -> int:
        return self.config.max_num_seqs

    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        output = SchedulerOutput(step=self.step_count)
        if not self.running:
            self._form_batch(output)
            return output
        planned = self.fully_planned()
        for request in self.running:      # a member with nothing left to compute: a ghost
            ghost = request.finished or request.request_id in planned
            output.seqs.append(self.row(request, 1, ghost=ghost))
        return output

    def _form_batch(self, output: SchedulerOutput) -> None:
        """Admit waiting requests in arrival order while slots, token budget and KV allow.

        Each member reserves KV for its whole possible length now, so a static batch never has
        to preempt. The first member is always admitted (the engine rejected anything that
        could never fit), even when its prompt alone exceeds the token budget.
        """
        batch = []
        longest_prompt = 0
        for request in self.waiting:
            if len(batch) == self.batch_capacity():
                break
            longest = max(longest_prompt, request.num_tokens)
            padded_tokens = longest * (len(batch) + 1)
            total = request.max_total_tokens(self.config.max_model_len)
            if batch and padded_tokens > self.config.max_num_batched_tokens:
                break
            if not self.kv.can_allocate(request, total):
                break
            self.kv.allocate(request, total)
            batch.append(request)
            longest_prompt = longest
        for request in batch:
            self.waiting.remove(request)
            self.running.append(request)
            self._start_running(request)
            output.seqs.append(self.row(request, request.num_tokens,
                                        num_pad=longest_prompt - request.num_tokens))

    def finish(self, request, status: RequestStatus) -> None:
        # the row and its KV stay with the batch until its last member finishes
        self._mark_finished(request, status)
        self._end_batch_if_done()

    def after_update(self, output: SchedulerOutput) -> None:
        self._end_batch_if_done()

    def _end_batch_if_done(self) -> None:
        if self.running and all(r.finished for r in self.running):
            for request in self.running:
                self.kv.free(request)
            self.running.clear()

    def abort(self, request_id: str):
        for request in self.running:
            if request.request_id == request_id and not request.finished:
                self.finish(request, RequestStatus.FINISHED_ABORTED)
                return request
        return super().abort(request_id)


class NaiveScheduler(StaticScheduler):
    """One request at a time, from prefill to its last token: a static batch of one."""

    def batch_capacity(self) -> int:
        return 1

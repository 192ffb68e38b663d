"""Continuous batching: iteration-level scheduling (Orca), with chunked prefill and preemption.

Every step: requests that finished last step are already gone (their blocks freed), running
requests get their next token (or their next prefill chunk), waiting requests are admitted while
slots (max_num_seqs), the token budget (max_num_batched_tokens) and free KV allow, and all of it
runs as ONE packed batch with no padding. When the paged cache runs out, a running request is
preempted: its blocks are freed and it is recomputed later, its final output unchanged.

Policies (which waiting request goes first, which running request is the victim) and the step's
composition (decode-first or prefill-first, a cap on prefill tokens per step, a free-block
watermark) are knobs of EngineConfig.
"""

from __future__ import annotations

from minicb.request import Request, RequestStatus
from minicb.scheduler.base import ScheduledSeq, Scheduler, SchedulerOutput


class ContinuousScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        output = SchedulerOutput(step=self.step_count)
        config = self.config
        self._token_budget = config.max_num_batched_tokens
        self._prefill_budget = config.max_prefill_tokens_per_step or config.max_num_batched_tokens
        self._scheduled: set[str] = set()
        if config.step_order == "decode_first":
            self._schedule_running(output)
            self._admit_waiting(output)
        else:
            self._admit_waiting(output)
            self._schedule_running(output)
        return output

    # --- budget ----------------------------------------------------------------------------
    def _tokens_for(self, request: Request) -> int:
        """How many of the request's uncomputed tokens fit this step's budgets."""
        wanted = request.num_uncomputed_tokens
        if not request.is_prefilling:
            return min(wanted, self._token_budget)          # a decode: one token
        return min(wanted, self._token_budget, self._prefill_budget)

    def _take(self, output: SchedulerOutput, request: Request, num_tokens: int) -> None:
        seq = ScheduledSeq.plan(request, num_tokens)
        self.kv.allocate(request, request.num_computed_tokens + num_tokens)
        output.seqs.append(seq)
        self._scheduled.add(request.request_id)
        self._token_budget -= num_tokens
        if seq.is_prefill:
            self._prefill_budget -= num_tokens

    # --- running requests --------------------------------------------------------------------
    def _schedule_running(self, output: SchedulerOutput) -> None:
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING or request.request_id in self._scheduled:
                continue
            num_tokens = self._tokens_for(request)
            if num_tokens == 0:
                continue
            needed = request.num_computed_tokens + num_tokens
            while not self.kv.can_allocate(request, needed):
                victim = self._pick_victim()
                self._preempt(victim, output)
                if victim is request:
                    break
            if request.status is RequestStatus.RUNNING:
                self._take(output, request, num_tokens)

    def _pick_victim(self) -> Request:
        """Among running requests not yet in this step: the latest arrival (FCFS), or the lowest
        priority, latest arrival first (priority)."""
        candidates = [r for r in self.running if r.request_id not in self._scheduled]
        if self.config.policy == "priority":
            return max(candidates, key=lambda r: (r.priority, r.times.arrival, r.arrival_index))
        return candidates[-1]

    def _preempt(self, request: Request, output: SchedulerOutput) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0      # recompute prompt + output so far when readmitted
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, request)
        output.preempted.append(request)

    # --- waiting requests --------------------------------------------------------------------
    def _admit_waiting(self, output: SchedulerOutput) -> None:
        if output.preempted:
            return  # memory is short: admitting now would only preempt again next step
        while self.waiting and len(self.running) < self.config.max_num_seqs and self._token_budget > 0:
            request = self._next_waiting()
            num_tokens = self._tokens_for(request)
            if num_tokens == 0 or not self.kv.can_allocate(
                    request, num_tokens, reserve_blocks=self.config.watermark_blocks):
                break   # head-of-line: keep the policy's order rather than skipping ahead
            self.waiting.remove(request)
            self.running.append(request)
            self._start_running(request)
            self._take(output, request, num_tokens)

    def _next_waiting(self) -> Request:
        """The policy's choice. Requests that waited longer than max_wait_steps go first
        (oldest first), so no policy can starve anyone for longer than that."""
        config = self.config
        if config.max_wait_steps is not None:
            overdue = [r for r in self.waiting
                       if self.step_count - r.times.arrival_step > config.max_wait_steps]
            if overdue:
                return min(overdue, key=lambda r: r.arrival_index)
        if config.policy == "priority":
            return min(self.waiting, key=lambda r: (r.priority, r.arrival_index))
        if config.policy == "shortest_prompt_first":
            return min(self.waiting, key=lambda r: (r.num_tokens, r.arrival_index))
        return self.waiting[0]

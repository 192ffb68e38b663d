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

import heapq

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
        output.block_copies.extend(self.kv.pop_block_copies())
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
        """Among running requests not yet in this step: the latest arrival (it has the least
        progress to lose), or under the priority policy the lowest priority first. Overdue
        requests (see the ageing note above `_admission_key`) go last, so ageing also protects
        them from eviction."""
        candidates = [r for r in self.running if r.request_id not in self._scheduled]

        def eviction_order(request: Request) -> tuple[int, ...]:
            overdue = self._admission_key(request)[0] == 0
            priority = request.priority if self.config.policy == "priority" and not overdue else 0
            return (not overdue, priority, request.arrival_index)

        return max(candidates, key=eviction_order)

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
        if not self.waiting or len(self.running) >= self.config.max_num_seqs or self._token_budget <= 0:
            return  # no room this step: do not even look at the queue
        # The first pick scans the queue, as most steps admit at most one request. A second pick
        # orders the rest once as a heap (the policy's order cannot change within a step), so a
        # step that admits k of W waiting requests costs O(W + k log W), not O(k W). The queue
        # position breaks ties, as the scan does.
        admitted: list[Request] = []
        heap = None
        while len(admitted) < len(self.waiting) and len(self.running) < self.config.max_num_seqs \
                and self._token_budget > 0:
            if not admitted:
                request = min(self.waiting, key=self._admission_key)
            else:
                if heap is None:
                    heap = [(self._admission_key(r), i, r) for i, r in enumerate(self.waiting) if r is not admitted[0]]
                    heapq.heapify(heap)
                request = heapq.heappop(heap)[2]
            if not self._claim_computed_prefix(request):
                break   # a parallel sample waits one step for its prompt, then shares it
            num_tokens = self._tokens_for(request)
            if num_tokens == 0 or not self.kv.can_allocate(
                    request, request.num_computed_tokens + num_tokens,
                    reserve_blocks=self.config.watermark_blocks):
                self.kv.free(request)               # give back the blocks it claimed
                request.num_computed_tokens = 0
                break   # head-of-line: keep the policy's order rather than skipping ahead
            admitted.append(request)
            self.running.append(request)
            self._start_running(request)
            self._take(output, request, num_tokens)
        if len(admitted) == 1:
            self.waiting.remove(admitted[0])
        elif admitted:
            ids = {request.request_id for request in admitted}
            self.waiting = [request for request in self.waiting if request.request_id not in ids]

    # Ageing (max_wait_steps = W) promises, under every policy: from the step in which a request is
    # overdue (arrived more than W steps ago, so from step arrival_step + W + 1 on) until it is
    # admitted, no request that arrived after it is admitted. Overdue requests go first, oldest
    # first, and admission stops at the first request that does not fit (head-of-line), so everyone
    # younger queues behind. Its wait past W + 1 steps is then only the time the requests already
    # running, and the overdue ones older than it, take to free a slot, the step's budgets and KV
    # room for its first chunk.
    def _admission_key(self, request: Request) -> tuple[int, ...]:
        """The policy's order, smallest first; ties go to the earlier arrival."""
        config = self.config
        if config.max_wait_steps is not None and \
                self.step_count - request.times.arrival_step > config.max_wait_steps:
            return (0, request.arrival_index)               # overdue: age beats any policy
        if config.policy == "priority":
            return (1, request.priority, request.arrival_index)
        if config.policy == "shortest_prompt_first":
            return (1, request.num_tokens, request.arrival_index)   # a recompute counts its output
        return (1, request.arrival_index)

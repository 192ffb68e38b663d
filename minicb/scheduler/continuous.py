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

from dataclasses import dataclass, field

from minicb.plan import ScheduledSeq, SchedulerOutput
from minicb.request import Request, RequestStatus
from minicb.scheduler.base import Scheduler
from minicb.spec.ngram import propose_ngram


@dataclass
class StepBudget:
    """What is left of one step while it is planned: tokens, prompt tokens, and who is in it."""

    tokens: int
    prefill_tokens: int
    scheduled: set[str] = field(default_factory=set)

    def tokens_for(self, request: Request, prefilling: bool | None = None) -> int:
        """How many of the request's uncomputed tokens fit what is left (`prefilling`: the
        request's is_prefilling, when the caller has it at hand)."""
        wanted = request.num_uncomputed_tokens
        if prefilling is None:
            prefilling = request.is_prefilling
        if not prefilling:
            return min(wanted, self.tokens)          # a decode: one token
        return min(wanted, self.tokens, self.prefill_tokens)

    def charge(self, request: Request, num_tokens: int, prompt_tokens: bool) -> None:
        """Spend `num_tokens` of the budget (and of the prompt tokens' cap when they are a
        prompt's, or a recompute's, as tokens_for counted them)."""
        self.scheduled.add(request.request_id)
        self.tokens -= num_tokens
        if prompt_tokens:
            self.prefill_tokens -= num_tokens


class ContinuousScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        output = SchedulerOutput(step=self.step_count)
        config = self.config
        budget = StepBudget(config.max_num_batched_tokens,
                            config.max_prefill_tokens_per_step or config.max_num_batched_tokens,
                            self.fully_planned())
        if config.step_order == "decode_first":
            self._schedule_running(output, budget)
            self._admit_waiting(output, budget)
        else:
            self._admit_waiting(output, budget)
            self._schedule_running(output, budget)
        return output

    def _take(self, output: SchedulerOutput, request: Request, num_tokens: int,
              budget: StepBudget, prompt_tokens: bool) -> None:
        """Plan `num_tokens` of the request's tokens; `prompt_tokens`: whether they are a
        prompt's (or a recompute's), which the prefill cap counts."""
        self.kv.allocate(request, request.num_computed_tokens + num_tokens)
        copies = self.kv.pop_block_copies()
        if copies:
            output.block_copies.extend(copies)
        # its table, after allocation (a request past its prompt: one token, a decode row)
        output.seqs.append(self.row(request, num_tokens) if prompt_tokens else
                           self.decode_row(request, self.kv.block_table(request)))
        budget.charge(request, num_tokens, prompt_tokens)

    # --- running requests --------------------------------------------------------------------
    def _schedule_running(self, output: SchedulerOutput, budget: StepBudget) -> None:
        """Every running request not yet in the step, in order, gets its tokens: a decode its
        one, a prompt (or a recompute) its next chunk, a decode with a proposal its verification
        row. When the KV cache has no room for them, running requests are preempted until it
        has. The steady decodes at the head of the queue take a fast path first
        (`_schedule_steady_decodes`, which plans for each what this loop would)."""
        scheduled, running = budget.scheduled, RequestStatus.RUNNING
        speculative = self.config.speculative_method is not None
        # (what a proposal may spend depends on how many requests still wait for their token)
        pending = sum(r.status is running and r.request_id not in scheduled
                      for r in self.running) if speculative else 0
        # the fast path first, except under speculation (any decode may verify a proposal)
        rest = (list(self.running) if speculative
                else self._schedule_steady_decodes(output, budget))
        for request in rest:
            if request.status is not running or request.request_id in scheduled:
                continue
            pending -= 1
            prefilling = request.is_prefilling
            if speculative and not prefilling:
                proposal = self._propose(request, budget.tokens - 1 - pending)
                if proposal:
                    self._take_verification(output, request, proposal, budget)
                    continue
            num_tokens = budget.tokens_for(request, prefilling)
            if num_tokens == 0:
                continue
            needed = request.num_computed_tokens + num_tokens
            while not self.kv.can_allocate(request, needed):
                victim = self._pick_victim(budget)
                self._preempt(victim, output)
                if victim is request:
                    break
            if request.status is running:
                self._take(output, request, num_tokens, budget, prefilling)

    def _schedule_steady_decodes(self, output: SchedulerOutput,
                                 budget: StepBudget) -> list[Request]:
        """The fast path of `_schedule_running`, for its commonest rows: decodes the KV cache has
        room for without preempting anyone. It plans the running requests in order while each
        is one, just as the general loop would (a decode whose last block has room at once:
        nothing to allocate, copy or evict, so the budget and the KV manager are not asked four
        more times), and returns the requests from the first that is not one (a prompt chunk,
        a decode that needs a victim, a spent budget) on, for the general loop."""
        running = self.running
        scheduled, seqs, decode_row = budget.scheduled, output.seqs, self.decode_row
        table_with_room, can_allocate = self.kv.table_with_room, self.kv.can_allocate
        for index, request in enumerate(running):
            if request.request_id in scheduled:
                continue
            if not budget.tokens or request.is_prefilling:
                return running[index:]
            needed = request.num_computed_tokens + 1
            table = table_with_room(request, needed)
            if table is not None:
                seqs.append(decode_row(request, table))
                scheduled.add(request.request_id)
                budget.tokens -= 1
            elif can_allocate(request, needed):       # a new block (or a copy), no victim
                self._take(output, request, 1, budget, False)
            else:
                return running[index:]
        return []

    # --- speculative decoding ------------------------------------------------------------------
    # How many tokens a running decode may propose (k; a draft model's are drafted later, in the
    # runner, into k placeholders), lowered to zero as the batch grows:
    # - off while more requests run than speculative_disable_by_batch_size;
    # - at most what the step's token budget leaves once every running request not yet planned
    #   has its one token (so speculation never pushes a decode out of the step);
    # - at most the request's remaining length (max_tokens, max_model_len) less the target's own;
    # - at most what the KV pool holds without preempting anyone: speculation never evicts;
    # - none for a request with stop strings: they are found in the text after the step, and
    #   the tokens a step accepted past a stop string could not be taken back from its output;
    # - none for a request with penalties, min_tokens, logit_bias, min_p or a grammar: each
    #   verified position's distribution would need them applied over the proposals before it.
    def _propose(self, request: Request, spare_tokens: int) -> list[int]:
        config = self.config
        off = config.speculative_disable_by_batch_size
        if ((off is not None and self.num_running > off) or request.params.stop
                or request.params.needs_logits_processing):
            return []
        k = min(config.num_speculative_tokens, spare_tokens,
                request.max_total_tokens(config.max_model_len) - request.num_tokens - 1)
        if k <= 0:
            return []
        proposal = [0] * k if config.speculative_method == "draft_model" else propose_ngram(
            request.all_token_ids, k, config.prompt_lookup_min, config.prompt_lookup_max)
        while proposal and not self.kv.can_allocate(
                request, request.num_computed_tokens + 1 + len(proposal)):
            proposal.pop()
        return proposal

    def _take_verification(self, output: SchedulerOutput, request: Request,
                           proposal: list[int], budget: StepBudget) -> None:
        """A running request's verification row: its last token and the proposals, all k + 1
        positions with KV slots and logits. Not a decode (it carries k + 1 queries): it runs as
        a short chunk of the packed batch, the path chunked prefill takes."""
        num_tokens = 1 + len(proposal)
        start = request.num_computed_tokens
        self.kv.allocate(request, start + num_tokens)
        output.block_copies.extend(self.kv.pop_block_copies())
        output.seqs.append(ScheduledSeq(
            request, num_tokens, start, request.token_ids(start, start + 1) + proposal,
            self.kv.block_table(request), request.params, request.generator,
            needs_logits=True, is_decode=False, proposal=proposal, req_id=request.request_id))
        budget.charge(request, num_tokens, False)

    def _pick_victim(self, budget: StepBudget) -> Request:
        """Among running requests not yet in this step: the latest arrival, or under the priority
        policy the lowest priority first. A heuristic: the latest arrival has usually computed the
        fewest tokens, so recomputing it later costs least, though a late request with a long
        prompt may have more to lose. Overdue requests (see the ageing note above
        `_admission_key`) go last, so ageing also protects them from eviction."""
        candidates = [r for r in self.running if r.request_id not in budget.scheduled]

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
    def _admit_waiting(self, output: SchedulerOutput, budget: StepBudget) -> None:
        if output.preempted:
            return  # memory is short: admitting now would only preempt again next step
        if not self.waiting or len(self.running) >= self.config.max_num_seqs or budget.tokens <= 0:
            return  # no room this step: do not even look at the queue
        admitted: list[Request] = []
        for request in self.waiting.in_order(self._admission_key):
            if len(self.running) >= self.config.max_num_seqs or budget.tokens <= 0:
                break
            if not self._claim_computed_prefix(request):
                break   # a parallel sample waits one step for its prompt, then shares it
            prefilling = request.is_prefilling
            num_tokens = budget.tokens_for(request, prefilling)
            if num_tokens == 0 or not self.kv.can_allocate(
                    request, request.num_computed_tokens + num_tokens,
                    reserve_blocks=self.config.watermark_blocks):
                self.kv.free(request)               # give back the blocks it claimed
                request.num_computed_tokens = 0
                break   # head-of-line: keep the policy's order rather than skipping ahead
            admitted.append(request)
            self.running.append(request)
            self._start_running(request)
            self._take(output, request, num_tokens, budget, prefilling)
        self.waiting.remove_all(admitted)
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

"""What every scheduler shares: the queues, the step's plan, and the one update after a step."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from minicb.config import EngineConfig
from minicb.kv.base import KVManager
from minicb.plan import Logprob, ModelRunnerOutput, SamplerOutput, ScheduledSeq, SchedulerOutput
from minicb.request import Request, RequestStatus
from minicb.scheduler.queue import WaitingQueue


class Scheduler:
    """Queues plus bookkeeping. Subclasses implement `schedule()` (which rows run this step)."""

    def __init__(self, config: EngineConfig, kv: KVManager, clock: Callable[[], float],
                 eos_token_ids: Iterable[int] = ()):
        self.config = config
        self.kv = kv
        self.clock = clock
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting = WaitingQueue()
        self.running: list[Request] = []
        self.step_count = 0
        self.num_preemptions = 0
        self.fork_parents: dict[str, Request] = {}   # parallel sample's id → its first sample
        # live requests whose logits processing reads state the host updates from each token
        # (penalties, min_tokens, a grammar): a step for them cannot be planned before the last
        # one's tokens are known, so overlapped scheduling runs synchronous steps meanwhile
        self.num_host_state_requests = 0
        # every request finished (by a stop, an error or an abort) since take_finished() last
        # ran: the engine reports those that got no token from them, without a scan of everyone
        self.finished_requests: list[Request] = []

    def check_fits(self, num_prompt_tokens: int, max_tokens: int,
                   require_fit: bool = False) -> None:
        """The one admission rule on lengths, for the engine, the async engine and the simulator:
        the prompt leaves room for output under max_model_len, and the request at its longest
        (Request.max_total_tokens) fits the whole KV pool. `require_fit=True` refuses a request
        whose prompt + max_tokens exceeds max_model_len instead of cutting it short there."""
        limit = self.config.max_model_len
        if num_prompt_tokens >= limit:
            raise ValueError(f"the prompt has {num_prompt_tokens} tokens but max_model_len is "
                             f"{limit}, leaving no room for output; shorten the prompt to under "
                             f"{limit} tokens or raise max_model_len.")
        if require_fit and num_prompt_tokens + max_tokens > limit:
            raise ValueError(f"max_tokens={max_tokens} plus the prompt's {num_prompt_tokens} "
                             f"tokens exceeds max_model_len={limit}; ask for at most "
                             f"{limit - num_prompt_tokens} tokens or shorten the prompt.")
        total = min(num_prompt_tokens + max_tokens, limit)
        if not self.kv.can_ever_fit(total):
            raise ValueError(f"this request may reach {total} tokens but the whole KV pool holds "
                             f"{self.kv.num_blocks * self.kv.block_size}; raise num_kv_blocks or "
                             "lower max_tokens.")

    # --- queue -----------------------------------------------------------------------------
    def add_request(self, request: Request, fork_of: Request | None = None) -> None:
        """Queue a request; `fork_of` makes it a parallel sample of that request (same prompt),
        admitted once the first sample's prompt is computed and sharing its blocks."""
        request.status = RequestStatus.WAITING
        if fork_of is not None:
            self.fork_parents[request.request_id] = fork_of
        if request.logits_state is not None:
            self.num_host_state_requests += 1
        self.waiting.append(request)

    def has_unfinished(self) -> bool:   # asked before every step: stops at the first found
        return bool(self.waiting) or any(not request.finished for request in self.running)

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

    def row(self, request: Request, num_tokens: int, num_pad: int = 0,
            ghost: bool = False) -> ScheduledSeq:
        """Plan a row: `num_tokens` of the request's uncomputed tokens (after `num_pad` padding),
        or for a ghost its last token again. Call it after the KV manager allocated the row's
        blocks: the row carries the request's block table (a snapshot: KVManager.block_table)."""
        start = request.num_computed_tokens
        if ghost:
            tokens = request.token_ids(request.num_tokens - 1, request.num_tokens)
        else:
            tokens = request.token_ids(start, start + num_tokens)
        # position p's logits give prompt token p + 1's logprob, for p up to the prompt's last
        # but one (the last prompt position's logits give the first output token)
        targets = [] if ghost or request.prompt_logprobs is None else request.prompt_token_ids[
            start + 1:min(start + num_tokens, request.num_prompt_tokens - 1) + 1]
        return ScheduledSeq(request, num_tokens, start, tokens, self.kv.block_table(request),
                            request.params, request.generator, num_pad=num_pad, ghost=ghost,
                            needs_logits=not ghost and start + num_tokens == request.num_tokens,
                            is_decode=num_pad + len(tokens) == 1, prompt_targets=targets,
                            logits_state=request.logits_state, req_id=request.request_id)

    def decode_row(self, request: Request, block_table: list[int]) -> ScheduledSeq:
        """`row(request, 1)` for a running request past its prompt, the step's commonest row:
        its one uncomputed token is its newest (a placeholder while that token is in flight),
        it samples, and it has no prompt position left to score. Written out, as vLLM plans its
        "cached requests" apart from new ones: a decode step plans one of these per row, so
        what it leaves out (slicing the request's tokens, its prompt targets) is saved on every
        row of every step. (Every field is passed by position, the empty lists included: a
        dataclass takes keywords and fills defaults from factories at about twice the cost.)"""
        return ScheduledSeq(request, 1, request.num_computed_tokens,
                            (request.placeholders or request.output_token_ids)[-1:],
                            block_table, request.params, request.generator,
                            0, False, True, True, [], None, [], request.logits_state,
                            request.request_id)

    # --- overlapped scheduling ------------------------------------------------------------------
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
            else:
                self.kv.cache_full_blocks(request)       # a prompt chunk: its tokens are known

    def awaits_last_token(self, request: Request) -> bool:
        """A request whose token in flight is its last (max_tokens or max_model_len): it ends
        when that token arrives, whatever it is, so no step is planned for it."""
        return bool(request.placeholders) and \
            request.num_tokens >= request.max_total_tokens(self.config.max_model_len)

    # --- after the model ran -----------------------------------------------------------------
    def update(self, output: SchedulerOutput,
               sampled: ModelRunnerOutput | SamplerOutput | Sequence[int | None]
               ) -> list[Request]:
        """Apply one step's results, the only place they are applied: every row's computed
        tokens, and for each row that needed logits its tokens (one for a decode or a prompt's
        last chunk, 1 to k + 1 for a verification row), logprobs or error, through the stop
        checks (EOS, stop token ids, max_tokens, max_model_len). `sampled` has one entry per row
        that needed logits (minicb.plan.ModelRunnerOutput; a sampler's one-token answer or a
        plain list of token ids reads as one token per row). Stop strings need the text: the
        engine checks them afterwards (minicb.engine.detokenizer).

        Returns the requests that got a token or finished this step.
        """
        sampled = ModelRunnerOutput.of(sampled)
        now, step = self.clock(), output.step
        results = iter(zip(sampled.sampled_token_ids, sampled.logprobs, sampled.errors))
        touched: list[Request] = []
        committed, prompt_logprobs = output.committed, sampled.prompt_logprobs
        cache_full_blocks, check_stop = self.kv.cache_full_blocks, self.check_stop
        eos, max_model_len = self.eos_token_ids, self.config.max_model_len
        for index, seq in enumerate(output.seqs):
            if seq.ghost:
                continue
            request = seq.request
            if prompt_logprobs is not None and index in prompt_logprobs:
                _record_prompt_logprobs(request, seq.start, prompt_logprobs[index])
            if not seq.needs_logits:          # a prompt chunk before the last: KV only
                if not committed:             # (a committed plan counted it when launched)
                    request.num_computed_tokens += seq.num_tokens
                    cache_full_blocks(request)
                continue
            tokens, logprobs, error = next(results)
            if committed and request.finished:
                continue        # it ended after this step was launched: the token is discarded
            touched.append(request)
            if tokens is None:        # this row could not be sampled
                request.error = error or "the row could not be sampled"
                self.finish(request, RequestStatus.FINISHED_ERROR)
            elif committed:
                self._resolve_placeholder(request, tokens[0], logprobs, now, step)
            elif seq.proposal or logprobs is not None or request.logits_state is not None:
                self._append_tokens(seq, tokens, logprobs, now, step)
            else:
                # the commonest row (a decode, or a prompt's last chunk): one token, no logprob,
                # no grammar, nothing to roll back. _append_tokens' work for it, written out:
                # per row of every step, the calls it saves are most of its cost
                token, outputs, params = tokens[0], request.output_token_ids, request.params
                outputs.append(token)
                times = request.times
                times.token_times.append(now)
                times.token_steps.append(step)
                if times.first_token is None:
                    times.first_token, times.first_token_step = now, step
                request.num_computed_tokens = seq.start + seq.num_tokens
                cache_full_blocks(request)
                # check_stop decides, asked only when one of its stops could apply (an EOS, a
                # stop token id asked for, a length reached): most rows, most steps, have none
                if (token in eos or params.stop_token_ids or len(outputs) >= params.max_tokens
                        or len(request.prompt_token_ids) + len(outputs) >= max_model_len):
                    reason = check_stop(request, token)
                    if reason is not None:
                        self.finish(request, reason)
        self.after_update(output)
        return touched

    def _append_token(self, request: Request, token: int, logprob: Logprob | None, now: float,
                      step: int) -> RequestStatus | None:
        """One sampled token joins the request's output, the one place this happens (a step's
        tokens, or a committed step's token arriving): its logprob, the grammar's check, its
        time, then the stop checks. Returns what ends the request (a stop, or an error when the
        grammar refuses the token, its reason recorded) or None; the caller finishes it."""
        request.output_token_ids.append(token)
        if logprob is not None:
            request.logprobs.append(logprob)
        if request.logits_state is not None and not request.logits_state.accept(token):
            request.error = f"token {token} does not follow the request's grammar"
            return RequestStatus.FINISHED_ERROR
        times = request.times
        times.token_times.append(now)
        times.token_steps.append(step)
        if times.first_token is None:
            times.first_token, times.first_token_step = now, step
        return self.check_stop(request, token)

    def _append_tokens(self, seq: ScheduledSeq, tokens: list[int],
                       logprobs: list | None, now: float, step: int) -> None:
        """A row's 1 to k + 1 tokens, applied one at a time through the stop checks (the first
        that ends the request drops the rest); then what the row computed, less the rollback.

        The row fed `num_tokens` positions from `start`. Its last position's token is the newest
        one, computed next step; a verification row's positions after the last kept token hold
        rejected proposals, so only `start + num_tokens - rejected` positions count as computed
        and the blocks past them go back to the pool, before any full block is offered to the
        prefix cache. A decode row rejects nothing: it is the k = 0 case of the same rule."""
        request = seq.request
        if seq.proposal:
            request.num_proposed_tokens += len(seq.proposal)
            request.num_accepted_tokens += len(tokens) - 1
            request.num_verify_steps += 1
        reason, kept = None, 0
        for index, token in enumerate(tokens):
            reason = self._append_token(request, token,
                                        None if logprobs is None else logprobs[index], now, step)
            if reason is RequestStatus.FINISHED_ERROR:
                self.finish(request, reason)
                return
            kept += 1
            if reason is not None:
                break
        rejected = 1 + len(seq.proposal) - kept        # the row's logits positions, less kept
        request.num_computed_tokens = seq.start + seq.num_tokens - rejected
        if rejected:
            self.kv.truncate(request, request.num_computed_tokens)
        self.kv.cache_full_blocks(request)
        if reason is not None:
            self.finish(request, reason)

    def _resolve_placeholder(self, request: Request, token: int, logprobs: list | None,
                             now: float, step: int) -> None:
        """A committed step's token arrives: it replaces the request's oldest placeholder, and
        the stop checks run on it now, one step late (what ends the request also discards the
        token computed past it: `_mark_finished` drops the placeholders left)."""
        request.placeholders.pop(0)
        reason = self._append_token(request, token, None if logprobs is None else logprobs[0],
                                    now, step)
        # a running request offers its full blocks of known tokens to the prefix cache
        if reason is not RequestStatus.FINISHED_ERROR and request.status is RequestStatus.RUNNING:
            self.kv.cache_full_blocks(request, min(request.num_computed_tokens,
                                                   request.num_tokens - len(request.placeholders)))
        if reason is not None:
            self.finish(request, reason)

    def check_stop(self, request: Request, token: int) -> RequestStatus | None:
        """Whether `token`, just appended, ends the request: EOS, a stop token id, or a length."""
        params = request.params
        if not params.ignore_eos and token in self.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            request.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        # (tokens in flight do not count: this one may be followed by a placeholder already)
        if len(request.prompt_token_ids) + len(request.output_token_ids) >= \
                request.max_total_tokens(self.config.max_model_len):
            return RequestStatus.FINISHED_LENGTH
        return None

    def after_update(self, output: SchedulerOutput) -> None:
        """Hook for subclasses (the static scheduler ends its batch here)."""

    def finish(self, request: Request, status: RequestStatus) -> None:
        # (waiting: preempted while its last step was in flight, overlapped scheduling)
        queue = self.waiting if request.status is RequestStatus.WAITING else self.running
        queue.remove(request)
        self.kv.free(request)
        self._mark_finished(request, status)

    def take_finished(self) -> list[Request]:
        """The requests finished since the last call, and forget them."""
        finished, self.finished_requests = self.finished_requests, []
        return finished

    def _mark_finished(self, request: Request, status: RequestStatus) -> None:
        if request.logits_state is not None and not request.finished:
            self.num_host_state_requests -= 1
        if request.placeholders:   # tokens in flight past its end: never reported
            request.num_computed_tokens = max(
                request.num_computed_tokens - len(request.placeholders), 0)
            request.placeholders.clear()
        self.finished_requests.append(request)
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
        elif request.prompt_logprobs is not None:
            # its prompt's log-probabilities need the logits of every prompt position: it
            # recomputes the whole prompt (its blocks still go to the cache for others)
            request.num_computed_tokens = 0
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


def _record_prompt_logprobs(request: Request, start: int,
                            values: list[dict[int, float]]) -> None:
    """A row's prompt logprobs, for prompt positions start + 1 onwards: only those not recorded
    yet (a request recomputing its prompt after a preemption computes them again)."""
    skip = len(request.prompt_logprobs) - (start + 1)
    if skip >= 0:
        request.prompt_logprobs.extend(values[skip:])

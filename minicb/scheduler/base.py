"""What every scheduler shares: the queues, the step's rows, and the one update after a step.

A subclass decides which rows a step runs (`schedule()`); `update` applies what they produced.
Steps here never overlap: overlapped scheduling's bookkeeping (placeholders, the commit at
launch, stops applied a step late) is a class of its own, mixed in when the engine overlaps
steps (minicb.scheduler.overlap).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from minicb.config import EngineConfig
from minicb.kv.base import KVManager
from minicb.params import SamplingParams
from minicb.plan import Logprob, ModelRunnerOutput, ScheduledSeq, SchedulerOutput
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
        # (penalties, min_tokens, a grammar): their rows take update's general path, and
        # overlapped scheduling runs synchronous steps while any is live
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

    def admit_transferred(self, request: Request, params: SamplingParams | None = None) -> bool:
        """Admit a request whose KV cache another engine computed (a disaggregated cluster's
        prefill instance, which finished it at its first token) straight into the running
        batch, to decode the rest here, under `params` (the settings its client asked for; the
        prefill instance served it capped at one token): if a slot is free, no request of ours
        waits to be recomputed, and the pool has blocks for its cache and its next token
        (keeping the watermark). False: not now (nothing changed). Its blocks here hold the
        arrived KV."""
        config = self.config
        if self.waiting or len(self.running) >= config.max_num_seqs or not self.kv.can_allocate(
                request, request.num_computed_tokens + 1, reserve_blocks=config.watermark_blocks):
            return False
        self.kv.allocate(request, request.num_computed_tokens)
        request.times.finished = request.times.finished_step = None    # it goes on here
        if params is not None:
            request.params = params
        if request.logits_state is not None:
            self.num_host_state_requests += 1
        self.running.append(request)
        self._start_running(request)
        return True

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

    # --- the plan ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError

    def fully_planned(self) -> set[str]:
        """The ids of running requests whose every possible token is planned already, so no
        step may plan them a row: none here, where a request's last token ends it as soon as it
        is applied (a new set each call: a plan may add to it). The overlap scheduler's are
        those whose token in flight is their last."""
        return set()

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
        its one uncomputed token is its newest output token, it samples, and it has no prompt
        position left to score. Written out, as vLLM plans its "cached requests" apart from new
        ones: a decode step plans one of these per row, so what it leaves out (slicing the
        request's tokens, its prompt targets) is saved on every row of every step. (Every field
        is passed by position, the empty lists included: a dataclass takes keywords and fills
        defaults from factories at about twice the cost.)"""
        return ScheduledSeq(request, 1, request.num_computed_tokens,
                            request.output_token_ids[-1:], block_table, request.params,
                            request.generator, 0, False, True, True, [], None, [],
                            request.logits_state, request.request_id)

    # --- after the model ran -----------------------------------------------------------------
    def update(self, output: SchedulerOutput, sampled: ModelRunnerOutput) -> list[Request]:
        """Apply one step's results, the only place they are applied: every row's computed
        tokens, and for each row that needed logits its tokens (one for a decode or a prompt's
        last chunk, 1 to k + 1 for a verification row), logprobs or error, through the stop rule
        (`check_stop`). `sampled` has one entry per row that needed logits. Stop strings need
        the text: the engine checks them afterwards (minicb.engine.detokenizer).

        Two paths, chosen here: a step of plain rows only (each one query that sampled one
        token, with no logprob, no logits processing and nothing to roll back: the steady
        decode) goes to `_apply_plain_tokens`; any other step to the general `_apply_tokens`.

        Returns the requests that got a token or finished this step.
        """
        now, step = self.clock(), output.step
        if sampled.prompt_logprobs:
            self._record_prompt_logprobs(output, sampled)
        tokens, rows = sampled.sampled_token_ids, len(output.seqs)
        # plain, told by counts rather than row by row: as many rows sampled as there are rows,
        # each of one query (no ghost, no prompt chunk before the last, no verification row),
        # none failed, none asked for a logprob, and no live request has logits state
        if (len(tokens) == rows == output.num_decode_rows and not self.num_host_state_requests
                and sampled.errors.count(None) == rows and sampled.logprobs.count(None) == rows):
            touched = self._apply_plain_tokens(output, tokens, now, step)
        else:
            touched = self._apply_tokens(output, sampled, now, step)
        self.after_update(output)
        return touched

    @staticmethod
    def _record_prompt_logprobs(output: SchedulerOutput, sampled: ModelRunnerOutput) -> None:
        """Each asking row's prompt logprobs, for prompt positions start + 1 onwards: only those
        not recorded yet (a request recomputing its prompt after a preemption computes them
        again)."""
        for index, values in sampled.prompt_logprobs.items():
            seq = output.seqs[index]
            recorded = seq.request.prompt_logprobs
            skip = len(recorded) - (seq.start + 1)
            if skip >= 0:
                recorded.extend(values[skip:])

    def _apply_tokens(self, output: SchedulerOutput, sampled: ModelRunnerOutput, now: float,
                      step: int) -> list[Request]:
        """The general path of `update`, for any step: a prompt chunk before the last counts
        its tokens as computed (their KV is written); every row that sampled hands its tokens
        to `_append_tokens`, or ends with its error."""
        results = iter(zip(sampled.sampled_token_ids, sampled.logprobs, sampled.errors))
        touched: list[Request] = []
        for seq in output.seqs:
            if seq.ghost:
                continue
            request = seq.request
            if not seq.needs_logits:          # a prompt chunk before the last: KV only
                request.num_computed_tokens += seq.num_tokens
                self.kv.cache_full_blocks(request)
                continue
            tokens, logprobs, error = next(results)
            touched.append(request)
            if tokens is None:
                self._fail(request, error)
            else:
                self._append_tokens(seq, tokens, logprobs, now, step)
        return touched

    def _apply_plain_tokens(self, output: SchedulerOutput, sampled: list[list[int]],
                            now: float, step: int) -> list[Request]:
        """The fast path of `update`, for a step whose every row is plain (`update` says which):
        each row's one token joins its request's output as `_append_tokens` and `_append_token`
        would add it (no logprob, no grammar, nothing rejected), written out, since per row of
        every step the calls it saves are most of its cost; then the same stop rule."""
        check_stop, cache_full_blocks = self.check_stop, self.kv.cache_full_blocks
        touched = [seq.request for seq in output.seqs]
        for seq, request, (token,) in zip(output.seqs, touched, sampled):
            request.output_token_ids.append(token)
            times = request.times
            times.token_times.append(now)
            times.token_steps.append(step)
            if times.first_token is None:
                times.first_token, times.first_token_step = now, step
            request.num_computed_tokens = seq.start + seq.num_tokens
            cache_full_blocks(request)
            reason = check_stop(request, token)
            if reason is not None:
                self.finish(request, reason)
        return touched

    def _append_token(self, request: Request, token: int, logprob: Logprob | None, now: float,
                      step: int) -> RequestStatus | None:
        """One sampled token joins the request's output, the general path's one place for it:
        its logprob, the grammar's check, its time, then the stop rule. Returns what ends the
        request (a stop, or an error when the grammar refuses the token, its reason recorded)
        or None; the caller finishes it."""
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

    def check_stop(self, request: Request, token: int) -> RequestStatus | None:
        """The stop rule, stated once, asked by every path that appends a token: whether `token`,
        just appended, ends the request. An EOS token (unless ignore_eos), a stop token id, or a
        length: max_tokens output tokens, or max_model_len tokens in all (the request's
        max_total_tokens). Asked of every token, so the commonest answer, none, comes first."""
        params = request.params
        if token in self.eos_token_ids and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            request.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        num_outputs = len(request.output_token_ids)
        if (num_outputs >= params.max_tokens
                or len(request.prompt_token_ids) + num_outputs >= self.config.max_model_len):
            return RequestStatus.FINISHED_LENGTH
        return None

    def after_update(self, output: SchedulerOutput) -> None:
        """Hook for subclasses (the static scheduler ends its batch here)."""

    def _fail(self, request: Request, error: str | None) -> None:
        """A row that could not be sampled ends its request, with the reason."""
        request.error = error
        self.finish(request, RequestStatus.FINISHED_ERROR)

    def finish(self, request: Request, status: RequestStatus) -> None:
        self.running.remove(request)
        self.kv.free(request)
        self._mark_finished(request, status)

    def take_finished(self) -> list[Request]:
        """The requests finished since the last call, and forget them."""
        finished, self.finished_requests = self.finished_requests, []
        return finished

    def _mark_finished(self, request: Request, status: RequestStatus) -> None:
        if request.logits_state is not None and not request.finished:
            self.num_host_state_requests -= 1
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


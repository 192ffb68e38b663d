# Generated from solutions/ch03_scheduler_step.py by scripts/make_exercises.py. Replace each
# NotImplementedError with your code, then run `make grade CH=03`.
"""Chapter 03 exercise: one step of the continuous scheduler: budget, evict, admit.

Iteration-level scheduling (Orca) decides the batch again at EVERY step. Requests that finished
last step are already gone (their KV blocks freed by `Scheduler.finish`); then:

1. budget: the step may carry at most `config.max_num_batched_tokens` tokens. A decode needs one;
   a prompt needs all of its tokens, and gets as many as the budget has left (chunked prefill:
   the rest come next step).
2. running first: every running request, in order, gets its tokens. If the KV cache cannot hold
   them, evict (preempt) a running request not yet scheduled this step, latest arrival first,
   until they fit; the evicted request frees its blocks and will recompute from scratch later.
   If the request itself is the latest arrival, it is the one evicted.
3. admit: waiting requests join, first come first served, while there is a free slot
   (`config.max_num_seqs`), budget left and room in the KV cache for their first chunk. Stop at
   the first one that does not fit (no skipping ahead: that could starve long prompts). Admit
   no one in a step that had to evict: memory is short.

Your scheduler plugs into the real engine (minicb's LLM and the cost-model simulator), so the
tests check it step by step against minicb's own ContinuousScheduler and check that a real model
still generates exactly what transformers does, even with preemptions. The Scheduler base class
(minicb/scheduler/base.py) gives you the queues (`self.waiting`, `self.running`), the KV manager
(`self.kv`: `can_allocate(request, num_tokens)`, `allocate`, `free`), `self.row` (a row of the
plan, with the block table the runner reads), `self._start_running` and the update after the
model ran.

Grade it: make grade CH=03
"""

from __future__ import annotations

from minicb.config import EngineConfig
from minicb.plan import SchedulerOutput
from minicb.request import Request, RequestStatus
from minicb.scheduler.base import Scheduler

# the knobs this exercise leaves at minicb's defaults (the policies of chapter 03's second half)
DEFAULT_KNOBS = {"policy": "fcfs", "step_order": "decode_first",
                 "max_prefill_tokens_per_step": None, "max_wait_steps": None, "watermark_blocks": 0,
                 "enable_prefix_caching": False}


class StepScheduler(Scheduler):
    """Continuous batching with first-come-first-served admission and eviction by recompute."""

    def __init__(self, config: EngineConfig, *args, **kwargs):
        changed = [f"{name}={getattr(config, name)!r}" for name, default in DEFAULT_KNOBS.items()
                   if getattr(config, name) != default]
        if changed:
            raise ValueError("StepScheduler implements the default policy only; leave "
                             f"{', '.join(changed)} at their defaults, or use minicb's "
                             "ContinuousScheduler.")
        super().__init__(config, *args, **kwargs)
        self.token_budget = 0
        self.scheduled_ids: set[str] = set()

    def schedule(self) -> SchedulerOutput:
        """Plan one step: running requests first, then admissions, within one token budget."""
        self.step_count += 1
        output = SchedulerOutput(step=self.step_count)
        self.token_budget = self.config.max_num_batched_tokens
        self.scheduled_ids = set()
        self.schedule_running(output)
        self.admit_waiting(output)
        return output

    def tokens_this_step(self, request: Request) -> int:
        """How many of the request's uncomputed tokens this step can carry (budget).

        A decode wants 1 token; a prompt (or a recompute after eviction) wants all of its
        uncomputed tokens, `request.num_uncomputed_tokens`. Return what fits in
        `self.token_budget`, which may be 0.
        """
        raise NotImplementedError(
            "tokens_this_step: the request's uncomputed tokens, capped by the token budget left")

    def take(self, output: SchedulerOutput, request: Request, num_tokens: int) -> None:
        """Put `num_tokens` of `request` in this step: KV room for them, a row, the budget spent."""
        self.kv.allocate(request, request.num_computed_tokens + num_tokens)
        output.seqs.append(self.row(request, num_tokens))     # the row, with its block table
        self.scheduled_ids.add(request.request_id)
        self.token_budget -= num_tokens

    def preempt(self, request: Request, output: SchedulerOutput) -> None:
        """Evict a running request: free its blocks and queue it first to recompute everything."""
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, request)
        output.preempted.append(request)

    def pick_victim(self) -> Request:
        """The running request to evict: among those NOT scheduled this step
        (`self.scheduled_ids`), the latest arrival (largest `arrival_index`)."""
        raise NotImplementedError(
            "pick_victim: the latest arrival among running requests not yet scheduled this step")

    def schedule_running(self, output: SchedulerOutput) -> None:
        """Give every running request, in `self.running` order, its tokens for this step (evict).

        For each request: skip it if an earlier eviction in this loop already preempted it
        (its status is no longer RUNNING); ask tokens_this_step (skip at 0: it keeps its blocks
        and waits); while `self.kv.can_allocate(request, request.num_computed_tokens + tokens)`
        is False, preempt `pick_victim()`, stopping if the victim is the request itself; if it
        is still running, `take` it.

        Hint: loop over a copy, `list(self.running)`: preempt removes from self.running.
        """
        raise NotImplementedError(
            "schedule_running: for each running request: evict pick_victim() until it fits, then "
            "take it")

    def admit_waiting(self, output: SchedulerOutput) -> None:
        """Admit waiting requests, earliest arrival (`arrival_index`) first (admit).

        Stop when: this step evicted anyone (`output.preempted`), no slot is free
        (len(self.running) == config.max_num_seqs), the budget is spent, or the next request's
        first chunk does not fit the KV cache (`self.kv.can_allocate(request, tokens)`). An
        admitted request moves from self.waiting to the end of self.running, is marked with
        `self._start_running(request)`, and is taken with its tokens.
        """
        raise NotImplementedError(
            "admit_waiting: while a slot, budget and KV room for its first chunk are free, admit "
            "FCFS")

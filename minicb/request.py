"""A request's life: WAITING → RUNNING → (PREEMPTED → WAITING →) FINISHED_*."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from minicb.params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"        # EOS, a stop token or a stop string
    FINISHED_LENGTH = "length"       # max_tokens or max_model_len reached
    FINISHED_ABORTED = "abort"       # the client went away or called abort()
    FINISHED_ERROR = "error"         # rejected: bad input, reported alone

    @property
    def finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)


@dataclass
class RequestTimes:
    """Timestamps, in seconds (wall clock) and in engine steps (virtual time)."""

    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    arrival_step: int = 0
    first_scheduled_step: int | None = None
    first_token_step: int | None = None
    token_steps: list[int] = field(default_factory=list)
    finished_step: int | None = None


class Request:
    """One prompt and everything the engine tracks for it.

    `num_computed_tokens` counts tokens whose K/V sit in the cache; the next step computes
    `all_token_ids[num_computed_tokens:]` (a prefill chunk, or the one latest token of a decode).
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float = 0.0, arrival_step: int = 0,
                 generator: torch.Generator | None = None, prompt: str | None = None,
                 priority: int = 0, arrival_index: int = 0, group_id: str | None = None,
                 sample_index: int = 0):
        self.request_id = request_id
        # the caller's request: a request with n samples runs as n Requests of one group
        self.group_id = request_id if group_id is None else group_id
        self.sample_index = sample_index
        self.arrival_index = arrival_index   # order of arrival, breaks every tie
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        # overlapped scheduling: the tokens of steps planned but not yet collected, oldest first.
        # Each is -1 - r, r the row of that step's sampled tokens the runner fills it from (on
        # the device) before the next forward; the host learns the token one step later, when it
        # moves into output_token_ids. Always empty in synchronous steps.
        self.placeholders: list[int] = []
        self.params = params
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0      # computed tokens it found cached when first scheduled
        self.num_preemptions = 0
        self.generator = generator
        self.times = RequestTimes(arrival=arrival_time, arrival_step=arrival_step)
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.output_text = ""
        self.logprobs: list[tuple[float, dict[int, float]]] = []
        # per prompt position, {token id: logprob} (the first position has none: None), filled
        # as the prefill computes them; None unless params.prompt_logprobs asks
        self.prompt_logprobs: list[dict[int, float] | None] | None = \
            [None] if params.prompt_logprobs is not None else None
        # penalties, min_tokens and a grammar's matcher (minicb.runner.logits_process); None: none
        self.logits_state = None
        self.num_reported_tokens = 0    # how many output tokens step() has already handed out
        # speculative decoding: tokens proposed, proposals accepted, verification rows run
        self.num_proposed_tokens = 0
        self.num_accepted_tokens = 0
        self.num_verify_steps = 0

    # --- lengths -------------------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids + self.placeholders

    def token_ids(self, start: int, stop: int) -> list[int]:
        """all_token_ids[start:stop] without building the whole list: a step reads only the
        tokens it computes, never the cached ones before them."""
        prompt_len = len(self.prompt_token_ids)
        if stop <= prompt_len:
            return self.prompt_token_ids[start:stop]
        if start < prompt_len:
            return self.prompt_token_ids[start:] + self.token_ids(prompt_len, stop)
        first, last = start - prompt_len, stop - prompt_len
        outputs = self.output_token_ids
        if last <= len(outputs):
            return outputs[first:last]
        return outputs[first:] + self.placeholders[max(first - len(outputs), 0):last - len(outputs)]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt and output tokens, those still in flight (placeholders) included."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + len(self.placeholders)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """True until the whole prompt (and, after a preemption, the output so far) is cached.
        (num_uncomputed_tokens > 1, written out: the scheduler asks it of every row it plans.)"""
        outputs, placeholders = self.output_token_ids, self.placeholders
        return (len(self.prompt_token_ids) + len(outputs) + len(placeholders)
                - self.num_computed_tokens > 1 or not (outputs or placeholders))

    @property
    def finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.finished else None

    def max_total_tokens(self, max_model_len: int) -> int:
        """The longest this request can grow: prompt + max_tokens, capped by max_model_len."""
        return min(len(self.prompt_token_ids) + self.params.max_tokens, max_model_len)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}"
                f"{f'+{len(self.placeholders)} in flight' if self.placeholders else ''}, "
                f"computed={self.num_computed_tokens}, "
                f"{self.status.name})")

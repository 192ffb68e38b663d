"""The step's contract: what the scheduler hands the runner, and what the runner hands back.

    Scheduler.schedule() -> SchedulerOutput (rows of ScheduledSeq) -> executor.execute()
    -> ModelRunnerOutput (per row 1..k+1 tokens) -> Scheduler.update()

Everything a runner reads is in a ScheduledSeq, copied when the row was planned; everything the
scheduler applies after a step is in a ModelRunnerOutput. Neither side reaches into the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from minicb.params import SamplingParams
from minicb.request import Request

if TYPE_CHECKING:   # the type of a field only: the runner's state, carried through the plan
    from minicb.runner.logits_process import LogitsState


@dataclass(slots=True)
class ScheduledSeq:
    """One row of the packed batch, with everything the runner needs to pack and sample it.

    `request` is the scheduler's own record, kept so `update` knows whom the row's token is for;
    the runner reads only the other fields, values copied when the row was planned.
    """

    request: Request
    num_tokens: int           # real tokens this row computes (a ghost recomputes one, unkept)
    start: int                # tokens of the request already cached: the first one's position
    token_ids: list[int]      # the tokens this row feeds the model (padding not included)
    block_table: list[int]    # the request's KV blocks, in order, after this step's allocation
    params: SamplingParams
    generator: torch.Generator | None
    num_pad: int = 0          # left padding before the real tokens (static prefill)
    ghost: bool = False       # a finished request kept in a static batch: computed, then discarded
    needs_logits: bool = False
    # THE definition of a decode row, for metrics, the simulator, attention and the kernels: the
    # row carries one query, which attends to every key its request has cached. A decode, a
    # parallel sample's first step (it shares its first sample's prompt and computes only the
    # last prompt token), a prompt's last one-token chunk and a static batch's ghost all are.
    is_decode: bool = False
    # speculative decoding: the proposed tokens this row verifies. The row feeds the request's
    # last token and then these, and needs logits at every one of its 1 + len(proposal) positions
    proposal: list[int] = field(default_factory=list)
    # the proposer's distribution q for each proposed token ([k, vocab]) when it sampled them
    # (a draft model, for a sampled request); None for a deterministic proposer or a greedy one.
    # A draft model's row is planned with k placeholder proposals: minicb.spec.draft_model fills
    # them and this before the target's forward
    draft_probs: torch.Tensor | None = None
    # prompt log-probabilities: the prompt tokens this row's first positions predict, one per
    # position whose logits the runner keeps ([] unless the request asks for prompt_logprobs)
    prompt_targets: list[int] = field(default_factory=list)
    # the request's penalties, min_tokens and grammar state (minicb.runner.logits_process), or None
    logits_state: LogitsState | None = None
    # the request's id: the runner keeps the request's row of its persistent batch under it
    # (minicb.runner.input_batch), so it never needs the Request itself
    req_id: str | None = None

    @property
    def num_logits(self) -> int:
        """Positions whose logits the runner returns: 1 + len(proposal), or 0."""
        return 1 + len(self.proposal) if self.needs_logits else 0

    @property
    def is_prefill(self) -> bool:
        return not self.is_decode

    @property
    def q_len(self) -> int:
        """Query rows in the packed batch: padding + real tokens."""
        return self.num_pad + len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Keys this row attends to, its own included (a ghost writes nothing, so not its own)."""
        return self.start if self.ghost else self.start + self.num_tokens


@dataclass
class SchedulerOutput:
    step: int
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # (source, destination) blocks the runner copies before the forward: copy-on-write
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # overlapped scheduling: OverlapScheduler.commit applied the plan when it was launched, and
    # its token ids may hold placeholders for the previous step's tokens (minicb.request)
    committed: bool = False

    # the counts below, once read (None: not yet)
    _counted: tuple[int, int, int, int, int, int] | None = field(default=None, init=False,
                                                                 repr=False, compare=False)

    # every count of a step's rows and tokens is defined here, once, from the rows' is_decode;
    # read after the plan is complete (counted in one pass over the rows, then kept: kept by
    # hand, as functools.cached_property would, without the lock it takes on every first read)
    @property
    def _counts(self) -> tuple[int, int, int, int, int, int]:
        if self._counted is None:
            self._counted = self._count()
        return self._counted

    def _count(self) -> tuple[int, int, int, int, int, int]:
        tokens = useful = decode_rows = prefill_tokens = decode_tokens = pad_tokens = 0
        for s in self.seqs:
            tokens += s.num_tokens + s.num_pad
            pad_tokens += s.num_pad
            if s.ghost:
                pad_tokens += s.num_tokens
            else:
                useful += 1
            if s.is_decode:
                decode_rows += 1
                if not s.ghost:
                    decode_tokens += s.num_tokens
            else:
                prefill_tokens += s.num_tokens
        return tokens, useful, decode_rows, prefill_tokens, decode_tokens, pad_tokens

    @property
    def num_tokens(self) -> int:
        return self._counts[0]

    @property
    def num_useful_rows(self) -> int:
        """Rows whose output is kept (not a static batch's finished ghost)."""
        return self._counts[1]

    @property
    def num_decode_rows(self) -> int:
        return self._counts[2]

    @property
    def num_prefill_tokens(self) -> int:
        return self._counts[3]

    @property
    def num_decode_tokens(self) -> int:
        return self._counts[4]

    @property
    def num_pad_tokens(self) -> int:
        return self._counts[5]

    @property
    def is_empty(self) -> bool:
        return not self.seqs


Logprob = tuple[float, dict[int, float]]   # (the chosen token's logprob, {id: logprob} of the top)


@dataclass
class SamplerOutput:
    """The sampler's answer for a batch of rows, one token each."""

    token_ids: list[int]
    # per row: (logprob of the chosen token, {token_id: logprob} of the top-k) or None
    logprobs: list[Logprob | None]
    # per row, when a row could not be sampled: why (its token is None); None when all went well
    errors: list[str | None] | None = None


@dataclass
class ModelRunnerOutput:
    """A step's result, one entry per row that needed logits, whatever the row was: a decode or a
    prompt's last chunk yields one token, a speculative verification row 1 to k + 1. Every path
    after the model (the scheduler's update, the simulators) reads this one shape."""

    sampled_token_ids: list[list[int] | None]    # None: the row could not be sampled
    logprobs: list[list[Logprob | None] | None]  # per row, one entry per token; None: not asked
    errors: list[str | None]                     # per row: why it has no tokens (every row
    #                                              without tokens has one), else None
    # prompt log-probabilities, by the row's index in the step's SchedulerOutput.seqs: one
    # {token id: logprob} per prompt position the row computed (the next prompt token's and the
    # top prompt_logprobs); None when no row asked
    prompt_logprobs: dict[int, list[dict[int, float]]] | None = None

    @classmethod
    def of(cls, sampled: ModelRunnerOutput | SamplerOutput | Sequence[int | None]
           ) -> ModelRunnerOutput:
        """The one place a step's result is read into this shape (EngineCore.end_step calls it):
        a sampler's one-token-per-row answer, or a plain list of token ids (a model-free
        runner's: the cost model's), is read as a step's result; a row without a token gets an
        error saying so when its answer gave none."""
        if isinstance(sampled, ModelRunnerOutput):
            return sampled
        if not isinstance(sampled, SamplerOutput):
            sampled = SamplerOutput(list(sampled), [None] * len(sampled))
        errors = sampled.errors or [None] * len(sampled.token_ids)
        return cls([None if t is None else [t] for t in sampled.token_ids],
                   [None if lp is None else [lp] for lp in sampled.logprobs],
                   [error or (None if t is not None else "the row could not be sampled")
                    for t, error in zip(sampled.token_ids, errors)])

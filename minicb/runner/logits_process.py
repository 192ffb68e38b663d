"""Penalties, filters and grammar masks: what a request asks to change in its logits before the
sampler draws, applied per row of the packed batch from one hook (`apply_logits_processors`).

Every processor is vectorised over the rows that ask for it and leaves the other rows as they
are, bit for bit: the batch's logits are copied once and only the asking rows are written. The
raw logits stay as they were for log-probabilities (vLLM's default "raw_logprobs" mode: the
model's own distribution, before any penalty, bias, mask or temperature).

The order is vLLM's: the grammar's mask, min_tokens and logit_bias, the three penalties, then
(after temperature) min_p; top-k and top-p follow in the sampler.

Two families of repetition penalty, with different definitions:

- OpenAI's presence_penalty and frequency_penalty are ADDITIVE and count OUTPUT tokens only:
  logit[t] -= presence * (t appeared in the output) + frequency * (times t appeared in the output).
  A negative value encourages repeats. The prompt is not counted.
- repetition_penalty (Keskar et al.'s CTRL, 2019; transformers' RepetitionPenaltyLogitsProcessor
  and vLLM's) is MULTIPLICATIVE over PROMPT AND OUTPUT tokens: for every token seen, a positive
  logit is divided by the penalty, a negative one multiplied, so both move towards "less likely".
  Its effect depends on the logit's size and sign (a logit near 0 barely moves), and a word the
  prompt mentions is penalised before the model ever says it. transformers applies it over its
  `input_ids` (prompt and generated tokens, for a decoder-only model), so the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from minicb.runner.structured_outputs import (
    StructuredOutputMatcher,
    allocate_bitmask,
    bitmask_to_bool,
)

if TYPE_CHECKING:        # minicb.runner.sampler calls this module's hook
    from minicb.params import SamplingParams


class LogitsState:
    """What a request's processors read besides its settings, kept up to date token by token (so
    a step never walks a request's history): counts of its output tokens, the prompt's tokens as a
    mask, how many tokens it has produced, the ids min_tokens holds back, and its grammar matcher.
    """

    def __init__(self, params: SamplingParams, prompt_token_ids: Sequence[int], vocab_size: int,
                 stop_token_ids: Iterable[int] = (),
                 matcher: StructuredOutputMatcher | None = None):
        self.num_output_tokens = 0
        penalised = (params.presence_penalty or params.frequency_penalty
                     or params.repetition_penalty != 1.0)
        self.output_counts = torch.zeros(vocab_size, dtype=torch.int32) if penalised else None
        self.prompt_mask = None
        if params.repetition_penalty != 1.0:
            self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool)
            self.prompt_mask[torch.tensor(list(prompt_token_ids), dtype=torch.long)] = True
        # EOS and the stop token ids: masked while fewer than min_tokens tokens came out (an id
        # past the vocabulary can never be sampled, so it needs no mask)
        self.min_tokens_ids = torch.tensor(sorted({t for t in stop_token_ids if t < vocab_size}),
                                           dtype=torch.long)
        self.matcher = matcher

    def accept(self, token_id: int) -> bool:
        """Count a token the request produced; False if its grammar refuses it."""
        self.num_output_tokens += 1
        if self.output_counts is not None:
            self.output_counts[token_id] += 1
        return self.matcher is None or self.matcher.accept(token_id)


def apply_logits_processors(logits: torch.Tensor, params: list[SamplingParams],
                            states: Sequence[LogitsState | None] | None = None) -> torch.Tensor:
    """The batch's logits [rows, vocab] (float32) after each row's processors: `logits` itself
    when no row asks for any, else a copy in which only the asking rows differ."""
    asking = [row for row, p in enumerate(params) if p.needs_logits_processing]
    if not asking:
        return logits
    states = states if states is not None else [None] * len(params)
    for row in asking:
        if states[row] is None and _needs_state(params[row]):
            raise ValueError("penalties, min_tokens and structured outputs need the request's "
                             "LogitsState (the engine keeps one per request that asks).")
    logits = logits.clone()
    _apply_grammar(logits, [(r, states[r].matcher) for r in asking
                            if states[r] is not None and states[r].matcher is not None])
    _apply_min_tokens(logits, [r for r in asking if params[r].min_tokens
                               and states[r].num_output_tokens < params[r].min_tokens], states)
    _apply_logit_bias(logits, [(r, params[r].logit_bias) for r in asking if params[r].logit_bias])
    _apply_penalties(logits, [r for r in asking if states[r] is not None
                              and states[r].output_counts is not None], params, states)
    _apply_min_p(logits, [r for r in asking if params[r].min_p and not params[r].greedy], params)
    return logits


def _needs_state(params: SamplingParams) -> bool:
    return bool(params.presence_penalty or params.frequency_penalty or params.min_tokens
                or params.repetition_penalty != 1.0 or params.structured_outputs is not None)


def _apply_grammar(logits: torch.Tensor, rows: list[tuple[int, StructuredOutputMatcher]]) -> None:
    """-inf for every token the row's grammar does not allow next: one bitmask for the rows, each
    row's bits written by its matcher, unpacked and applied as one masked_fill."""
    if not rows:
        return
    vocab = logits.shape[1]
    bitmask = allocate_bitmask(len(rows), vocab)
    for index, (_, matcher) in enumerate(rows):
        matcher.fill_bitmask(bitmask, index)
    allowed = bitmask_to_bool(bitmask, vocab).to(logits.device)
    index = torch.tensor([row for row, _ in rows], device=logits.device)
    # index_select / index_copy_: on a CPU several times faster than logits[index] with a tensor
    masked = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))
    logits.index_copy_(0, index, masked)


def _apply_min_tokens(logits: torch.Tensor, rows: list[int],
                      states: Sequence[LogitsState | None]) -> None:
    """EOS and the stop token ids get -inf until the row has min_tokens tokens (vLLM's and
    transformers' MinNewTokensLengthLogitsProcessor)."""
    pairs = [(row, token) for row in rows for token in states[row].min_tokens_ids.tolist()]
    if pairs:
        index = torch.tensor(pairs, device=logits.device).T
        logits[index[0], index[1]] = float("-inf")


def _apply_logit_bias(logits: torch.Tensor, rows: list[tuple[int, dict[int, float]]]) -> None:
    """Add each row's bias to its tokens' logits (OpenAI's logit_bias: -100 all but bans a token,
    100 all but forces it)."""
    if not rows:
        return
    index = [(row, token) for row, bias in rows for token in bias]
    values = [value for _, bias in rows for value in bias.values()]
    where = torch.tensor(index, device=logits.device).T
    logits.index_put_((where[0], where[1]), torch.tensor(values, device=logits.device),
                      accumulate=True)


def _apply_penalties(logits: torch.Tensor, rows: list[int], params: list[SamplingParams],
                     states: Sequence[LogitsState | None]) -> None:
    """repetition_penalty over prompt + output tokens, then frequency and presence over output
    tokens (vLLM's apply_penalties), on the rows' stacked counts; a penalty no row asks for
    costs nothing (each is a few full passes over [rows, vocab])."""
    if not rows:
        return
    device, vocab = logits.device, logits.shape[1]
    index = torch.tensor(rows, device=device)
    counts = torch.stack([states[r].output_counts for r in rows]).to(device)
    in_output = counts > 0
    sub = logits.index_select(0, index)
    if any(params[r].repetition_penalty != 1.0 for r in rows):
        no_prompt = torch.zeros(vocab, dtype=torch.bool)
        seen = torch.stack([states[r].prompt_mask if states[r].prompt_mask is not None
                            else no_prompt for r in rows]).to(device) | in_output
        repetition = torch.tensor([params[r].repetition_penalty for r in rows], device=device)
        factor = torch.where(seen, repetition[:, None], 1.0)
        # a positive logit divided, a negative one multiplied: the same values as a where() on
        # the sign, for about half its time on a CPU
        sub = sub.clamp(min=0) / factor + sub.clamp(max=0) * factor
    if any(params[r].frequency_penalty for r in rows):
        frequency = torch.tensor([params[r].frequency_penalty for r in rows], device=device)
        sub = sub - frequency[:, None] * counts
    if any(params[r].presence_penalty for r in rows):
        presence = torch.tensor([params[r].presence_penalty for r in rows], device=device)
        sub = sub - presence[:, None] * in_output
    logits.index_copy_(0, index, sub)


def _apply_min_p(logits: torch.Tensor, rows: list[int], params: list[SamplingParams]) -> None:
    """Drop every token whose probability (at the row's temperature) is below min_p times the
    most likely token's (transformers' MinPLogitsWarper, vLLM's min_p). Greedy rows skip it: it
    never removes the most likely token."""
    if not rows:
        return
    index = torch.tensor(rows, device=logits.device)
    temperature = torch.tensor([params[r].temperature for r in rows], device=logits.device)
    min_p = torch.tensor([params[r].min_p for r in rows], device=logits.device)
    sub = logits.index_select(0, index)
    probs = (sub / temperature[:, None]).softmax(dim=-1)
    drop = probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    logits.index_copy_(0, index, sub.masked_fill(drop, float("-inf")))

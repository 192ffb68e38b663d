"""Chapter 02 exercise: a static batch: left padding, the attention mask, and what it wastes.

A static batch runs its prompts as ONE rectangle of tokens. Prompts have different lengths, so
the short ones are padded to the longest, on the LEFT, so that every row's last column is its
last real token and the next token of every row comes out of the same column:

    prompt A  [ 5  6  7 ]          ids   [ 5  6  7 ]      mask  [ 1  1  1 ]
    prompt B  [ 8 ]          →           [ 0  0  8 ]            [ 0  0  1 ]

The attention mask says which columns are real, so no real token ever attends to a pad. Each
real token keeps its own position (0 for a row's first real token), so RoPE rotates it exactly
as if it ran alone; a pad's position is 0, and its output is thrown away.

Then the batch decodes together until its LONGEST answer is done: a row whose answer is complete
keeps its slot, computing tokens nobody reads (an idle slot), and waiting requests cannot use
it. Padding and idle slots are the waste continuous batching removes (chapter 03).

Grade it: make grade CH=02
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad prompts on the left into one batch.

    Contract: (input_ids, attention_mask), both int64 [len(prompts), longest prompt]; row i
    ends with prompts[i], preceded by pad_id; the mask is 1 on real tokens, 0 on pads.

    >>> ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    # BEGIN SOLUTION: one row per prompt, pad_id on the left up to the longest; mask 1 = real token
    longest = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), longest), pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((len(prompts), longest), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        input_ids[row, longest - len(prompt):] = torch.tensor(prompt, dtype=torch.int64)
        attention_mask[row, longest - len(prompt):] = 1
    return input_ids, attention_mask
    # END SOLUTION


def padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position (int64, same shape as the mask): a row's real tokens count 0, 1,
    2, ... from its first real token; pads get 0.

    Hint: a running count of real tokens along the row (torch.cumsum) is almost it.

    >>> padded_positions(torch.tensor([[1, 1, 1], [0, 0, 1]])).tolist()
    [[0, 1, 2], [0, 0, 0]]
    """
    # BEGIN SOLUTION: count real tokens along each row; pads (and each row's first token) are 0
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
    # END SOLUTION


@dataclass
class StaticBatchStats:
    num_steps: int             # engine steps to serve everyone: per batch, 1 prefill + its decodes
    num_pad_tokens: int        # pad tokens computed in the prefill steps
    num_idle_slot_steps: int   # decode rows of requests whose answer was already complete
    slot_utilisation: float    # rows that produced a wanted token / (num_steps * batch_size)


def static_batch_stats(prompt_lens: list[int], output_lens: list[int],
                       batch_size: int) -> StaticBatchStats:
    """What static batching costs for requests served in order, `batch_size` at a time.

    Requests 0..batch_size-1 form the first batch, the next batch_size the second, and so on
    (assume every batch fits the token budget and the KV pool). A batch takes one prefill step,
    which already yields every row's first output token, and decodes one token per row per step
    until its longest answer is complete. Every row produces one token per step, wanted or not.

    Worked example (the book's): answers of 4, 4, 10 and 10 tokens on four slots, two more
    4-token requests waiting. The first batch takes 10 steps and the second 4: 14 steps. The
    4-token rows sit idle for 6 steps each: 12 idle slot-steps. 36 wanted tokens came out of
    14 * 4 = 56 slot-steps.

    >>> stats = static_batch_stats([4] * 6, [4, 4, 10, 10, 4, 4], batch_size=4)
    >>> stats.num_steps, stats.num_pad_tokens, stats.num_idle_slot_steps
    (14, 0, 12)
    >>> round(stats.slot_utilisation, 3)
    0.643
    >>> static_batch_stats([3, 1, 2], [1, 1, 1], batch_size=3).num_pad_tokens   # pads 0 + 2 + 1
    3
    """
    # BEGIN SOLUTION: walk the batches: steps = longest answer, pads = longest prompt - each prompt
    num_steps = num_pad_tokens = num_idle = 0
    for start in range(0, len(prompt_lens), batch_size):
        prompts, outputs = prompt_lens[start:start + batch_size], output_lens[
            start:start + batch_size]
        num_steps += max(outputs)
        num_pad_tokens += sum(max(prompts) - p for p in prompts)
        num_idle += sum(max(outputs) - o for o in outputs)
    return StaticBatchStats(num_steps, num_pad_tokens, num_idle,
                            sum(output_lens) / (num_steps * batch_size))
    # END SOLUTION

"""Packing: a plan (SchedulerOutput) becomes the tensors of one forward pass.

Two packers, one result. `pack` takes any step: per row, [pad…, the row's tokens], and everything
else (positions, slots, the rows whose logits are kept) by tensor operations over the packed
batch, so Python touches each row once, never each cached token. `pack_decodes` takes the
commonest step, decodes only, and packs the same tensors for less: every row is one token at
position `start`, nothing is padded, every row's logits are kept, so each row's position and slot
are one line of arithmetic, read off the persistent batch (minicb.runner.input_batch) in one pass,
and what depends on the row count alone is made once per count. ModelRunner.prepare chooses
between them; tests/engine/test_step_contract.py holds them equal on the same plan.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch

from minicb.model.attention import AttentionMetadata
from minicb.plan import ScheduledSeq, SchedulerOutput
from minicb.runner.input_batch import DecodeInputs, InputBatch


class PackedStep(NamedTuple):
    """A step as the forward and the sampler take it. It carries all the step reads of the
    runner's state between steps (`decode`), so a step prepared while the last one runs
    (overlapped scheduling) never shares that state with it."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    decode: DecodeInputs | None     # a step of decodes only: what it read of the batch


def pack(output: SchedulerOutput, block_size: int, pad_token_id: int,
         device: torch.device) -> PackedStep:
    """Any step: per row, [pad…, the row's tokens]; everything else by tensor ops."""
    seqs = output.seqs
    input_ids: list[int] = []
    q_lens, starts, pads, seq_lens, real_rows = [], [], [], [], []
    for seq in seqs:
        input_ids.extend([pad_token_id] * seq.num_pad)
        input_ids.extend(seq.token_ids)
        q_lens.append(seq.q_len)
        starts.append(seq.start)
        pads.append(seq.num_pad)
        seq_lens.append(seq.seq_len)
        real_rows.append(not seq.ghost)

    q_lens_t = torch.tensor(q_lens)
    cu_seqlens_q = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu_seqlens_q[1:] = q_lens_t.cumsum(0)
    row_of_token = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens_t)
    offset_in_row = torch.arange(len(input_ids)) - cu_seqlens_q[:-1].long()[row_of_token]
    pads_t = torch.tensor(pads)[row_of_token]
    positions = (torch.tensor(starts)[row_of_token] + offset_in_row - pads_t).clamp(min=0)
    tables = block_tables(seqs)
    max_blocks = tables.shape[1]
    # token at position p of row r → block_tables[r, p // block_size] * block_size + p %
    # block_size
    slots = tables[row_of_token, (positions // block_size).clamp(max=max_blocks - 1)].long() \
        * block_size + positions % block_size
    writes = (offset_in_row >= pads_t) & torch.tensor(real_rows)[row_of_token]
    slot_mapping = torch.where(writes, slots, torch.full_like(slots, -1))
    ends = cu_seqlens_q[1:].long()
    if any(s.proposal or s.prompt_targets for s in seqs):
        # a verification row needs logits at each of its 1 + k positions, a row asking for
        # prompt logprobs at its first len(prompt_targets) positions too, the rest at the last
        logits_indices = torch.cat([part for s, end in zip(seqs, ends.tolist())
                                    for part in _row_logits(s, end)]
                                   or [torch.zeros(0, dtype=torch.long)])
    else:
        logits_indices = (ends - 1)[[s.needs_logits for s in seqs]]
    return _to_device(output, device, torch.tensor(input_ids), positions, slot_mapping,
                      cu_seqlens_q, torch.tensor(seq_lens, dtype=torch.int32), seq_lens, tables,
                      q_lens, logits_indices)


def pack_decodes(output: SchedulerOutput, batch: InputBatch, device: torch.device) -> PackedStep:
    """The decode-only step (no ghost, no prompt logprobs): row r is one token at position
    start_r, every row needs its logits, nothing is padded. The persistent batch gathers the rows
    in one pass (their block tables rewritten only when they changed) into arrays that become
    tensors without a copy; what depends on the row count alone (cu_seqlens_q, the logits of
    every row, the query lengths and decode marks) is the same for every step of as many rows,
    made once."""
    inputs = batch.gather(output.seqs)
    num_rows = len(output.seqs)
    cu_seqlens_q, logits_indices, q_lens, decode_rows = _decode_row_numbers(num_rows)
    if device.type != "cpu":
        return _to_device(output, device, torch.from_numpy(inputs.tokens),
                          torch.from_numpy(inputs.positions), torch.from_numpy(inputs.slots),
                          cu_seqlens_q, torch.from_numpy(inputs.seq_lens), inputs.seq_lens_host,
                          torch.from_numpy(inputs.block_tables), q_lens, logits_indices, inputs)
    # on the host, the arrays are the step's tensors: nothing to move
    meta = AttentionMetadata(torch.from_numpy(inputs.slots), cu_seqlens_q,
                             torch.from_numpy(inputs.seq_lens),
                             torch.from_numpy(inputs.block_tables), 1, max(inputs.seq_lens_host),
                             q_lens, inputs.seq_lens_host, decode_rows, num_rows)
    return PackedStep(torch.from_numpy(inputs.tokens), torch.from_numpy(inputs.positions), meta,
                      logits_indices, inputs)


@lru_cache(maxsize=1024)
def _decode_row_numbers(num_rows: int) -> tuple[torch.Tensor, torch.Tensor, list[int],
                                                list[bool]]:
    """A decode step's cu_seqlens_q (0, 1, …, rows), logits_indices (every row), query lengths
    and decode marks: the same for every step of `num_rows` rows, so never written in place."""
    rows = torch.arange(num_rows + 1, dtype=torch.int32)
    return rows, rows[:-1].long(), [1] * num_rows, [True] * num_rows


def block_tables(seqs: list[ScheduledSeq]) -> torch.Tensor:
    """The rows' block tables, padded with block 0 to the longest: int32 [rows, max_blocks]."""
    tables = [s.block_table for s in seqs]
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) if len(t) < width else t for t in tables],
                        dtype=torch.int32)


def _row_logits(seq: ScheduledSeq, end: int) -> list[torch.Tensor]:
    """The packed positions whose logits a row needs, in order: its prompt positions (for prompt
    logprobs), then those it samples from (the last, or a verification row's 1 + k)."""
    parts = []
    if seq.prompt_targets:
        first = end - seq.num_tokens
        parts.append(torch.arange(first, first + len(seq.prompt_targets)))
    if seq.needs_logits:
        parts.append(torch.arange(end - seq.num_logits, end))
    return parts


def _to_device(output, device, input_ids, positions, slot_mapping, cu_seqlens_q, seq_lens,
               seq_lens_host, tables, q_lens, logits_indices, decode=None) -> PackedStep:
    on_host = device.type == "cpu"     # then every .to() would be a no-op call

    def moved(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if on_host else tensor.to(device, non_blocking=True)

    meta = AttentionMetadata(
        slot_mapping=moved(slot_mapping), cu_seqlens_q=moved(cu_seqlens_q),
        seq_lens=moved(seq_lens), block_tables=moved(tables), max_seqlen_q=max(q_lens),
        max_seqlen_k=max(max(seq_lens_host), 1), q_lens_host=q_lens, seq_lens_host=seq_lens_host,
        decode_rows=([True] * len(q_lens) if output.num_decode_rows == len(q_lens)
                     else [s.is_decode for s in output.seqs]),
        num_decode_rows=output.num_decode_rows)
    return PackedStep(moved(input_ids), moved(positions), meta, moved(logits_indices), decode)

"""The persistent batch: the per-row state a decode step needs, kept between steps.

Most of a decode step's inputs do not change from one step to the next: a request's block table
grows by one block every `block_size` tokens, its sampling settings never change. Rebuilding
them from Python lists every step costs microseconds per row, which is most of a step once the
model is fast (vLLM v1 keeps the same state in its persistent InputBatch for the same reason).

Here each request owns a row of preallocated arrays while it runs: its block table and its
sampling settings, written when it joins and afterwards only when they change (a block is
appended, copied on write or rolled back). A step then gathers its rows' tables with one
indexing operation and reads their settings without looking at their SamplingParams. The plan
stays the truth, and says what changed by identity: the KV manager never changes a block table
it handed out, it makes a new list (KVManager.block_table), so a row whose plan carries another
list than the one last written is rewritten, and one that carries the same list, most rows of
most steps, costs one `is`. A request whose id came back has a new table, so it never reads
its predecessor's row; rows are reused when the arrays fill up. (vLLM's plan goes one step
further and carries only the new block ids.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minicb.params import SamplingParams

# from this many rows a step computes its rows' slots and lengths as arrays (InputBatch.gather)
ARRAY_ROWS = 128


@dataclass
class DecodeInputs:
    """What a step of decodes reads of its rows, gathered in one pass. A snapshot: nothing here
    aliases the batch's arrays, so the next step's gather (planned while this step runs, under
    overlapped scheduling) can rewrite rows without changing what this step reads."""

    rows: list[int]           # each row's place in the batch's arrays
    block_tables: np.ndarray  # int32 [rows, width]: the rows' tables, copied out of the batch
    tokens: np.ndarray        # int64 [rows]: the one token
    positions: np.ndarray     # int64 [rows]: its position (its request's cached tokens)
    slots: np.ndarray         # int64 [rows]: where its K/V goes: block_table[p // block_size] …
    seq_lens: np.ndarray      # int32 [rows]: the keys each row attends to, position + 1
    seq_lens_host: list[int]  # the same, as Python ints
    width: int                # the longest block table
    all_greedy: bool          # every row takes the argmax of its raw logits
    any_logprobs: bool        # some row asked for logprobs


class InputBatch:
    def __init__(self, max_rows: int, max_blocks: int, block_size: int):
        self.max_rows, self.block_size = max_rows, block_size
        self.block_tables = np.zeros((max_rows, max_blocks), dtype=np.int32)
        # sampling settings the sampler asks of every row each step
        self.greedy = [False] * max_rows
        self.wants_logprobs = [False] * max_rows
        self.row_of: dict[str, int] = {}              # request id → its row
        self._tables: list[list[int] | None] = [None] * max_rows   # each row's table, as written
        self._params: list[SamplingParams | None] = [None] * max_rows

    def gather(self, seqs) -> DecodeInputs:
        """A decode step's rows (minicb.scheduler.base.ScheduledSeq), in one pass: a request new
        to the batch joins (its row written whole), a row whose block table or settings changed
        is written again, and each row's position, token and slot are read off. The numbers
        leave as numpy arrays, which torch takes without a copy: numpy turns a list of ints
        into an array several times faster than torch makes a tensor of it."""
        if len(self.row_of) + len(seqs) > self.max_rows:
            self.row_of.clear()          # full: start afresh; this step's requests join again
        row_of, written, written_params = self.row_of, self._tables, self._params
        greedy, wants_logprobs, block_size = self.greedy, self.wants_logprobs, self.block_size
        rows, tokens, positions, slots, seq_lens = [], [], [], [], []
        width, all_greedy, any_logprobs = 0, True, False
        # a numpy call costs about a microsecond whatever its size, a row of Python arithmetic
        # a fraction of one: the slots and lengths of a few rows are cheaper per row, of many
        # rows cheaper as arrays
        per_row = len(seqs) < ARRAY_ROWS
        for seq in seqs:
            row = row_of.get(seq.req_id)
            if row is None:
                row = row_of[seq.req_id] = len(row_of)
                written[row] = None
            table, position = seq.block_table, seq.start
            if written[row] is not table:        # a changed table is a new list
                self._write_table(row, table)
            if written_params[row] is not seq.params:
                self._write_params(row, seq.params)
            rows.append(row)
            tokens.append(seq.token_ids[0])
            positions.append(position)
            if per_row:
                slots.append(table[position // block_size] * block_size + position % block_size)
                seq_lens.append(position + 1)
            if len(table) > width:
                width = len(table)
            all_greedy = all_greedy and greedy[row]
            any_logprobs = any_logprobs or wants_logprobs[row]
        # (indexing with a list copies: the step's tables, whatever later steps write; one row
        # is sliced and copied, about four times as fast)
        tables = (self.block_tables[rows, :width] if len(rows) != 1
                  else self.block_tables[rows[0]:rows[0] + 1, :width].copy())
        at = np.array(positions, dtype=np.int64)
        if per_row:
            slots_at, seq_lens_at = np.array(slots, dtype=np.int64), np.array(seq_lens, np.int32)
        else:      # the same formulas, over every row at once
            slots_at = (tables[np.arange(len(rows)), at // block_size].astype(np.int64)
                        * block_size + at % block_size)
            seq_lens_at = (at + 1).astype(np.int32)
            seq_lens = seq_lens_at.tolist()
        return DecodeInputs(rows, tables, np.array(tokens, dtype=np.int64), at, slots_at,
                            seq_lens_at, seq_lens, width, all_greedy, any_logprobs)

    def _write_table(self, row: int, table: list[int]) -> None:
        if len(table) > self.block_tables.shape[1]:
            raise ValueError(f"a block table of {len(table)} blocks does not fit the batch's "
                             f"{self.block_tables.shape[1]} per row")
        self.block_tables[row, :len(table)] = table
        self.block_tables[row, len(table):] = 0       # padding, as the packed path pads
        self._tables[row] = table

    def _write_params(self, row: int, params: SamplingParams) -> None:
        # the argmax of the raw logits: greedy, with no penalty, bias or grammar to apply first
        self.greedy[row] = params.greedy and not params.needs_logits_processing
        self.wants_logprobs[row] = params.logprobs is not None
        self._params[row] = params

"""The persistent batch: rows written when a request joins or its table changes, never stale."""

from __future__ import annotations

from types import SimpleNamespace

from minicb.params import SamplingParams
from minicb.runner.input_batch import InputBatch

GREEDY, SAMPLED = SamplingParams(temperature=0), SamplingParams(temperature=0.8, logprobs=2)


def row(req_id: str, start: int, table: list[int], params=GREEDY, token: int = 7):
    return SimpleNamespace(req_id=req_id, start=start, block_table=table, params=params,
                           token_ids=[token])


def tables(batch: InputBatch, inputs) -> list[list[int]]:
    return batch.block_tables[inputs.rows, :inputs.width].tolist()


def test_rows_follow_the_plans_tables_through_appends_copies_and_reused_ids():
    batch = InputBatch(max_rows=4, max_blocks=4, block_size=2)
    first = batch.gather([row("a", 3, [5, 6]), row("b", 0, [9])])
    assert tables(batch, first) == [[5, 6], [9, 0]]           # padded with block 0
    assert first.positions.tolist() == [3, 0] and first.slots.tolist() == [6 * 2 + 1, 9 * 2]
    assert first.all_greedy and not first.any_logprobs
    # a block appended, a block copied on write (same length, another block), a new request
    second = batch.gather([row("a", 4, [5, 6, 2]), row("b", 1, [8]), row("c", 0, [1], SAMPLED)])
    assert tables(batch, second) == [[5, 6, 2], [8, 0, 0], [1, 0, 0]]
    assert second.rows[:2] == first.rows     # the same rows, rewritten
    assert not second.all_greedy and second.any_logprobs
    # "a" left; a new request under its id, with a shorter table, must not read the old row
    third = batch.gather([row("a", 0, [3])])
    assert tables(batch, third) == [[3]] and third.slots.tolist() == [6]


def test_a_full_batch_starts_afresh_and_stays_right():
    batch = InputBatch(max_rows=3, max_blocks=2, block_size=4)
    for step in range(5):            # new ids every step: the rows fill up and are reused
        ids = [f"{step}-{i}" for i in range(2)]
        inputs = batch.gather([row(i, 1, [10 * step + k]) for k, i in enumerate(ids)])
        assert len(batch.row_of) <= 3 and max(inputs.rows) < 3
        assert tables(batch, inputs) == [[10 * step], [10 * step + 1]]


def test_a_gather_is_a_snapshot_the_next_gather_leaves_alone():
    """Overlapped scheduling gathers step n + 1 while step n still reads its own gather: rewriting
    a row (its table, its settings) must not change what step n read."""
    batch = InputBatch(max_rows=4, max_blocks=4, block_size=2)
    first = batch.gather([row("a", 3, [5, 6]), row("b", 0, [9])])
    batch.gather([row("a", 4, [5, 6, 2], SAMPLED), row("b", 1, [8], SAMPLED)])
    assert first.block_tables.tolist() == [[5, 6], [9, 0]]
    assert first.all_greedy and not first.any_logprobs


def test_the_kv_manager_hands_out_a_new_table_whenever_one_changes():
    """The batch rewrites a row only when the plan carries another table object than the one it
    wrote: so a table the KV manager handed out must never change afterwards (it would change
    under a plan already made, and the batch would keep a stale row)."""
    from minicb.kv.paged import PagedKVManager

    kv = PagedKVManager(num_blocks=16, block_size=2)
    parent, child = SimpleNamespace(request_id="p"), SimpleNamespace(request_id="c")
    kv.allocate(parent, 3)
    first = kv.block_table(parent)
    snapshot = list(first)
    kv.allocate(parent, 4)                         # room left: the same table
    assert kv.block_table(parent) is first
    kv.allocate(parent, 5)                         # a block appended: a new table
    grown = kv.block_table(parent)
    assert grown is not first and first == snapshot and len(grown) == 3
    kv.fork(parent, child, 3)                      # shares a partly filled block
    shared = kv.block_table(child)
    kv.allocate(child, 4)                          # copied on write: a new table
    assert kv.block_table(child) is not shared and kv.block_copies
    kv.truncate(parent, 2)                         # rolled back: a new table
    assert kv.block_table(parent) is not grown and len(grown) == 3


def test_few_rows_and_many_rows_pack_the_same_numbers(monkeypatch):
    """A step of many rows computes its slots and lengths as arrays, one of few rows per row: both
    give what the formulas give, row by row, with each array's dtype."""
    import minicb.runner.input_batch as input_batch

    seqs = [row(f"r{i}", 3 * i + 1, [7 * i + k for k in range((3 * i + 1) // 2 + 1 + i % 3)])
            for i in range(40)]
    results = []
    for array_rows in (10_000, 1):             # per row, then as arrays
        monkeypatch.setattr(input_batch, "ARRAY_ROWS", array_rows)
        results.append(InputBatch(max_rows=64, max_blocks=64, block_size=2).gather(seqs))
    for inputs in results:
        assert inputs.slots.tolist() == [s.block_table[s.start // 2] * 2 + s.start % 2
                                         for s in seqs]
        assert inputs.seq_lens.tolist() == inputs.seq_lens_host == [s.start + 1 for s in seqs]
        assert (inputs.slots.dtype, inputs.seq_lens.dtype) == ("int64", "int32")
        assert all(type(n) is int for n in inputs.seq_lens_host)

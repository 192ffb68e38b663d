# Generated from solutions/ch04_block_allocator.py by scripts/make_exercises.py. Replace each
# NotImplementedError with your code, then run `make grade CH=04`.
"""Chapter 04 exercise: the block allocator and the slot mapping behind a paged KV cache.

A paged cache cuts the KV pool into blocks of `block_size` tokens. A request holds a block
table, its blocks in logical order, taken one at a time as it grows from a shared free list and
given back when it finishes or is evicted, so the very next request can reuse them:

    request A  table [3, 0, 7]          pool   0     1     2     3     4     5     6     7
    request B  table [1, 2]                   A:4-7  B:0-3 B:4-  A:0-3              A:8-

Token at position p of a request lives in block table[p // block_size], at offset
p % block_size, that is in slot table[p // block_size] * block_size + p % block_size. The
slot mapping of a step lists the slot of every token the step writes.

Your allocator replaces minicb's own (minicb/kv/blocks.py) inside the real engine: the tests
serve requests through it, evictions included, and the outputs must still equal transformers'.

Grade it: make grade CH=04
"""

from __future__ import annotations


class BlockAllocator:
    """Hands out block ids from a free list; a block returns when its reference count hits 0.

    The interface minicb's PagedKVManager calls:
      num_blocks          the pool's size
      ref_counts          list: ref_counts[b] = how many holders block b has (0 = not in use)
      num_free()          how many blocks the free list holds
      allocate()          take a block from the free list, with reference count 1
      share(block)        one more holder of a live block (prefix caching, parallel samples)
      release(block)      one holder fewer; True when the count reached 0 (the caller then
                          decides whether to push_free it)
      push_free(block)    put an unreferenced block back on the free list

    The free list is a stack: allocate() returns the block pushed last, and a fresh allocator
    hands out 0, 1, 2, ... in that order. Errors are RuntimeErrors that say what went wrong:
    allocate() with no free block, share() or release() of a block whose count is 0.

    >>> allocator = BlockAllocator(4)
    >>> [allocator.allocate() for _ in range(3)], allocator.num_free()
    ([0, 1, 2], 1)
    >>> allocator.share(1); allocator.ref_counts
    [1, 2, 1, 0]
    >>> allocator.release(1), allocator.release(1)
    (False, True)
    >>> allocator.push_free(1); allocator.allocate()
    1
    """

    def __init__(self, num_blocks: int):
        raise NotImplementedError(
            "__init__: num_blocks, ref_counts (all 0), a free list that pops 0, 1, 2, ... first")

    def num_free(self) -> int:
        raise NotImplementedError(
            "num_free: how many blocks sit on the free list")

    def allocate(self) -> int:
        raise NotImplementedError(
            "allocate: pop the free list (RuntimeError when empty); the block's count becomes 1")

    def share(self, block: int) -> None:
        raise NotImplementedError(
            "share: one more reference to a live block (RuntimeError when its count is 0)")

    def release(self, block: int) -> bool:
        raise NotImplementedError(
            "release: one reference fewer (RuntimeError when already 0); True when it reached 0")

    def push_free(self, block: int) -> None:
        raise NotImplementedError(
            "push_free: push the block on the free list, so the next allocate() returns it")


def slot_mapping(block_table: list[int], start: int, num_tokens: int, block_size: int) -> list[int]:
    """The slots of positions start, start + 1, ..., start + num_tokens - 1 of a request.

    Block b holds slots b * block_size ... b * block_size + block_size - 1 of the pool, and a
    request's positions fill its blocks in the order of its block table.

    >>> slot_mapping([3, 0, 7], start=3, num_tokens=3, block_size=4)   # positions 3, 4, 5
    [15, 0, 1]
    """
    raise NotImplementedError(
        "slot_mapping: which block holds position p, at which offset, and where that block starts")

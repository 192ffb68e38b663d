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

from minicb.kv.base import KVManager


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

    The free list is a stack, as minicb's is: allocate() returns the block pushed last, and a
    fresh allocator hands out 0, 1, 2, ... in that order. (vLLM keeps a queue instead, least
    recently freed first, so that cached K/V lives longest; chapter 04 compares the two. Here
    the grader compares your blocks with minicb's, so the order matters.) Errors are
    RuntimeErrors that say what went wrong: allocate() with no free block, share() or release()
    of a block whose count is 0.

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
        # BEGIN SOLUTION: num_blocks, ref_counts (all 0), a free list that pops 0, 1, 2, ... first
        self.num_blocks = num_blocks
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))   # pop() gives 0 first
        self.ref_counts: list[int] = [0] * num_blocks
        # END SOLUTION

    def num_free(self) -> int:
        # BEGIN SOLUTION: how many blocks sit on the free list
        return len(self.free_blocks)
        # END SOLUTION

    def allocate(self) -> int:
        # BEGIN SOLUTION: pop the free list (RuntimeError when empty); the block's count becomes 1
        if not self.free_blocks:
            raise RuntimeError("out of KV blocks: the scheduler should have checked can_allocate "
                               "first.")
        block = self.free_blocks.pop()
        self.ref_counts[block] = 1
        return block
        # END SOLUTION

    def share(self, block: int) -> None:
        # BEGIN SOLUTION: one more reference to a live block (RuntimeError when its count is 0)
        if self.ref_counts[block] < 1:
            raise RuntimeError(f"block {block} is free; only a live block can be shared.")
        self.ref_counts[block] += 1
        # END SOLUTION

    def release(self, block: int) -> bool:
        # BEGIN SOLUTION: one reference fewer (RuntimeError when already 0); True when it reached 0
        if self.ref_counts[block] < 1:
            raise RuntimeError(f"block {block} released more times than it was taken.")
        self.ref_counts[block] -= 1
        return self.ref_counts[block] == 0
        # END SOLUTION

    def push_free(self, block: int) -> None:
        # BEGIN SOLUTION: push the block on the free list, so the next allocate() returns it
        self.free_blocks.append(block)
        # END SOLUTION


def slot_mapping(block_table: list[int], start: int, num_tokens: int, block_size: int) -> list[int]:
    """The slots of positions start, start + 1, ..., start + num_tokens - 1 of a request.

    Block b holds slots b * block_size ... b * block_size + block_size - 1 of the pool, and a
    request's positions fill its blocks in the order of its block table.

    >>> slot_mapping([3, 0, 7], start=3, num_tokens=3, block_size=4)   # positions 3, 4, 5
    [15, 0, 1]
    """
    # BEGIN SOLUTION: which block holds position p, at which offset, and where that block starts
    return [block_table[p // block_size] * block_size + p % block_size
            for p in range(start, start + num_tokens)]
    # END SOLUTION


class PagedManager(KVManager):
    """The paged KV manager: a block table per request, grown on demand, shared by forks.

    minicb's engine calls (prefix caching aside, which chapter 07 adds):
      can_allocate(request, num_tokens)  would room for num_tokens of the request fit now?
      allocate(request, num_tokens)      grow the request's table to hold num_tokens tokens
      free(request)                      give back its blocks (finished, aborted or evicted)
      fork(parent, child, num_tokens)    a parallel sample: the child shares the parent's blocks
                                         holding the first num_tokens tokens (the prompt)
      block_table(request), pop_block_copies()

    Copy-on-write: when num_tokens ends inside a block, that last shared block is partly
    filled, and the child writes its next token there. So fork records the block's index in
    `copy_before_write`; the child's next allocate takes a fresh block, records (shared, fresh)
    in `block_copies` (the runner copies the KV), releases its reference to the shared block and
    puts the fresh one in its table. If by then every other holder let go (reference count 1),
    it writes in place instead.

    >>> from types import SimpleNamespace as Req
    >>> kv = PagedManager(num_blocks=6, block_size=4)
    >>> parent, child = Req(request_id="p"), Req(request_id="c")
    >>> kv.allocate(parent, 6); kv.block_table(parent), kv.num_free_blocks()
    ([0, 1], 4)
    >>> kv.fork(parent, child, 6); kv.allocator.ref_counts[:2]
    6
    [2, 2]
    >>> kv.can_allocate(child, 7), kv.allocate(child, 7), kv.block_table(child)
    (True, None, [0, 2])
    >>> kv.pop_block_copies(), kv.allocator.ref_counts[:3]
    ([(1, 2)], [2, 1, 1])
    >>> kv.free(parent); kv.free(child); kv.num_free_blocks()
    6
    """

    supports_sharing = True

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.allocator = BlockAllocator(num_blocks)
        self.tables: dict[str, list[int]] = {}
        self.copy_before_write: dict[str, int] = {}   # request id → index of a block to copy
        self.block_copies: list[tuple[int, int]] = []  # (source, destination) for the runner

    def num_free_blocks(self) -> int:
        return self.allocator.num_free()

    def block_table(self, request) -> list[int]:
        return self.tables.get(request.request_id, [])

    def num_reserved_slots(self) -> int:
        return sum(len(table) for table in self.tables.values()) * self.block_size

    def pop_block_copies(self) -> list[tuple[int, int]]:
        copies, self.block_copies = self.block_copies, []
        return copies

    def block_to_copy(self, request) -> int | None:
        """The index (in the request's table) of the shared block it must copy before writing:
        its `copy_before_write` entry, unless that block's reference count is back to 1."""
        # BEGIN SOLUTION: the recorded index, unless the request is now the block's only holder
        index = self.copy_before_write.get(request.request_id)
        if index is None or self.allocator.ref_counts[self.tables[request.request_id][index]] == 1:
            return None
        return index
        # END SOLUTION

    def can_allocate(self, request, num_tokens: int, reserve_blocks: int = 0) -> bool:
        """True when the blocks missing for num_tokens (blocks_for(num_tokens) minus the table's
        length, at least 0), plus one if a block must be copied, plus reserve_blocks, are free."""
        # BEGIN SOLUTION: missing blocks + a copy + the reserve, against the free blocks
        have = len(self.tables.get(request.request_id, ()))
        missing = max(self.blocks_for(num_tokens) - have, 0)
        copies = self.block_to_copy(request) is not None
        return missing + copies + reserve_blocks <= self.num_free_blocks()
        # END SOLUTION

    def allocate(self, request, num_tokens: int) -> None:
        """Copy the shared partial block if needed (then forget the copy_before_write entry),
        then append fresh blocks until the table holds blocks_for(num_tokens). The table
        becomes a new list, the old one left as it was: a plan already made holds the old one,
        and minicb's runner, which keeps each row's table between steps, sees a change by the
        list's identity alone (KVManager.block_table)."""
        # BEGIN SOLUTION: a new list: copy-on-write first, then allocate()d blocks up to blocks_for
        table = list(self.tables.get(request.request_id, ()))
        index = self.block_to_copy(request)
        self.copy_before_write.pop(request.request_id, None)
        if index is not None:
            copy = self.allocator.allocate()
            self.block_copies.append((table[index], copy))
            self.allocator.release(table[index])          # still held by the others
            table[index] = copy
        while len(table) < self.blocks_for(num_tokens):
            table.append(self.allocator.allocate())
        self.tables[request.request_id] = table
        # END SOLUTION

    def free(self, request) -> None:
        """Release every block of the request, last first; push_free those nobody holds now."""
        # BEGIN SOLUTION: drop the table and pending copy; release each block, free it at count 0
        self.copy_before_write.pop(request.request_id, None)
        for block in reversed(self.tables.pop(request.request_id, [])):
            if self.allocator.release(block):
                self.allocator.push_free(block)
        # END SOLUTION

    def fork(self, parent, child, num_tokens: int) -> int:
        """The child's table: the parent's first blocks_for(num_tokens) blocks, each shared;
        mark the last one for copy-on-write if num_tokens ends inside it. Return num_tokens."""
        # BEGIN SOLUTION: share the prompt's blocks; a partly filled last one is copied on write
        shared = self.tables[parent.request_id][:self.blocks_for(num_tokens)]
        for block in shared:
            self.allocator.share(block)
        self.tables[child.request_id] = list(shared)
        if num_tokens % self.block_size:
            self.copy_before_write[child.request_id] = num_tokens // self.block_size
        return num_tokens
        # END SOLUTION

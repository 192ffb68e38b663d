"""The free list and reference counts behind the paged cache."""

from __future__ import annotations


class BlockAllocator:
    """Hands out block ids from a free list; a block returns when its reference count hits 0.

    The free list is a stack: the blocks freed last are handed out first, so a finished
    request's blocks are reused by the very next request that needs any (the book's picture).
    Reference counts let several requests share one block (prefix caching, parallel samples).
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives 0, 1, 2...
        self.ref_counts: list[int] = [0] * num_blocks

    def num_free(self) -> int:
        return len(self.free_blocks)

    def allocate(self) -> int:
        if not self.free_blocks:
            raise RuntimeError("out of KV blocks: the scheduler should have checked can_allocate "
                               "first.")
        block = self.free_blocks.pop()
        self.ref_counts[block] = 1
        return block

    def share(self, block: int) -> None:
        if self.ref_counts[block] < 1:
            raise RuntimeError(f"block {block} is free; only a live block can be shared.")
        self.ref_counts[block] += 1

    def release(self, block: int) -> bool:
        """Drop one reference; return True when the block became unreferenced."""
        if self.ref_counts[block] < 1:
            raise RuntimeError(f"block {block} released more times than it was taken.")
        self.ref_counts[block] -= 1
        return self.ref_counts[block] == 0

    def push_free(self, block: int) -> None:
        self.free_blocks.append(block)

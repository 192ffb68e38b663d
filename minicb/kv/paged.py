"""Paged KV (vLLM's PagedAttention): blocks come one at a time, as a sequence grows."""

from __future__ import annotations

from minicb.kv.base import KVManager
from minicb.kv.blocks import BlockAllocator


class PagedKVManager(KVManager):
    """A block table per request: logical block i of the request → a physical block anywhere.

    Waste is at most one partly filled block per request (block_size - 1 slots), instead of the
    whole unused tail of a max_model_len reservation.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        super().__init__(num_blocks, block_size)
        self.allocator = BlockAllocator(num_blocks)
        self.tables: dict[str, list[int]] = {}
        self.enable_prefix_caching = enable_prefix_caching

    def num_free_blocks(self) -> int:
        return self.allocator.num_free()

    def _missing_blocks(self, request, num_tokens: int) -> int:
        have = len(self.tables.get(request.request_id, ()))
        return max(self.blocks_for(num_tokens) - have, 0)

    def can_allocate(self, request, num_tokens: int, reserve_blocks: int = 0) -> bool:
        return self._missing_blocks(request, num_tokens) + reserve_blocks <= self.allocator.num_free()

    def allocate(self, request, num_tokens: int) -> None:
        table = self.tables.setdefault(request.request_id, [])
        for _ in range(self._missing_blocks(request, num_tokens)):
            table.append(self.allocator.allocate())

    def free(self, request) -> None:
        # reversed, so the stack hands the blocks out again in the request's own order
        for block in reversed(self.tables.pop(request.request_id, [])):
            if self.allocator.release(block):
                self.allocator.push_free(block)

    def block_table(self, request) -> list[int]:
        return self.tables.get(request.request_id, [])

    def num_reserved_slots(self) -> int:
        return sum(len(t) for t in self.tables.values()) * self.block_size

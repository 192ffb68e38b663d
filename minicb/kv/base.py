"""The interface both KV managers share."""

from __future__ import annotations

from abc import ABC, abstractmethod


class KVManager(ABC):
    """Maps each request to physical blocks of the pool.

    Capacities are absolute: `allocate(request, num_tokens)` makes sure the request can hold
    `num_tokens` tokens in total (what is cached plus what this step writes).
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @abstractmethod
    def can_allocate(self, request, num_tokens: int, reserve_blocks: int = 0) -> bool:
        """Could `request` hold `num_tokens` tokens and still leave `reserve_blocks` free?"""

    @abstractmethod
    def allocate(self, request, num_tokens: int) -> None: ...

    @abstractmethod
    def free(self, request) -> None: ...

    @abstractmethod
    def block_table(self, request) -> list[int]: ...

    @abstractmethod
    def num_reserved_slots(self) -> int:
        """Slots held by live requests (whether or not a token sits in them yet)."""

    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks()

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a request of this many tokens fits in the whole, empty pool."""
        return self.blocks_for(num_tokens) <= self.num_blocks

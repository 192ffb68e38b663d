"""The interface both KV managers share."""

from __future__ import annotations

from abc import ABC, abstractmethod

from minicb.config import blocks_for
from minicb.kv.prefix import PrefixCacheStats


class KVManager(ABC):
    """Maps each request to physical blocks of the pool.

    Capacities are absolute: `allocate(request, num_tokens)` makes sure the request can hold
    `num_tokens` tokens in total (what is cached plus what this step writes).

    The hooks at the end (prefix caching, forking parallel samples, copy-on-write) do nothing
    here: a manager that cannot share blocks computes every token of every request.
    """

    supports_sharing = False   # whether requests can share blocks (forked samples, cached prefixes)

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @abstractmethod
    def can_allocate(self, request, num_tokens: int, reserve_blocks: int = 0) -> bool:
        """Could `request` hold `num_tokens` tokens and still leave `reserve_blocks` free?"""

    @abstractmethod
    def allocate(self, request, num_tokens: int) -> None: ...

    def table_with_room(self, request, num_tokens: int) -> list[int] | None:
        """The request's block table if it already holds room for `num_tokens` tokens, so that
        `allocate` would change nothing (no block to add, none to copy): most decode steps. The
        scheduler plans such a row without asking the allocator anything else. None: ask."""
        return None

    @abstractmethod
    def free(self, request) -> None: ...

    @abstractmethod
    def block_table(self, request) -> list[int]:
        """The request's blocks in order. Never changed once returned: a table that changes is
        a new list, so a plan holds its rows' tables by reference as snapshots, and the runner's
        persistent batch sees that a row changed by identity alone (minicb.runner.input_batch)."""

    @abstractmethod
    def num_reserved_slots(self) -> int:
        """Slots held by live requests (whether or not a token sits in them yet)."""

    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks()

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a request of this many tokens fits in the whole, empty pool."""
        return self.blocks_for(num_tokens) <= self.num_blocks

    # --- sharing hooks (no-ops unless the manager shares blocks) ----------------------------------
    def claim_cached_prefix(self, request) -> int:
        """Give a request about to be admitted the cached blocks of its longest cached prefix;
        return how many tokens they hold (it computes only the rest). Undo with `free`."""
        return 0

    def fork(self, parent, child, num_tokens: int) -> int:
        """Let `child` share the blocks holding `parent`'s first `num_tokens` tokens; return how
        many tokens it now has computed."""
        return 0

    def cache_full_blocks(  # noqa: B027 (a hook: doing nothing is right)
            self, request, num_tokens: int | None = None) -> None:
        """After a step: offer the request's newly computed full blocks to the prefix cache (those
        among its first `num_tokens` tokens; default: its computed ones)."""

    def truncate(self, request, num_tokens: int) -> None:  # noqa: B027 (a hook)
        """Keep only the blocks holding the request's first `num_tokens` tokens (speculative
        decoding's rollback of rejected positions); a reservation keeps its slots."""

    def pop_block_copies(self) -> list[tuple[int, int]]:
        """(source, destination) blocks whose KV the runner must copy before this step's forward."""
        return []

    def prefix_stats(self) -> PrefixCacheStats:
        """Prefix-cache counters: queries, queried and hit tokens, hit rate, evictions."""
        return PrefixCacheStats()

"""Paged KV (vLLM's PagedAttention): blocks come one at a time, as a sequence grows."""

from __future__ import annotations

from dataclasses import replace

from minicb.kv.base import KVManager
from minicb.kv.blocks import BlockAllocator
from minicb.kv.prefix import CachedBlock, PrefixCache, PrefixCacheStats


class PagedKVManager(KVManager):
    """A block table per request: logical block i of the request → a physical block anywhere.

    Waste is at most one partly filled block per request (block_size - 1 slots), instead of the
    whole unused tail of a max_model_len reservation.

    Blocks can be shared, a reference count per block keeping them alive:
    - prefix caching (`enable_prefix_caching`): a new request starts from the cached full
      blocks of its longest cached prefix; blocks no one holds stay cached until needed;
    - parallel samples: a sample forks its first sample's prompt blocks. The last of them may be
      partly filled, and the sample writes its next token there: that first write copies the
      block (copy-on-write), so the other holders' KV never changes under them.
    """

    supports_sharing = True

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 max_model_len: int | None = None):
        super().__init__(num_blocks, block_size)    # (blocks come on demand: no length needed)
        self.allocator = BlockAllocator(num_blocks)
        self.tables: dict[str, list[int]] = {}
        self.enable_prefix_caching = enable_prefix_caching
        self.cache = PrefixCache(block_size) if enable_prefix_caching else None
        # per request: the cache entry standing for each of its full computed blocks, in order
        # (None after a hash collision: nothing past it can be cached)
        self.chains: dict[str, list[CachedBlock | None]] = {}
        # a claimed prefix is counted in the stats once the request is really admitted
        self.claims: dict[str, tuple[int, int]] = {}
        # request id → index of a block it shares, partly filled, and will write into next
        self.copy_before_write: dict[str, int] = {}
        self.block_copies: list[tuple[int, int]] = []

    def num_free_blocks(self) -> int:
        """Blocks a request could get now: the free list plus cached blocks no one holds."""
        evictable = len(self.cache.evictable) if self.cache else 0
        return self.allocator.num_free() + evictable

    def _missing_blocks(self, request, num_tokens: int) -> int:
        have = len(self.tables.get(request.request_id, ()))
        return max(-(-num_tokens // self.block_size) - have, 0)

    def _shared_block_to_copy(self, request) -> int | None:
        """Index of the shared, partly filled block this request must copy before writing."""
        index = self.copy_before_write.get(request.request_id)
        if index is None or self.allocator.ref_counts[self.tables[request.request_id][index]] == 1:
            return None   # the others let go of it meanwhile: write in place
        return index

    def can_allocate(self, request, num_tokens: int, reserve_blocks: int = 0) -> bool:
        missing = self._missing_blocks(request, num_tokens)
        if not (missing or reserve_blocks or request.request_id in self.copy_before_write):
            return True          # most decode steps: the last block still has room
        copies = self._shared_block_to_copy(request) is not None
        return missing + copies + reserve_blocks <= self.num_free_blocks()

    def table_with_room(self, request, num_tokens: int) -> list[int] | None:
        request_id = request.request_id
        table = self.tables.get(request_id)
        if (table is None or len(table) * self.block_size < num_tokens
                or request_id in self.copy_before_write or request_id in self.claims):
            return None
        return table

    def allocate(self, request, num_tokens: int) -> None:
        if self.table_with_room(request, num_tokens) is not None:
            return               # most decode steps: nothing to allocate, nothing to copy
        request_id = request.request_id
        # a new list, never the old one changed: plans already made hold the old one
        # (KVManager.block_table)
        table = list(self.tables.get(request_id, ()))
        index = self._shared_block_to_copy(request)
        missing = self._missing_blocks(request, num_tokens)
        self.copy_before_write.pop(request.request_id, None)
        if index is not None:
            copy = self._new_block()
            self.block_copies.append((table[index], copy))
            self.allocator.release(table[index])      # still held by the others
            table[index] = copy
        for _ in range(missing):
            table.append(self._new_block())
        self.tables[request_id] = table
        if request.request_id in self.claims:     # admitted: now its lookup counts
            self.cache.record_query(*self.claims.pop(request.request_id))

    def _new_block(self) -> int:
        if self.allocator.num_free() == 0 and self.cache is not None:
            self.allocator.push_free(self.cache.evict())
        return self.allocator.allocate()

    def free(self, request) -> None:
        request_id = request.request_id
        self.chains.pop(request_id, None)
        self.claims.pop(request_id, None)
        self.copy_before_write.pop(request_id, None)
        # reversed: the stack hands the blocks out again in the request's own order, and a
        # cached prompt's tail is parked first, so it is evicted before the prefix it extends
        for block in reversed(self.tables.pop(request_id, [])):
            if self.allocator.release(block) and not (self.cache and self.cache.park(block)):
                self.allocator.push_free(block)

    def block_table(self, request) -> list[int]:
        return self.tables.get(request.request_id, [])

    def truncate(self, request, num_tokens: int) -> None:
        """Roll back: free, last first, every block past the first `num_tokens` tokens. The slots
        past `num_tokens` in the last kept block are written again by the next step. Blocks past
        the request's computed tokens were never offered to the prefix cache, so none is cached."""
        table = self.tables.get(request.request_id)
        if table is None:
            return
        keep = self.blocks_for(num_tokens)
        if len(table) <= keep:
            return
        self.tables[request.request_id] = table[:keep]      # a new list (KVManager.block_table)
        for block in reversed(table[keep:]):
            if self.allocator.release(block) and not (self.cache and self.cache.park(block)):
                self.allocator.push_free(block)

    def num_reserved_slots(self) -> int:
        return sum(map(len, self.tables.values())) * self.block_size

    # --- sharing -------------------------------------------------------------------------------
    def claim_cached_prefix(self, request) -> int:
        if self.cache is None:
            return 0
        tokens = request.all_token_ids
        # at least the last token is computed again: its logits give the next token
        chain = self.cache.match(tokens, (len(tokens) - 1) // self.block_size)
        for entry in chain:
            self._hold(entry.block)
        self.tables[request.request_id] = [entry.block for entry in chain]
        self.chains[request.request_id] = list(chain)
        num_cached = len(chain) * self.block_size
        self.claims[request.request_id] = (len(tokens), num_cached)
        return num_cached

    def _hold(self, block: int) -> None:
        """Take a reference to a cached block, reviving it if no one held it."""
        if self.allocator.ref_counts[block] == 0:
            # an evictable block is on no free list, so giving it a count takes it back whole
            self.cache.unpark(block)
            self.allocator.ref_counts[block] = 1
        else:
            self.allocator.share(block)

    def fork(self, parent, child, num_tokens: int) -> int:
        shared = self.tables[parent.request_id][:self.blocks_for(num_tokens)]
        for block in shared:
            self.allocator.share(block)
        self.tables[child.request_id] = list(shared)
        if parent.request_id in self.chains:
            self.chains[child.request_id] = self.chains[parent.request_id][
                :num_tokens // self.block_size]
        if num_tokens % self.block_size:
            # the child writes its next token into the last shared block, which is partly filled.
            # The parent never writes there first: the child's first step comes right after the
            # fork.
            self.copy_before_write[child.request_id] = num_tokens // self.block_size
        return num_tokens

    def cache_full_blocks(self, request, num_tokens: int | None = None) -> None:
        if self.cache is None:
            return
        chain = self.chains.setdefault(request.request_id, [])
        num_full = (request.num_computed_tokens if num_tokens is None else num_tokens) \
            // self.block_size
        if len(chain) >= num_full or (chain and chain[-1] is None):
            return
        size, table = self.block_size, self.tables[request.request_id]
        for index in range(len(chain), num_full):
            entry = self.cache.insert(chain[-1] if chain else None,
                                      tuple(request.token_ids(index * size, (index + 1) * size)),
                                      table[index])
            chain.append(entry)
            if entry is None:
                break

    def pop_block_copies(self) -> list[tuple[int, int]]:
        copies, self.block_copies = self.block_copies, []
        return copies

    def prefix_stats(self) -> PrefixCacheStats:
        if self.cache is None:
            return PrefixCacheStats()
        return replace(self.cache.stats, cached_blocks=len(self.cache.by_block))

"""Prefix caching: reuse the KV of full blocks that an earlier request already computed.

A full block's KV depends on its own tokens AND on every token before it, so a block is named by
a hash chained over its parent block's hash and its own token ids (as in vLLM). Two prompts that
share their first k blocks' tokens get the same k hashes, and the second request can point its
block table at the first one's blocks instead of computing them again.

A hash can collide, so a hit is accepted only when the cached block's own token ids AND its parent
entry are the ones asked for: by induction the whole prefix then matches, and a collision can
only cost a miss, never return KV of other tokens.

Blocks whose reference count drops to zero stay here, still holding their KV, until the free list
runs dry; then the least recently used one is evicted (its hash forgotten, the block handed out).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """The name of a full block: its tokens, chained onto the name of the block before it.

    Python's hash of a tuple of ints is deterministic (no per-process salt), which is all a
    cache that lives inside one process needs.
    """
    return hash((parent_hash, token_ids))


@dataclass(eq=False)
class CachedBlock:
    """One cache entry: physical `block` holds the KV of `token_ids`, right after `parent`'s."""

    block: int
    hash: int
    token_ids: tuple[int, ...]
    parent: CachedBlock | None   # the entry of the previous block; None for a prompt's first block


@dataclass
class PrefixCacheStats:
    """Counters since the engine started (`engine.kv.prefix_stats()`)."""

    queries: int = 0          # admissions that looked up their prefix
    queried_tokens: int = 0   # tokens those requests had
    hit_tokens: int = 0       # tokens served from the cache instead of computed
    evictions: int = 0        # cached blocks given up to make room
    cached_blocks: int = 0    # blocks holding reusable KV right now (in use or evictable)

    @property
    def hit_rate(self) -> float:
        """Share of the queried tokens that came from the cache."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class PrefixCache:
    """Hash → entry for every cached full block, and the evictable ones in LRU order."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.by_hash: dict[int, CachedBlock] = {}
        self.by_block: dict[int, CachedBlock] = {}
        # cached blocks no request holds, least recently used first: the first to be evicted
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.stats = PrefixCacheStats()

    def lookup(self, parent: CachedBlock | None, token_ids: tuple[int, ...]) -> CachedBlock | None:
        """The entry holding exactly `token_ids` right after `parent`, or None."""
        entry = self.by_hash.get(hash_block(parent.hash if parent else None, token_ids))
        if entry is None or entry.parent is not parent or entry.token_ids != token_ids:
            return None     # a miss, or a collision with other tokens: never a wrong hit
        return entry

    def match(self, token_ids: Sequence[int], max_blocks: int) -> list[CachedBlock]:
        """The longest run of cached blocks that starts the sequence, at most `max_blocks`."""
        size, chain = self.block_size, []
        for index in range(max_blocks):
            tokens = tuple(token_ids[index * size:(index + 1) * size])
            entry = self.lookup(chain[-1] if chain else None, tokens)
            if entry is None:
                break
            chain.append(entry)
        return chain

    def record_query(self, queried_tokens: int, hit_tokens: int) -> None:
        stats = self.stats
        stats.queries += 1
        stats.queried_tokens += queried_tokens
        stats.hit_tokens += hit_tokens

    def insert(self, parent: CachedBlock | None, token_ids: tuple[int, ...],
               block: int) -> CachedBlock | None:
        """Cache `block` as holding `token_ids` after `parent`.

        Returns the entry that now stands for this prefix: a new one, or the existing one when
        another block already caches the same tokens (this block then stays uncached). None when
        the hash is taken by other tokens: the prefix cannot be cached past this block.
        """
        key = hash_block(parent.hash if parent else None, token_ids)
        existing = self.by_hash.get(key)
        if existing is not None:
            return (existing if existing.parent is parent and existing.token_ids == token_ids
                    else None)
        entry = CachedBlock(block, key, token_ids, parent)
        self.by_hash[key] = entry
        self.by_block[block] = entry
        return entry

    # --- blocks no request holds ---------------------------------------------------------------
    def park(self, block: int) -> bool:
        """Keep a cached block whose last reference went; False if the block is not cached."""
        if block not in self.by_block:
            return False
        self.evictable[block] = None      # most recently used: evicted last
        return True

    def unpark(self, block: int) -> None:
        """A request takes an evictable block back: it leaves the eviction order."""
        del self.evictable[block]

    def evict(self) -> int:
        """Forget the least recently used evictable block and return it, ready to be reused."""
        block, _ = self.evictable.popitem(last=False)
        entry = self.by_block.pop(block)
        del self.by_hash[entry.hash]
        self.stats.evictions += 1
        return block

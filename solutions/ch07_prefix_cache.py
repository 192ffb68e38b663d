"""Chapter 07 exercise: the prefix cache: chained block hashing and least-recently-used eviction.

Many requests start alike (a system prompt, a few-shot preamble, a chat history). A full KV block
depends on its own tokens AND on every token before it, so a block is named by a hash chained
over its parent block's hash and its own token ids:

    prompt  [5 6 7 8 | 1 2 3 4 | 9 9]      block_size 4: two full blocks, a partial one
    name    h1 = hash_block(None, (5, 6, 7, 8))
            h2 = hash_block(h1,   (1, 2, 3, 4))      the same tokens after other tokens: not h2

A later request whose first blocks have the same names points its block table at the cached
blocks instead of computing them. A hash can collide, so a hit counts only when the entry's own
tokens AND its parent entry are the ones asked for; a collision then costs a miss, never wrong KV.

A cached block that no request holds any more keeps its KV ("parked", evictable) until the free
list runs dry; then the least recently parked one is evicted: its entry forgotten, the block
handed out again.

Your PrefixCache replaces minicb's (minicb/kv/prefix.py) inside the paged KV manager: the tests
run random operations side by side with minicb's, then serve requests that share prefixes
through the real engine with a pool small enough to evict, and the outputs must still equal
transformers'.

Grade it: make grade CH=07
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from minicb.kv.prefix import CachedBlock, PrefixCacheStats


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """The name of a full block: its tokens chained onto its parent's name (None for the first).

    Use Python's hash of a tuple (deterministic for ints). The same tokens after different
    parents must get different names; the same (parent, tokens) always the same name.

    >>> hash_block(None, (1, 2)) == hash_block(None, (1, 2))
    True
    >>> hash_block(hash_block(None, (9, 9)), (1, 2)) == hash_block(None, (1, 2))
    False
    """
    # BEGIN SOLUTION: hash the pair (parent's hash, the block's token ids)
    return hash((parent_hash, token_ids))
    # END SOLUTION


class PrefixCache:
    """Hash → entry for every cached full block, and the evictable ones in LRU order.

    The interface minicb's PagedKVManager calls:
      by_hash     dict: hash → CachedBlock (every cached block, held or evictable)
      by_block    dict: physical block id → its CachedBlock
      evictable   OrderedDict of block id → None: cached blocks no request holds, least recently
                  parked first
      stats       PrefixCacheStats (record_query is given; evict counts stats.evictions)

    A worked example (block_size 2):

    >>> cache = PrefixCache(block_size=2)
    >>> first = cache.insert(None, (5, 6), block=3)
    >>> second = cache.insert(first, (7, 8), block=0)
    >>> [entry.block for entry in cache.match([5, 6, 7, 8, 9], max_blocks=2)]
    [3, 0]
    >>> [entry.block for entry in cache.match([7, 8, 5, 6], max_blocks=2)]
    []
    >>> cache.park(0), cache.park(3), cache.park(1)
    (True, True, False)
    >>> cache.unpark(0); cache.park(0)
    True
    >>> cache.evict(), cache.evict(), len(cache.by_hash), cache.stats.evictions
    (3, 0, 0, 2)
    """

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.by_hash: dict[int, CachedBlock] = {}
        self.by_block: dict[int, CachedBlock] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.stats = PrefixCacheStats()

    def lookup(self, parent: CachedBlock | None, token_ids: tuple[int, ...]) -> CachedBlock | None:
        """The entry holding exactly `token_ids` right after `parent`, or None.

        Look up hash_block(parent's hash or None, token_ids); accept the entry only when its
        `parent` IS `parent` and its `token_ids` equal `token_ids` (a collision is a miss).
        """
        # BEGIN SOLUTION: find the chained hash; a hit needs the same parent entry and same tokens
        entry = self.by_hash.get(hash_block(parent.hash if parent else None, token_ids))
        if entry is None or entry.parent is not parent or entry.token_ids != token_ids:
            return None
        return entry
        # END SOLUTION

    def match(self, token_ids: Sequence[int], max_blocks: int) -> list[CachedBlock]:
        """The longest run of cached blocks that starts the sequence, at most `max_blocks` long.

        Block i holds token_ids[i * block_size:(i + 1) * block_size] (as a tuple); look each up
        after the previous entry found, and stop at the first miss.
        """
        # BEGIN SOLUTION: walk the full blocks from the start, chaining lookups, stop at a miss
        size, chain = self.block_size, []
        for index in range(max_blocks):
            tokens = tuple(token_ids[index * size:(index + 1) * size])
            entry = self.lookup(chain[-1] if chain else None, tokens)
            if entry is None:
                break
            chain.append(entry)
        return chain
        # END SOLUTION

    def record_query(self, queried_tokens: int, hit_tokens: int) -> None:
        stats = self.stats
        stats.queries += 1
        stats.queried_tokens += queried_tokens
        stats.hit_tokens += hit_tokens

    def insert(self, parent: CachedBlock | None, token_ids: tuple[int, ...],
               block: int) -> CachedBlock | None:
        """Cache `block` as holding `token_ids` after `parent`; return the entry for this prefix.

        If the hash is new: a new CachedBlock(block, hash, token_ids, parent) in by_hash and
        by_block. If an entry with this hash exists: return it when it holds the same parent and
        tokens (this block then stays uncached), else None (a collision: the prefix cannot be
        cached past here).
        """
        # BEGIN SOLUTION: a new entry for a new hash; the existing one if it matches; None if not
        key = hash_block(parent.hash if parent else None, token_ids)
        existing = self.by_hash.get(key)
        if existing is not None:
            return (existing if existing.parent is parent and existing.token_ids == token_ids
                    else None)
        entry = CachedBlock(block, key, token_ids, parent)
        self.by_hash[key] = entry
        self.by_block[block] = entry
        return entry
        # END SOLUTION

    def park(self, block: int) -> bool:
        """Keep a cached block whose last reference went: it becomes the most recently used
        evictable block. Return False (and keep nothing) if the block is not cached."""
        # BEGIN SOLUTION: only a cached block parks; it goes to the end of the eviction order
        if block not in self.by_block:
            return False
        self.evictable[block] = None
        return True
        # END SOLUTION

    def unpark(self, block: int) -> None:
        """A request takes an evictable block back: it leaves the eviction order."""
        # BEGIN SOLUTION: remove the block from the evictable blocks
        del self.evictable[block]
        # END SOLUTION

    def evict(self) -> int:
        """Forget the least recently parked block (its entry leaves by_block and by_hash), count
        it in stats.evictions, and return its id, ready to be reused."""
        # BEGIN SOLUTION: pop the oldest evictable block, drop its entry, count the eviction
        block, _ = self.evictable.popitem(last=False)
        entry = self.by_block.pop(block)
        del self.by_hash[entry.hash]
        self.stats.evictions += 1
        return block
        # END SOLUTION

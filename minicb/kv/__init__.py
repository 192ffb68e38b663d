"""KV-cache managers: who owns which block of the one KV pool.

They own no tensors: the pool itself (one [num_blocks, block_size, kv_heads, head_dim] pair per
layer) lives in the model runner. A manager only decides which blocks each request may write,
so the same managers drive the real engine and the model-free cost-model runner.
"""

from minicb.kv.base import KVManager
from minicb.kv.blocks import BlockAllocator
from minicb.kv.contiguous import ContiguousKVManager
from minicb.kv.paged import PagedKVManager


def make_kv_manager(kind: str, num_blocks: int, block_size: int, max_model_len: int,
                    enable_prefix_caching: bool = False) -> KVManager:
    if kind == "paged":
        return PagedKVManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
    if kind == "contiguous":
        return ContiguousKVManager(num_blocks, block_size, max_model_len)
    raise ValueError(f"kv_cache={kind!r} is not 'contiguous' or 'paged'.")


__all__ = ["KVManager", "BlockAllocator", "ContiguousKVManager", "PagedKVManager",
           "make_kv_manager"]

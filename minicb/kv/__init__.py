"""KV-cache managers: who owns which block of the one KV pool.

They own no tensors: the pool itself (one [num_blocks, block_size, kv_heads, head_dim] pair per
layer) lives in the model runner. A manager only decides which blocks each request may write,
so the same managers drive the real engine and the model-free cost-model runner.
"""

from minicb.kv.base import KVManager
from minicb.kv.blocks import BlockAllocator
from minicb.kv.contiguous import ContiguousKVManager
from minicb.kv.paged import PagedKVManager
from minicb.registry import KV_CACHES


def make_kv_manager(kind: str, num_blocks: int, block_size: int, max_model_len: int,
                    enable_prefix_caching: bool = False) -> KVManager:
    """The KV manager the registry has as `kind` (every manager takes the same arguments)."""
    return KV_CACHES.get_part(kind)(num_blocks, block_size, max_model_len=max_model_len,
                                    enable_prefix_caching=enable_prefix_caching)


__all__ = ["KVManager", "BlockAllocator", "ContiguousKVManager", "PagedKVManager",
           "make_kv_manager"]

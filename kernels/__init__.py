"""Triton kernels for the paged KV cache, installed as ``minicb.kernels``.

- :func:`write_kv` scatters this step's K/V into the cache through ``slot_mapping``.
- :func:`paged_attention` attends a packed batch of prefill chunks and decodes over the cache,
  splitting long decodes across programs (:func:`choose_num_splits`) and merging the splits.

Each kernel has a plain-torch twin (``*_reference``) that the tests hold it to.
"""

from ._compat import patch_interpreter_index
from .kv_write import write_kv, write_kv_reference
from .paged_attention import paged_attention, paged_attention_reference
from .split_kv import choose_num_splits

patch_interpreter_index()  # Triton < 3.8 interpreter with NumPy >= 2.4; a no-op elsewhere

__all__ = [
    "choose_num_splits",
    "paged_attention",
    "paged_attention_reference",
    "write_kv",
    "write_kv_reference",
]

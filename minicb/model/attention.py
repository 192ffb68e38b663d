"""Attention over the paged KV cache for a packed batch (see docs/ARCHITECTURE.md).

Two backends with one signature: "torch" (the readable reference, gather + SDPA) and "triton"
(minicb.kernels). Both first write this step's K/V into the cache through `slot_mapping`, then
let every query attend to its request's cached keys through the block table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """The tensors of a packed batch that attention needs (all on the model's device)."""

    slot_mapping: torch.Tensor      # int64 [num_tokens], -1 = padding (not written)
    cu_seqlens_q: torch.Tensor      # int32 [num_seqs + 1]
    seq_lens: torch.Tensor          # int32 [num_seqs]
    block_tables: torch.Tensor      # int32 [num_seqs, max_blocks]
    max_seqlen_q: int
    max_seqlen_k: int


def write_kv_torch(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Scatter K/V [num_tokens, kv_heads, head_dim] into the cache; slot -1 is skipped."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    real = slot_mapping >= 0
    slots = slot_mapping[real]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k[real])
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v[real])


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Gather each request's keys through its block table into a padded tensor and run SDPA.

    q: [num_tokens, q_heads, head_dim] → [num_tokens, q_heads, head_dim].
    """
    device = q.device
    num_seqs = meta.seq_lens.shape[0]
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    starts = meta.cu_seqlens_q[:-1].long()
    q_lens = meta.cu_seqlens_q[1:].long() - starts
    seq_lens = meta.seq_lens.long()

    # queries, padded to [num_seqs, max_q]
    query_offsets = torch.arange(meta.max_seqlen_q, device=device)
    query_valid = query_offsets[None, :] < q_lens[:, None]
    query_rows = (starts[:, None] + query_offsets[None, :]).clamp(max=q.shape[0] - 1)
    q_padded = q[query_rows]                                       # [S, Mq, Hq, D]

    # keys: logical position j → block_tables[s, j // block_size] * block_size + j % block_size
    key_positions = torch.arange(meta.max_seqlen_k, device=device)
    block_index = (key_positions // block_size).clamp(max=meta.block_tables.shape[1] - 1)
    blocks = meta.block_tables.long()[:, block_index]             # [S, Mk]
    slots = blocks * block_size + key_positions % block_size
    k_padded = k_cache.view(-1, num_kv_heads, head_dim)[slots]    # [S, Mk, Hkv, D]
    v_padded = v_cache.view(-1, num_kv_heads, head_dim)[slots]

    # query j of a segment sits at max(seq_len - q_len + j, 0) and sees keys up to there
    query_positions = (seq_lens[:, None] - q_lens[:, None] + query_offsets[None, :]).clamp(min=0)
    mask = (key_positions[None, None, :] <= query_positions[:, :, None]) & \
           (key_positions[None, None, :] < seq_lens[:, None, None])   # [S, Mq, Mk]
    out = F.scaled_dot_product_attention(
        q_padded.transpose(1, 2), k_padded.transpose(1, 2), v_padded.transpose(1, 2),
        attn_mask=mask[:, None], scale=scale, enable_gqa=q.shape[1] != num_kv_heads)
    del num_seqs
    return out.transpose(1, 2)[query_valid]                       # packed order: seq-major


class Attention:
    """Picks the backend once; called by every layer with its own cache tensors."""

    def __init__(self, backend: str):
        if backend == "triton":
            from minicb import kernels  # imported lazily: only this backend needs Triton

            self._write = kernels.write_kv
            self._attend = lambda q, kc, vc, m, scale: kernels.paged_attention(
                q, kc, vc, m.cu_seqlens_q, m.seq_lens, m.block_tables, scale, m.max_seqlen_q, m.max_seqlen_k)
        elif backend == "torch":
            self._write = write_kv_torch
            self._attend = paged_attention_torch
        else:
            raise ValueError(f"attention={backend!r} is not 'torch' or 'triton'.")
        self.backend = backend

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        self._write(k, v, k_cache, v_cache, meta.slot_mapping)
        return self._attend(q, k_cache, v_cache, meta, scale)

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
    q_lens_host: list[int] | None = None    # the same lengths as Python ints (shapes are decided on
    seq_lens_host: list[int] | None = None  # the host); derived from the tensors when not given

    def __post_init__(self) -> None:
        if self.q_lens_host is None:
            self.q_lens_host = (self.cu_seqlens_q[1:] - self.cu_seqlens_q[:-1]).tolist()
        if self.seq_lens_host is None:
            self.seq_lens_host = self.seq_lens.tolist()


def write_kv_torch(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Scatter K/V [num_tokens, kv_heads, head_dim] into the cache; slot -1 is skipped."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    real = slot_mapping >= 0
    slots = slot_mapping[real]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k[real])
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v[real])


def gather_keys(cache: torch.Tensor, block_tables: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[num_blocks, block_size, H, D] cache → [rows, num_keys, H, D] keys in logical order.

    Logical position j of a row lives at block_tables[row, j // block_size], offset j % block_size.
    """
    block_size = cache.shape[1]
    positions = torch.arange(num_keys, device=cache.device)
    blocks = block_tables.long()[:, (positions // block_size).clamp(max=block_tables.shape[1] - 1)]
    return cache.flatten(0, 1)[blocks * block_size + positions % block_size]


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """The reference: gather keys through the block tables, then scaled_dot_product_attention.

    Decodes (one query each) run as one padded batch; each prefill chunk runs on its own, so a
    long chunk never pads every decode row to its length. q: [num_tokens, q_heads, head_dim].
    """
    out = torch.empty_like(q)
    gqa = q.shape[1] != k_cache.shape[2]
    q_lens, seq_lens = meta.q_lens_host, meta.seq_lens_host
    decodes = [i for i, n in enumerate(q_lens) if n == 1]
    if decodes:
        rows = torch.tensor(decodes, device=q.device)
        tokens = meta.cu_seqlens_q[rows].long()
        num_keys = max(seq_lens[i] for i in decodes)
        keys = gather_keys(k_cache, meta.block_tables[rows], num_keys).transpose(1, 2)
        values = gather_keys(v_cache, meta.block_tables[rows], num_keys).transpose(1, 2)
        visible = torch.arange(num_keys, device=q.device)[None, :] < meta.seq_lens[rows].long()[:, None]
        out[tokens] = F.scaled_dot_product_attention(
            q[tokens][:, :, None, :], keys, values, attn_mask=visible[:, None, None, :], scale=scale,
            enable_gqa=gqa)[:, :, 0, :]
    start = 0
    for row, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens)):
        if q_len > 1:
            keys = gather_keys(k_cache, meta.block_tables[row:row + 1], seq_len).transpose(1, 2)
            values = gather_keys(v_cache, meta.block_tables[row:row + 1], seq_len).transpose(1, 2)
            # query i sits at max(seq_len - q_len + i, 0) and sees keys up to there (0 for left padding)
            positions = (torch.arange(q_len, device=q.device) + seq_len - q_len).clamp(min=0)
            visible = torch.arange(seq_len, device=q.device)[None, :] <= positions[:, None]
            chunk = q[start:start + q_len].transpose(0, 1)[None]
            out[start:start + q_len] = F.scaled_dot_product_attention(
                chunk, keys, values, attn_mask=visible, scale=scale, enable_gqa=gqa)[0].transpose(0, 1)
        start += q_len
    return out


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

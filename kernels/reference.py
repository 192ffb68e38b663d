"""Plain-torch attention over the paged cache, and the argument checks both versions share.

The reference gathers each request's keys through its block table into an ordinary tensor and
does textbook masked softmax attention, one request at a time. It is slow and obviously right,
which is all a correctness oracle needs to be.
"""

from __future__ import annotations

import math

import torch

from .fp8 import SCALE_BYTES, is_fp8, unpack_kv_fp8


def check_attention_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_seqlen_q: int,
    out: torch.Tensor | None,
) -> None:
    """Raise a ValueError naming the first argument that breaks the packed-batch contract."""
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_q_heads, head_dim]; got {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError("k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, "
                         f"head_dim]; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    fp8 = is_fp8(k_cache)
    cache_dim = k_cache.shape[3] - (SCALE_BYTES if fp8 else 0)   # FP8 rows end in their scale
    if cache_dim != head_dim:
        raise ValueError(f"q has head_dim {head_dim} but the cache has {cache_dim}")
    if fp8 and head_dim % SCALE_BYTES:
        raise ValueError(f"an FP8 cache needs head_dim a multiple of {SCALE_BYTES} (each row's "
                         f"float32 scale must sit aligned after it); got {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads "
                         f"{num_kv_heads} (GQA groups)")
    if k_cache.dtype != v_cache.dtype or (q.dtype != k_cache.dtype and not fp8):
        raise ValueError(f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, "
                         f"{v_cache.dtype} (the caches may be q's dtype, or both FP8)")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(f"unsupported dtype {q.dtype}; use float16, bfloat16 or float32")
    for name, t, dim in (("cu_seqlens_q", cu_seqlens_q, 1), ("seq_lens", seq_lens, 1),
                         ("block_tables", block_tables, 2)):
        if t.dtype != torch.int32 or t.dim() != dim:
            raise ValueError(f"{name} must be a {dim}-d int32 tensor; got {t.dim()}-d {t.dtype} "
                             "(use .int())")
    num_seqs = seq_lens.shape[0]
    if cu_seqlens_q.shape[0] != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"seq_lens has {num_seqs} requests, so cu_seqlens_q needs {num_seqs + 1} entries and "
            f"block_tables {num_seqs} rows; got {cu_seqlens_q.shape[0]} and {block_tables.shape[0]}"
        )
    if max_seqlen_q < 1:
        raise ValueError("max_seqlen_q must be at least 1 (the longest segment); got "
                         f"{max_seqlen_q}")
    tensors = [q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables] + (
        [out] if out is not None else [])
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_tables", block_tables)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension; call .contiguous()")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(
            f"out must match q: shape {tuple(q.shape)}, dtype {q.dtype}, last dim contiguous; got "
            f"{tuple(out.shape)}, {out.dtype}, stride {out.stride()}"
        )


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_seqlen_q: int,
    max_seqlen_k: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same attention in plain torch, one request at a time: the correctness oracle.

    Gathers each request's keys through its block table, masks by the position rule, and does
    the softmax in float32 (float64 when the inputs are float64). FP8 caches are dequantized
    first, then attended: the oracle for the kernel that dequantizes inside.
    """
    check_attention_args(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_seqlen_q,
                         out)
    if is_fp8(k_cache):
        k_cache, v_cache = unpack_kv_fp8(k_cache), unpack_kv_fp8(v_cache)
    num_q_heads, head_dim = q.shape[1:]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty_like(q) if out is None else out
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        start, end = cu[i], cu[i + 1]
        q_len = end - start
        if q_len > max_seqlen_q or seq_len > max_seqlen_k:
            raise ValueError(
                f"request {i} has {q_len} queries and {seq_len} keys, past max_seqlen_q "
                f"{max_seqlen_q} / max_seqlen_k {max_seqlen_k}"
            )
        if q_len == 0:
            continue
        if seq_len == 0:
            out[start:end] = 0
            continue
        num_blocks = math.ceil(seq_len / block_size)
        if num_blocks > block_tables.shape[1]:
            raise ValueError(f"request {i} needs {num_blocks} blocks; its table holds "
                             f"{block_tables.shape[1]}")
        blocks = block_tables[i, :num_blocks].long()
        # [num_blocks, block_size, H, D] -> [seq_len, H, D], then one K/V head per query head.
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].to(compute)
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].to(compute)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].to(compute), k) * scale
        position = (seq_len - q_len + torch.arange(q_len, device=q.device)).clamp(min=0)
        visible = torch.arange(seq_len, device=q.device)[None, :] <= position[:, None]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)
    return out

"""Chapter 05 exercise: a Triton paged-attention kernel for decode steps (no split).

In a decode step every request brings ONE query token and attends to all of its cached keys,
which lie scattered over the pool in blocks its block table names. One Triton program handles
one (request, query head) pair: it walks the request's keys BLOCK_N at a time, finds each key
through the block table, and keeps a running softmax (the "online softmax" of FlashAttention),
so it never holds more than BLOCK_N scores:

    for each tile of keys:
        scores  = q · k * scale                    masked to the request's seq_len keys
        m_new   = max(m, max(scores))              the running maximum
        alpha   = exp(m - m_new)                   rescales what was summed under the old max
        p       = exp(scores - m_new)
        l       = l * alpha + sum(p)               the running denominator
        acc     = acc * alpha + p · v              the running numerator
        m       = m_new
    out = acc / l

Grouped-query attention: query head h reads KV head h // (num_q_heads // num_kv_heads).
Key position j of request i is at block_tables[i, j // block_size], offset j % block_size.

Run on CPU with TRITON_INTERPRET=1 (make grade sets it): Triton then runs the kernel as Python
on CPU tensors, slowly, with the same semantics. The tests hold your kernel to minicb's torch
reference (minicb.kernels.paged_attention_reference) and run minicb's engine with it.

Grade it: make grade CH=05
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 16    # keys per loop iteration


@triton.jit
def paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, seq_lens_ptr, block_tables_ptr, scale,
    stride_q_seq, stride_q_head,
    stride_cache_block, stride_cache_offset, stride_cache_head,
    stride_table_seq,
    stride_out_seq, stride_out_head,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (seq, head) of the grid (num_seqs, num_q_heads): out[seq, head] = softmax(q K^T *
    scale) V.

    q, out: [num_seqs, num_q_heads, head_dim]; the caches: [num_blocks, block_size, num_kv_heads,
    head_dim] (k and v with the same strides); the last dimension of every tensor is contiguous.
    DIM_PAD is head_dim rounded up to a power of two (tl.arange needs one): mask the extra lanes.

    Hints: load q once (as float32); loop `for start in range(0, seq_len, BLOCK_N)`; inside, the
    keys are start + tl.arange(0, BLOCK_N), masked where >= seq_len (score -inf, load other=0);
    load each key's block id from the table, then K and V tiles of shape [BLOCK_N, DIM_PAD].
    """
    # BEGIN SOLUTION: one (request, query head): online softmax over its keys, BLOCK_N at a time
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_q_seq + head * stride_q_head + dims, mask=dim_ok, other=0.0)
    q = q.to(tl.float32)

    m_i = tl.full([1], -1.0e30, tl.float32)       # finite: exp(-inf - m) stays 0, never NaN
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([DIM_PAD], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < seq_len
        block = tl.load(block_tables_ptr + seq * stride_table_seq + keys // BLOCK_SIZE, mask=key_ok,
                        other=0)
        where = (block.to(tl.int64)[:, None] * stride_cache_block
                 + (keys % BLOCK_SIZE)[:, None] * stride_cache_offset
                 + kv_head * stride_cache_head + dims[None, :])
        tile_ok = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + where, mask=tile_ok, other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], axis=1) * scale
        scores = tl.where(key_ok, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v = tl.load(v_cache_ptr + where, mask=tile_ok, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    out = acc / l_i
    tl.store(out_ptr + seq * stride_out_seq + head * stride_out_head + dims,
             out.to(out_ptr.dtype.element_ty), mask=dim_ok)
    # END SOLUTION


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention over the paged cache: one query token per request.

    Contract: q [num_seqs, num_q_heads, head_dim]; k_cache, v_cache [num_blocks, block_size,
    num_kv_heads, head_dim], same shape and strides; seq_lens int32 [num_seqs] (each >= 1: the
    keys include the query's own); block_tables int32 [num_seqs, max_blocks]. Returns a new
    tensor shaped and typed like q.

    Launch paged_decode_kernel on the grid (num_seqs, num_q_heads), passing the tensors, the
    strides the kernel names (tensor.stride(dim), in elements), GROUP = num_q_heads //
    num_kv_heads, DIM_PAD = triton.next_power_of_2(head_dim), BLOCK_SIZE and BLOCK_N.
    """
    # BEGIN SOLUTION: allocate out; launch the kernel on grid (num_seqs, num_q_heads), strides given
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache and v_cache must have the same shape and strides; call "
                         ".contiguous() on both.")
    num_seqs, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    paged_decode_kernel[(num_seqs, num_q_heads)](q, k_cache, v_cache, out, seq_lens, block_tables,
                                                 scale, q.stride(0), q.stride(1), k_cache.stride(0),
                                                 k_cache.stride(1), k_cache.stride(2),
                                                 block_tables.stride(0), out.stride(0),
                                                 out.stride(1), GROUP=num_q_heads // num_kv_heads,
                                                 HEAD_DIM=head_dim,
                                                 DIM_PAD=triton.next_power_of_2(head_dim),
                                                 BLOCK_SIZE=block_size, BLOCK_N=BLOCK_N,)
    return out
    # END SOLUTION

# Generated from solutions/ch05_decode_kernel.py by scripts/make_exercises.py. Replace each
# NotImplementedError with your code, then run `make grade CH=05`.
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
    raise NotImplementedError(
        "paged_decode_kernel: one (request, query head): online softmax over its keys, BLOCK_N at a"
        " time")


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
    raise NotImplementedError(
        "paged_decode: allocate out; launch the kernel on grid (num_seqs, num_q_heads), strides "
        "given")

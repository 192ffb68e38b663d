"""Paged attention over a packed batch of prefill chunks and decodes.

Request i owns query rows ``cu_seqlens_q[i] : cu_seqlens_q[i+1]`` (its segment, ``q_len`` rows)
and ``seq_lens[i]`` keys, already written to the cache by ``write_kv``. Query j sits at position
``max(seq_len - q_len + j, 0)`` and sees keys ``0 … position``. Keys are found through the
request's block table::

    key position p of request i   (block_size 4)

    p = 9 ──► block_tables[i, 9 // 4] = block_tables[i, 2] = 7 ──┐
          └─► offset 9 % 4 = 1 ──────────────────────────────────┤
                                                                 ▼
              address = 7 * stride_block + 1 * stride_offset + kv_head * stride_head

    block_tables[i] = [ 3, 0, 7, … ]        the pool: physical blocks, in any order
                        │  │  │
      keys 0-3  ────────┘  │  │             block 0  [ k4  k5  k6  k7  ]
      keys 4-7  ───────────┘  │             block 3  [ k0  k1  k2  k3  ]
      keys 8-11 ──────────────┘             block 7  [ k8  k9  k10 k11 ]   p = 9: offset 1

One program computes one tile of ``BLOCK_M`` queries of one request for *all* query heads that
share one KV head (grouped-query attention): the K/V tile is loaded once and used by
``BLOCK_M * group`` query rows. Grid = (num_seqs * query tiles, num_kv_heads, num_splits)::

    query tile rows (BLOCK_M = 2, group = 4)        K tile  [BLOCK_N keys, head_dim]
      row 0  token 0, q head 4h+0  ─┐                  loaded once per step
      row 1  token 0, q head 4h+1   │   scores = Q·Kᵀ  [8, BLOCK_N]
      row 2  token 0, q head 4h+2   ├── (rows × head_dim)·(head_dim × BLOCK_N)
      row 3  token 0, q head 4h+3   │
      row 4  token 1, q head 4h+0   │   online softmax in float32, then P·V
      ...                          ─┘

Rows are padded to at least 16 (``tl.dot``'s smallest tile on a GPU); padding rows are masked.

An FP8 cache (``kv_cache_dtype="fp8"``, kernels/fp8.py: e4m3 bytes, then a float32 scale per
(token, KV head)) is dequantized inside the loop. The bytes become half-precision floats with two
shifts and a bitcast (:func:`_e4m3_to_half`: exact, on every target, with or without FP8
instructions), and each key's scale multiplies its column of scores, each value's scale its
column of probabilities, so no tile is rescaled::

    scores[:, j] = (q · e4m3(k_j)) * scale_k[j]        acc += (p * scale_v) · e4m3(v)
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .fp8 import is_fp8
from .reference import check_attention_args, paged_attention_reference
from .split_kv import choose_num_splits, merge_splits
from .targets import DoesNotFit, GpuLimits, limits_for_device

__all__ = ["paged_attention", "paged_attention_reference"]

LOG2_E = 1.4426950408889634
# Keys per inner-loop step, largest first: any value >= 16 works with any block_size; a device
# with little shared memory gets the first that fits (attention_launch).
KEY_TILES = (64, 32, 16)
BLOCK_N = KEY_TILES[0]
MIN_DOT_ROWS = 16
PREFILL_ROWS = 64
# What the compiled kernel keeps in shared memory beyond the tiles (barriers, a reduction
# scratch); the compile check (python -m minicb bench gpu-compile) verifies the estimate below
# is never under what Triton allocates, on seven GPUs.
SHARED_SLACK = 1024


@triton.jit
def _e4m3_to_half(b):
    """float16 of e4m3 bytes ``b`` (uint8), times 2**-8: e4m3's sign, 4 exponent and 3 mantissa
    bits moved into float16's places (bias 15 for 7: the 2**-8) land exactly, subnormals
    included. The caller folds the 256 back in with the row's scale."""
    x = b.to(tl.int32)
    return (((x & 0x80) << 8) | ((x & 0x7F) << 7)).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _load_kv(cache_ptr, rows, dims, mask, key_ok, dtype, HEAD_DIM: tl.constexpr,
             KV_FP8: tl.constexpr):
    """A [keys, DIM_PAD] tile in ``dtype`` and each key's scale (1 unless FP8). ``rows``: each
    key's row address in the cache (block, offset and head applied)."""
    if KV_FP8:
        tile = _e4m3_to_half(tl.load(cache_ptr + rows[:, None] + dims[None, :], mask=mask,
                                     other=0)).to(dtype)
        scale_at = (cache_ptr + rows + HEAD_DIM).to(tl.pointer_type(tl.float32), bitcast=True)
        scale = tl.load(scale_at, mask=key_ok, other=0.0) * 256.0
    else:
        tile = tl.load(cache_ptr + rows[:, None] + dims[None, :], mask=mask, other=0.0)
        scale = tl.full(rows.shape, 1.0, tl.float32)
    return tile, scale


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, lse_ptr,
    cu_seqlens_q_ptr, seq_lens_ptr, block_tables_ptr,
    scale_log2, num_q_tiles, num_splits,
    stride_q_token, stride_q_head,
    stride_kc_block, stride_kc_offset, stride_kc_head,
    stride_vc_block, stride_vc_offset, stride_vc_head,
    stride_bt_seq,
    stride_o_split, stride_o_token, stride_o_head,
    stride_lse_split, stride_lse_token,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SPLIT_KV: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
):
    seq = tl.program_id(0) // num_q_tiles
    q_tile = tl.program_id(0) % num_q_tiles
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    if q_tile * BLOCK_M < q_len:  # tiles past a short segment (decodes in a mixed batch) idle
        # Row r of the tile is query (r // GROUP_PAD) of the tile, head (r % GROUP_PAD) of the
        # group.
        rows = tl.arange(0, BLOCK_M * GROUP_PAD)
        query = q_tile * BLOCK_M + rows // GROUP_PAD
        head = kv_head * GROUP + rows % GROUP_PAD
        row_ok = (query < q_len) & (rows % GROUP_PAD < GROUP)
        position = tl.maximum(seq_len - q_len + query, 0)
        token = (q_start + query).to(tl.int64)
        dims = tl.arange(0, DIM_PAD)
        dim_ok = dims[None, :] < HEAD_DIM
        q = tl.load(
            q_ptr + token[:, None] * stride_q_token + head[:, None] * stride_q_head + dims[None, :],
            mask=row_ok[:, None] & dim_ok,
            other=0.0,
        )

        # Causality bounds the keys this tile needs: up to the position of its last query.
        last_query = tl.minimum(q_tile * BLOCK_M + BLOCK_M, q_len) - 1
        kv_end = tl.minimum(seq_len, tl.maximum(seq_len - q_len + last_query, 0) + 1)
        # This program's share [lo, hi) of those keys, whole BLOCK_N tiles per split.
        per_split = (kv_end + num_splits - 1) // num_splits
        per_split = (per_split + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        lo = split * per_split
        hi = tl.minimum(lo + per_split, kv_end)

        # Running max starts finite (not -inf) so a row that sees no key in a tile computes
        # exp2(-inf - m) = 0 instead of exp2(-inf + inf) = NaN.
        m_i = tl.full([BLOCK_M * GROUP_PAD], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M * GROUP_PAD], tl.float32)
        acc = tl.zeros([BLOCK_M * GROUP_PAD, DIM_PAD], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            key_ok = keys < hi
            # Key p lives in block block_tables[seq, p // BLOCK_SIZE] at offset p % BLOCK_SIZE.
            block = tl.load(
                block_tables_ptr + seq * stride_bt_seq + keys // BLOCK_SIZE, mask=key_ok, other=0
            ).to(tl.int64)
            offset = keys % BLOCK_SIZE
            kv_mask = key_ok[:, None] & dim_ok
            k, k_scale = _load_kv(
                k_cache_ptr, block * stride_kc_block + offset * stride_kc_offset
                + kv_head * stride_kc_head, dims, kv_mask, key_ok, q.dtype, HEAD_DIM, KV_FP8)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            if KV_FP8:
                scores = scores * (k_scale * scale_log2)[None, :]
            else:
                scores = scores * scale_log2
            visible = key_ok[None, :] & (keys[None, :] <= position[:, None])
            scores = tl.where(visible, scores, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(scores, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v, v_scale = _load_kv(
                v_cache_ptr, block * stride_vc_block + offset * stride_vc_offset
                + kv_head * stride_vc_head, dims, kv_mask, key_ok, q.dtype, HEAD_DIM, KV_FP8)
            acc = acc * alpha[:, None]
            if KV_FP8:
                p = p * v_scale[None, :]
            acc = tl.dot(p.to(v.dtype), v, acc=acc, input_precision=DOT_PRECISION)
            m_i = m_new

        # No keys at all (an empty split, or seq_len 0) leaves l_i = 0: output 0, lse -inf.
        has_keys = l_i > 0
        acc = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        out_at = out_ptr + split * stride_o_split + token[:, None] * stride_o_token
        out_at += head[:, None] * stride_o_head + dims[None, :]
        if SPLIT_KV:
            tl.store(out_at, acc, mask=row_ok[:, None] & dim_ok)
            lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
            lse_at = lse_ptr + split * stride_lse_split + token * stride_lse_token + head
            tl.store(lse_at, lse, mask=row_ok)
        else:
            tl.store(out_at, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok)


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _query_tile(group_pad: int, max_seqlen_q: int, max_rows: int = PREFILL_ROWS) -> int:
    """Queries per tile (BLOCK_M): at least 16 rows for tl.dot, up to ``max_rows`` rows (64) for
    long chunks."""
    smallest = max(1, MIN_DOT_ROWS // group_pad)
    largest = max(smallest, max_rows // group_pad)
    return max(smallest, min(largest, triton.next_power_of_2(max_seqlen_q)))


def shared_estimate(rows: int, block_n: int, dim_pad: int, itemsize: int, stages: int,
                    nvidia: bool = True) -> int:
    """Bytes of shared memory the kernel needs, at most: ``tl.dot`` stages its operands there,
    so the query tile (rows x dim), the probabilities (rows x keys) and the K/V tiles (keys x
    dim): with one stage K and V take turns in one buffer; pipelined, each has one per stage::

        float32, head_dim 128, 64 rows, 64 keys, 1 stage:
            4 B x (64x128 + 64x64 + 64x128) = 81,920 B   > a T4's 65,536
        float16, head_dim 128, 64 rows, 64 keys, 2 stages:
            2 B x (64x128 + 64x64 + 4 x 64x128) = 90,112 B   > a T4's, < an A100's 166,912

    With 2-byte inputs on NVIDIA, ``tl.dot`` runs on tensor cores, and the compiler may pass the
    float32 accumulator (rows x dim) through shared memory to change its layout while the query
    tile is still held there: on a T4, float16 with head_dim 256 and 64 rows took 64 x 256 x
    (2 + 4) = 98,304 B where the tiles alone come to 54,272. So such a tile needs at least that
    much (AMD's compiler allocated 32,768 B for the same tile).
    """
    kv_buffers = 1 if stages == 1 else 2 * stages
    tiles = itemsize * (rows * dim_pad + rows * block_n + kv_buffers * block_n * dim_pad)
    accumulator = (itemsize + 4) * rows * dim_pad if nvidia and itemsize <= 2 else 0
    return max(tiles, accumulator) + SHARED_SLACK


def attention_launch(dtype: torch.dtype, head_dim: int, group: int, max_seqlen_q: int,
                     block_size: int, split_kv: bool, limits: GpuLimits | None,
                     kv_fp8: bool = False) -> dict:
    """The attention kernel's tiles and launch options for one batch shape on one device.

    ``limits`` is the device's (``None`` under the interpreter: no limit, the largest tiles).
    Preferred: 64 rows of queries for long chunks (32 in float32), 64 keys per step, two
    pipeline stages for 2-byte dtypes. On a device whose shared memory per block cannot hold
    that (64 KiB on a T4 and the AMD parts), fewer keys per step, then fewer stages, then fewer
    query rows, until :func:`shared_estimate` fits. ``kv_fp8``: the cache holds FP8 rows,
    widened to ``dtype`` before the products, so the same tiles and estimate. Returns the kernel's
    constexprs with ``num_warps``, ``num_stages`` and ``shared_estimate``; the runtime and the
    compile check both call this.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    group_pad = triton.next_power_of_2(group)
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    # float32 tiles are twice the bytes: one stage keeps them within smaller GPUs' shared memory
    wanted_stages = 2 if itemsize <= 2 else 1
    # float32 runs tl.dot exactly (input_precision "ieee") on the FMA units, which hold the
    # operands in registers: 64 query rows spill kilobytes per thread on every GPU, 32 do not.
    first_rows = PREFILL_ROWS if itemsize <= 2 else 32
    # float32 multiplies exactly ("ieee"); for 2-byte inputs the setting changes nothing, but
    # it must be one the target accepts: AMD's gfx90a (MI250) refuses "tf32"
    hip = limits is not None and limits.backend == "hip"
    dot_precision = "ieee" if dtype == torch.float32 or hip else "tf32"
    budget = limits.shared_per_block if limits is not None else None
    for max_rows in sorted({first_rows, 32, MIN_DOT_ROWS}, reverse=True):
        block_m = _query_tile(group_pad, max_seqlen_q, max_rows)
        for stages in range(wanted_stages, 0, -1):
            for block_n in KEY_TILES:
                need = shared_estimate(block_m * group_pad, block_n, dim_pad, itemsize, stages,
                                       nvidia=not hip)
                if budget is None or need <= budget:
                    return dict(
                        GROUP=group, GROUP_PAD=group_pad, BLOCK_M=block_m, BLOCK_N=block_n,
                        HEAD_DIM=head_dim, DIM_PAD=dim_pad, BLOCK_SIZE=block_size,
                        SPLIT_KV=split_kv,
                        DOT_PRECISION=dot_precision, KV_FP8=kv_fp8,
                        # 8 warps spread the tiles over twice the threads: with 4, a 16 x 128
                        # float32 tile needs about 250 registers per thread, with 8 about 100
                        num_warps=8, num_stages=stages, shared_estimate=need)
    smallest = shared_estimate(group_pad * max(1, MIN_DOT_ROWS // group_pad), KEY_TILES[-1],
                               dim_pad, itemsize, 1)
    raise DoesNotFit(f"paged attention with head_dim {head_dim}, GQA group {group} in {dtype} "
                     f"needs at least {smallest:,} bytes of shared memory per block; the "
                     f"{limits.label} allows {limits.shared_per_block:,}. Use a smaller dtype.")


def paged_attention(
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
    num_splits: int | None = None,
    limits: GpuLimits | None = None,
) -> torch.Tensor:
    """Attention of ``q: [num_tokens, num_q_heads, head_dim]`` over the paged cache.

    ``max_seqlen_q`` must be at least the longest segment (it sizes the grid); ``max_seqlen_k``
    (the longest ``seq_lens``) only steers the split choice. ``num_splits=None`` splits all-decode
    batches by :func:`choose_num_splits` on a GPU; an int forces that many key splits, for any
    batch. ``limits`` picks the tiles for that device (default: the live GPU's; none under the
    interpreter). Returns ``out`` (allocated when None), in q's dtype; accumulation is float32.
    The caches are q's dtype, or FP8 rows (``torch.float8_e4m3fn``, head_dim + 4 bytes each:
    kernels/fp8.py) dequantized inside the kernel.
    """
    check_attention_args(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_seqlen_q,
                         out)
    if q.dtype == torch.float64:
        raise ValueError("the Triton kernel takes float16, bfloat16 or float32; float64 is "
                         "reference-only")
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    num_seqs = seq_lens.shape[0]
    kv_fp8 = is_fp8(k_cache)
    if kv_fp8:   # the kernel reads bytes: e4m3 values, then each row's scale
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0 or num_seqs == 0:
        return out
    if num_splits is None:
        auto = max_seqlen_q == 1 and q.is_cuda
        num_splits = (choose_num_splits(num_seqs, num_kv_heads, max_seqlen_k, _num_sms(q.device))
                      if auto else 1)
    if not 1 <= num_splits <= 65535:
        raise ValueError(f"num_splits must be between 1 and 65535; got {num_splits}")

    if limits is None and q.is_cuda:
        limits = limits_for_device(q.device)
    launch = attention_launch(q.dtype, head_dim, num_q_heads // num_kv_heads, max_seqlen_q,
                              block_size, num_splits > 1, limits, kv_fp8)
    launch.pop("shared_estimate")
    num_q_tiles = triton.cdiv(max_seqlen_q, launch["BLOCK_M"])
    if num_splits > 1:
        target = torch.empty((num_splits, num_tokens, num_q_heads, head_dim), dtype=torch.float32,
                             device=q.device)
        lse = torch.empty((num_splits, num_tokens, num_q_heads), dtype=torch.float32,
                          device=q.device)
        target_strides = target.stride()[:3]
        lse_strides = lse.stride()[:2]
    else:  # write straight into out; the lse arguments are never read
        target, lse = out, out
        target_strides = (0, *out.stride()[:2])
        lse_strides = (0, 0)

    _paged_attention_kernel[(num_seqs * num_q_tiles, num_kv_heads, num_splits)](
        q, k_cache, v_cache, target, lse,
        cu_seqlens_q, seq_lens, block_tables,
        scale * LOG2_E, num_q_tiles, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        *target_strides,
        *lse_strides,
        **launch,
    )
    if num_splits > 1:
        merge_splits(target, lse, out)
    return out

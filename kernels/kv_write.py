"""Write this step's K and V into the paged cache.

Every token computed this step has a *slot*: ``block_id * block_size + offset``, chosen by the
KV manager and packed into ``slot_mapping``. The kernel copies the token's K and V rows (all KV
heads at once) to that slot::

    k: [num_tokens, num_kv_heads, head_dim]        k_cache: [num_blocks, block_size, num_kv_heads,
    head_dim]

    token t ──slot_mapping[t]──► slot = 37 (block_size 16)
                                  │
                                  ├─ block  = 37 // 16 = 2 ──┐
                                  └─ offset = 37 % 16  = 5 ──┤
                                                             ▼
             k_cache[2, 5, :, :]  =  k[t, :, :]      (same for v)

    block 0            block 1            block 2
    ┌────────────────┐ ┌────────────────┐ ┌─────┬──────────┐
    │                │ │                │ │     │▓         │   ▓ = slot 37
    └────────────────┘ └────────────────┘ └─────┴──────────┘
                                           offset 0..4, then 5

A slot of ``-1`` marks a padding token (left padding under static batching): nothing is
written for it. One Triton program handles one token.

An FP8 cache (``kv_cache_dtype="fp8"``, kernels/fp8.py) stores each (token, KV head) row as its
e4m3 bytes and then its float32 scale: the kernel finds each head's largest magnitude, divides by
its scale and rounds to e4m3 in registers (:func:`_float_to_e4m3`, integer arithmetic on the
float's bits, so every target and the interpreter round alike, with or without FP8
instructions).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8 import SCALE_BYTES, is_fp8, pack_kv_fp8


@triton.jit
def _float_to_e4m3(y):
    """e4m3 bytes (uint8) of float32 ``y`` with |y| <= 448, rounded to nearest even."""
    sign = (y.to(tl.int32, bitcast=True) >> 24) & 0x80
    a = tl.abs(y)
    bits = a.to(tl.int32, bitcast=True)
    # Below 2**-6 (e4m3's smallest normal) the step is 2**-9: adding 2**14, whose float32 step
    # is 2**-9, rounds |y| to it in hardware; the low bits then count the steps (0..8).
    small = (a + 16384.0).to(tl.int32, bitcast=True) - (141 << 23)
    # Otherwise keep 3 of float32's 23 mantissa bits, rounding to nearest even (add just under
    # half a step, plus the kept lowest bit), and rebias the exponent from 127 to 7.
    normal = (bits + ((7 - 127) << 23) + 0x7FFFF + ((bits >> 20) & 1)) >> 20
    return (tl.where(bits < (121 << 23), small, normal) | sign).to(tl.uint8)


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_slots,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_kc_block,
    stride_kc_offset,
    stride_kc_head,
    stride_vc_block,
    stride_vc_offset,
    stride_vc_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    # -1 is padding; anything past the pool is refused too, so a bad slot can never scribble
    # over memory outside the cache (the torch reference raises on it instead).
    slot_ok = (slot >= 0) & (slot < num_slots)
    slot = tl.where(slot_ok, slot, 0)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, DIM_PAD)[None, :]
    # A skipped slot masks every head (written as a head limit: the interpreter rejects a
    # scalar boolean combined with a block mask).
    heads_to_write = tl.where(slot_ok, NUM_KV_HEADS, 0)
    mask = (heads < heads_to_write) & (dims < HEAD_DIM)

    k = tl.load(k_ptr + token * stride_k_token + heads * stride_k_head + dims, mask=mask,
                other=0.0)
    v = tl.load(v_ptr + token * stride_v_token + heads * stride_v_head + dims, mask=mask,
                other=0.0)
    k_dst = (k_cache_ptr + block * stride_kc_block + offset * stride_kc_offset + heads
             * stride_kc_head)
    v_dst = (v_cache_ptr + block * stride_vc_block + offset * stride_vc_offset + heads
             * stride_vc_head)
    if KV_FP8:   # e4m3 bytes of each head's row over its scale, then the scale after the row
        _store_e4m3(k_dst, dims, k, mask, heads < heads_to_write, HEAD_DIM)
        _store_e4m3(v_dst, dims, v, mask, heads < heads_to_write, HEAD_DIM)
    else:
        tl.store(k_dst + dims, k, mask=mask)
        tl.store(v_dst + dims, v, mask=mask)


@triton.jit
def _store_e4m3(dst, dims, x, mask, head_ok, HEAD_DIM: tl.constexpr):
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    # IEEE divisions (a GPU's "/" on float32 is approximate) so a GPU writes torch's bytes
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)   # 448: e4m3's largest
    y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale[:, None]), -448.0), 448.0)
    tl.store(dst + dims, _float_to_e4m3(y), mask=mask)
    scale_at = (dst + HEAD_DIM).to(tl.pointer_type(tl.float32), bitcast=True)
    tl.store(scale_at, scale[:, None], mask=head_ok)


def _check_write_args(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(
            f"k and v must both be [num_tokens, num_kv_heads, head_dim]; got k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError("k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, "
                         f"head_dim]; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    fp8 = is_fp8(k_cache)
    row = (k_cache.shape[2], k_cache.shape[3] - (SCALE_BYTES if fp8 else 0))
    if k.shape[1:] != row:
        raise ValueError(
            f"k has (num_kv_heads, head_dim) = {tuple(k.shape[1:])} but the cache holds "
            f"{row}: the model config and the cache disagree"
        )
    if fp8 and k.shape[2] % SCALE_BYTES:
        raise ValueError(f"an FP8 cache needs head_dim a multiple of {SCALE_BYTES} (each row's "
                         f"float32 scale must sit aligned after it); got {k.shape[2]}. Use "
                         "kv_cache_dtype='auto'.")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"slot_mapping must be [num_tokens] = [{k.shape[0]}]; got {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be int64; got {slot_mapping.dtype} (use .long())")
    if k.dtype != v.dtype or k_cache.dtype != v_cache.dtype or (k.dtype != k_cache.dtype
                                                                 and not fp8):
        raise ValueError(
            f"k, v and the caches must share a dtype (or the caches be FP8); got k {k.dtype}, v "
            f"{v.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype} (cast k and v to the "
            "cache dtype)"
        )
    devices = {t.device for t in (k, v, k_cache, v_cache, slot_mapping)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride 1); call "
                             ".contiguous()")


def write_launch(num_kv_heads: int, head_dim: int, block_size: int, fp8: bool = False) -> dict:
    """The write kernel's constexprs and launch options (the runtime and the compile check both
    call this): one program per token copies a [kv_heads, head_dim] tile of K and one of V
    (``fp8``: rounds them to e4m3 with a scale per head)."""
    return dict(NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
                HEADS_PAD=triton.next_power_of_2(num_kv_heads),
                DIM_PAD=triton.next_power_of_2(head_dim), KV_FP8=fp8, num_warps=4)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``k, v: [num_tokens, num_kv_heads, head_dim]`` into the caches, in place.

    ``slot_mapping[t]`` is token t's slot (``block_id * block_size + offset``); ``-1`` skips it.
    An FP8 cache (``torch.float8_e4m3fn`` rows of head_dim + 4 bytes) gets each row rounded to
    e4m3 over its scale, and the scale.
    """
    _check_write_args(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    fp8 = is_fp8(k_cache)
    if fp8:   # the kernel writes bytes: e4m3 values and the scale's four
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    num_blocks, block_size = k_cache.shape[:2]
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        num_blocks * block_size,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        **write_launch(num_kv_heads, head_dim, block_size, fp8),
    )


def write_kv_reference(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The same scatter in plain torch: the correctness oracle for :func:`write_kv`."""
    _check_write_args(k, v, k_cache, v_cache, slot_mapping)
    if is_fp8(k_cache):
        k, v = pack_kv_fp8(k), pack_kv_fp8(v)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    real = slot_mapping >= 0
    slots = slot_mapping[real]
    if slots.numel() and int(slots.max()) >= num_slots:
        raise ValueError(f"slot {int(slots.max())} is past the cache's {num_slots} slots")
    # A [num_blocks, block_size, ...] cache viewed as [num_slots, ...] is indexed by slot.
    k_cache.view(num_slots, *k_cache.shape[2:]).index_copy_(0, slots, k[real])
    v_cache.view(num_slots, *v_cache.shape[2:]).index_copy_(0, slots, v[real])

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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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

    k = tl.load(k_ptr + token * stride_k_token + heads * stride_k_head + dims, mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + heads * stride_v_head + dims, mask=mask)
    k_dst = (k_cache_ptr + block * stride_kc_block + offset * stride_kc_offset + heads
             * stride_kc_head)
    v_dst = (v_cache_ptr + block * stride_vc_block + offset * stride_vc_offset + heads
             * stride_vc_head)
    tl.store(k_dst + dims, k, mask=mask)
    tl.store(v_dst + dims, v, mask=mask)


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
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k has (num_kv_heads, head_dim) = {tuple(k.shape[1:])} but the cache holds "
            f"{tuple(k_cache.shape[2:])}: the model config and the cache disagree"
        )
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"slot_mapping must be [num_tokens] = [{k.shape[0]}]; got {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be int64; got {slot_mapping.dtype} (use .long())")
    if not (k.dtype == v.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(
            f"k, v and the caches must share a dtype; got k {k.dtype}, v {v.dtype}, "
            f"k_cache {k_cache.dtype}, v_cache {v_cache.dtype} (cast k and v to the cache dtype)"
        )
    devices = {t.device for t in (k, v, k_cache, v_cache, slot_mapping)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride 1); call "
                             ".contiguous()")


def write_launch(num_kv_heads: int, head_dim: int, block_size: int) -> dict:
    """The write kernel's constexprs and launch options (the runtime and the compile check both
    call this): one program per token copies a [kv_heads, head_dim] tile of K and one of V."""
    return dict(NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
                HEADS_PAD=triton.next_power_of_2(num_kv_heads),
                DIM_PAD=triton.next_power_of_2(head_dim), num_warps=4)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``k, v: [num_tokens, num_kv_heads, head_dim]`` into the caches, in place.

    ``slot_mapping[t]`` is token t's slot (``block_id * block_size + offset``); ``-1`` skips it.
    """
    _check_write_args(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
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
        **write_launch(num_kv_heads, head_dim, block_size),
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
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    real = slot_mapping >= 0
    slots = slot_mapping[real]
    if slots.numel() and int(slots.max()) >= num_slots:
        raise ValueError(f"slot {int(slots.max())} is past the cache's {num_slots} slots")
    # A [num_blocks, block_size, ...] cache viewed as [num_slots, ...] is indexed by slot.
    k_cache.view(num_slots, *k_cache.shape[2:]).index_copy_(0, slots, k[real])
    v_cache.view(num_slots, *v_cache.shape[2:]).index_copy_(0, slots, v[real])

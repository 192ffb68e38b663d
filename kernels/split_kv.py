"""Split-KV decoding (flash-decoding): more programs for long contexts in small batches.

A decode step has one query per request, so the attention kernel launches only
``num_seqs * num_kv_heads`` programs. With 1 request and 8 KV heads that is 8 programs on a GPU
with 132 SMs: 124 SMs idle while 8 stream a 32k-token context. Splitting each context into
``num_splits`` key ranges gives every range its own program::

    keys of one request   0                                              seq_len
                          ├───────────────┼───────────────┼──────────────┤
                          │   split 0     │   split 1     │   split 2    │
                          └──────┬────────┴──────┬────────┴──────┬───────┘
                                 ▼               ▼               ▼
    partial outputs       o_0, lse_0       o_1, lse_1       o_2, lse_2     (float32)
                                 └───────────────┼───────────────┘
                                                 ▼  merge kernel
                     out = Σ_s exp(lse_s − lse_max) · o_s  /  Σ_s exp(lse_s − lse_max)

Each split's ``o_s`` is already normalised by its own softmax sum ``l_s``, and
``lse_s = m_s + log(l_s)`` remembers how much probability mass that split holds, so the merge
reweights the splits exactly: the result equals one softmax over all keys. The kernels keep
scores in base 2 (``exp2`` is the fast instruction), so ``lse`` here is a log2-sum-exp2; a split
that saw no keys has ``lse = -inf`` and weight 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# A split shorter than this spends more on launching, loading the queries and merging than it
# saves: 256 keys are 4 tiles of 64.
MIN_KEYS_PER_SPLIT = 256
# Beyond this the merge reads more partial outputs than it is worth, and no GPU needs more
# programs than 64 splits already give for a single KV head.
MAX_SPLITS = 64
# Programs per SM to aim for: with two resident programs, one streams K/V while the other
# waits on memory, which a decode (pure bandwidth) needs.
PROGRAMS_PER_SM = 2


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seqlen_k: int, num_sms: int) -> int:
    """How many key ranges to split each decode into.

    The heuristic: a decode launches ``num_seqs * num_kv_heads`` programs; aim for about
    ``PROGRAMS_PER_SM * num_sms`` in all, so ::

        splits = ceil(PROGRAMS_PER_SM * num_sms / (num_seqs * num_kv_heads))

    clamped to ``[1, MAX_SPLITS]`` and to ``ceil(max_seqlen_k / MIN_KEYS_PER_SPLIT)`` so that no
    split is shorter than ``MIN_KEYS_PER_SPLIT`` keys. Large batches already fill the GPU and get
    1 (no split, no merge); one request with a 32k context on 132 SMs and 8 KV heads gets 33.
    """
    for name, value in (("num_seqs", num_seqs), ("num_kv_heads", num_kv_heads),
                        ("num_sms", num_sms)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1; got {value}")
    programs = num_seqs * num_kv_heads
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, programs)
    longest_useful = triton.cdiv(max(max_seqlen_k, 1), MIN_KEYS_PER_SPLIT)
    return max(1, min(wanted, longest_useful, MAX_SPLITS))


@triton.jit
def _merge_splits_kernel(
    partial_ptr,
    lse_ptr,
    out_ptr,
    num_splits,
    stride_p_split,
    stride_p_token,
    stride_p_head,
    stride_lse_split,
    stride_lse_token,
    stride_o_token,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    split_ok = splits < num_splits

    lse = tl.load(
        lse_ptr + splits * stride_lse_split + token * stride_lse_token + head,
        mask=split_ok,
        other=float("-inf"),
    )
    lse_max = tl.max(lse, 0)
    # Every split empty (a request with no keys): weights become exp2(-inf) = 0, output 0.
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp2(lse - lse_max)
    total = tl.sum(weights, 0)

    parts = tl.load(
        partial_ptr
        + splits[:, None] * stride_p_split
        + token * stride_p_token
        + head * stride_p_head
        + dims[None, :],
        mask=split_ok[:, None] & (dims[None, :] < HEAD_DIM),
        other=0.0,
    )
    merged = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + token * stride_o_token + head * stride_o_head + dims,
        merged.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def merge_launch(head_dim: int, num_splits: int) -> dict:
    """The merge kernel's constexprs and launch options (the runtime and the compile check both
    call this): one program per (token, head) holds a [splits, head_dim] float32 tile."""
    return dict(HEAD_DIM=head_dim, DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
                SPLITS_PAD=triton.next_power_of_2(num_splits), num_warps=4)


def merge_splits(partial: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Combine ``partial: [num_splits, num_tokens, num_q_heads, head_dim]`` (float32, each split
    normalised) and ``lse: [num_splits, num_tokens, num_q_heads]`` (log2-sum-exp2) into ``out``."""
    num_splits, num_tokens, num_q_heads, head_dim = partial.shape
    if lse.shape != partial.shape[:3] or lse.stride(2) != 1:
        raise ValueError(f"lse must be a contiguous [{num_splits}, {num_tokens}, {num_q_heads}] "
                         "tensor")
    if num_tokens == 0:
        return out
    _merge_splits_kernel[(num_tokens, num_q_heads)](
        partial,
        lse,
        out,
        num_splits,
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        **merge_launch(head_dim, num_splits),
    )
    return out

"""The fused mixture-of-experts product as a Triton kernel (vLLM's fused_moe, written small).

The step's (token, slot) pairs come grouped by expert and padded to blocks of ``BLOCK_M`` rows
(``align_by_expert`` in minicb/kernels/fused_moe_reference.py, the torch reference). One program
computes one block of rows against one tile of ``BLOCK_N`` output columns of that block's
expert::

    sorted_pairs  [ e0 e0 e0 pad | e2 e2 pad pad | e5 ... ]     block_experts [ 0, 2, 5, -1 ]
                    └ block 0 ─┘   └ block 1 ──┘                 (-1: past the last expert)

    program (block m, tile n):  C[pairs, n-tile] = A[rows of pairs] @ W[expert, n-tile, :]^T

so each program reads one expert's weights, and an expert no token chose is never read: a
decode step of B rows reads the weights of the experts its rows touched, no more.

Two launches make an expert's SwiGLU: gate and up (A = the tokens' activations, a pair's row is
its token, ``pair // top_k``), then down (A = each pair's SiLU(gate) * up, scaled by its routing
weight in the kernel's float32 accumulator). The k outputs of a token are then summed by the
reference's ``combine``, in ascending expert id: the one accumulation order of every path. The
tiles' own sums run in tl.dot's order, so the kernel equals the reference to rounding (float32
with IEEE products, not TF32), not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .fused_moe_reference import Alignment, combine


@triton.jit
def _fused_moe_kernel(
    a_ptr,                  # [rows, K]: the tokens (gate/up) or the pairs' activations (down)
    w_ptr,                  # [num_experts, N, K]: each expert's weight, as nn.Linear holds it
    c_ptr,                  # [num_pairs, N]: one output row per (token, slot) pair
    weights_ptr,            # float32 [num_pairs]: the routing weights (read when MUL_WEIGHT)
    sorted_pairs_ptr,       # int64 [padded]: pair ids grouped by expert; num_pairs = padding
    block_experts_ptr,      # int64 [padded / BLOCK_M]: each block's expert, -1 for none
    N,
    K,
    num_pairs,
    stride_a,
    stride_we,
    stride_wn,
    stride_c,
    ROW_DIV: tl.constexpr,      # top_k when A holds tokens, 1 when it holds pairs
    MUL_WEIGHT: tl.constexpr,
    FP32_DOT: tl.constexpr,     # float32 operands: IEEE products, as torch computes them
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block)
    if expert >= 0:
        rows_in_block = block * BLOCK_M + tl.arange(0, BLOCK_M)
        pairs = tl.load(sorted_pairs_ptr + rows_in_block)
        real = pairs < num_pairs
        a_rows = tl.where(real, pairs, 0) // ROW_DIV
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        a_tile = a_ptr + a_rows[:, None].to(tl.int64) * stride_a + ks[None, :]
        w_tile = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            k_ok = ks + start < K
            a = tl.load(a_tile, mask=real[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_tile, mask=k_ok[:, None] & (cols[None, :] < N), other=0.0)
            if FP32_DOT:
                acc = tl.dot(a, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, w, acc)
            a_tile += BLOCK_K
            w_tile += BLOCK_K
        if MUL_WEIGHT:
            acc = acc * tl.load(weights_ptr + pairs, mask=real, other=0.0)[:, None]
        c = c_ptr + pairs[:, None].to(tl.int64) * stride_c + cols[None, :]
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=real[:, None] & (cols[None, :] < N))


def moe_launch(dtype: torch.dtype) -> dict:
    """The kernel's tile and launch options (the runtime and the ahead-of-time compile both call
    this). 16 rows a block: a decode step gives an expert a few rows, and tl.dot's smallest tile
    is 16; the K loop keeps a 16 x 32 and a 32 x 64 operand tile in shared memory."""
    return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, FP32_DOT=dtype == torch.float32,
                num_warps=4, num_stages=2)


def _grouped_product(a: torch.Tensor, w: torch.Tensor, align: Alignment, num_pairs: int,
                     row_div: int, weights: torch.Tensor | None) -> torch.Tensor:
    if a.stride(-1) != 1 or not w.is_contiguous():
        raise ValueError("the fused MoE kernel reads rows of A and whole expert weights "
                         "contiguous in their last dimension; call .contiguous()")
    out = a.new_zeros(num_pairs, w.shape[1])    # a pair no block computes stays zero
    opts = moe_launch(a.dtype)
    if align.block_experts.numel() * opts["BLOCK_M"] != align.sorted_pairs.numel():
        raise ValueError(f"the alignment's blocks must be {opts['BLOCK_M']} rows "
                         "(align_by_expert(ids, num_experts, block_size=16))")
    grid = (align.block_experts.numel(), triton.cdiv(w.shape[1], opts["BLOCK_N"]))
    _fused_moe_kernel[grid](
        a, w, out, weights if weights is not None else out, align.sorted_pairs,
        align.block_experts, w.shape[1], w.shape[2], num_pairs, a.stride(0), w.stride(0),
        w.stride(1), out.stride(0), ROW_DIV=row_div, MUL_WEIGHT=weights is not None, **opts)
    return out


def moe_experts_triton(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                       weights: torch.Tensor, ids: torch.Tensor, align: Alignment,
                       first_expert: int = 0) -> torch.Tensor:
    """The same arguments and result as the reference ``moe_experts_torch`` (``align`` built
    with block_size 16): [tokens, top_k, hidden], zero for a pair routed to an expert ``w_*`` do
    not hold. No host round trip, so a CUDA graph can capture it."""
    tokens, top_k = ids.shape
    pairs = tokens * top_k
    if first_expert or w_down.shape[0] != align.counts.numel():   # an expert-parallel share
        local = align.block_experts - first_expert
        align = align._replace(block_experts=torch.where(
            (local >= 0) & (local < w_down.shape[0]), local, -1))
    gate_up = _grouped_product(x, w_gate_up, align, pairs, top_k, None)
    gate, up = gate_up.chunk(2, dim=-1)
    act = (F.silu(gate) * up).contiguous()
    out = _grouped_product(act, w_down, align, pairs, 1, weights.reshape(-1).float())
    return out.view(tokens, top_k, -1)


def fused_moe_triton(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                     weights: torch.Tensor, ids: torch.Tensor, align: Alignment) -> torch.Tensor:
    """The whole fused-MoE product, every expert held: the experts' outputs, then ``combine``."""
    return combine(moe_experts_triton(x, w_gate_up, w_down, weights, ids, align))

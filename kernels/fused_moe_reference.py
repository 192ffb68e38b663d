"""The fused mixture-of-experts product in plain torch: the CPU's path and the Triton kernel's
reference (minicb/kernels/fused_moe.py).

A step's tokens each chose `top_k` experts (minicb.model.moe.route, ids ascending per token).
Three stages:

1. **align** (`align_by_expert`, vLLM's moe_align_block_size): the (token, slot) pairs sorted by
   expert, each expert's group padded to a multiple of `block_size` rows, and each block of rows
   labelled with its one expert, so a kernel program computes one expert's tile;
2. **grouped product**: each touched expert's gate/up, SiLU, down on its rows, scaled by the
   routing weight; an expert no token chose is never read;
3. **combine** (`combine`): each token's k outputs summed one after another in ascending expert
   id, the order of transformers' eager loop. Every path shares this stage, so each has one
   accumulation order whatever the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class Alignment(NamedTuple):
    """The step's (token, slot) pairs grouped by expert, each expert's group padded to a multiple
    of `block_size` rows, so a kernel program's block of rows belongs to one expert."""

    sorted_pairs: torch.Tensor    # int64 [padded]: pair index token * top_k + slot; pad = T * k
    block_experts: torch.Tensor   # int64 [padded / block_size]: each block's expert, -1 unused
    counts: torch.Tensor          # int64 [num_experts]: tokens routed to each expert


def align_by_expert(ids: torch.Tensor, num_experts: int, block_size: int) -> Alignment:
    """vLLM's moe_align_block_size in tensor operations, without a host round trip: the padded
    length is the bound for the worst case (every touched expert's last block one row full)."""
    pairs = ids.numel()
    flat = ids.reshape(-1)
    # scatter_add, not bincount: bincount asks the GPU for the largest id first (a host sync)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    starts = ends - padded
    order = torch.sort(flat, stable=True).indices      # pairs of expert 0, then 1, ...
    first = counts.cumsum(0) - counts                  # unpadded start of each expert's group
    experts = flat[order]
    position = starts[experts] + torch.arange(pairs, device=ids.device) - first[experts]
    bound = -(-(pairs + min(pairs, num_experts) * (block_size - 1)) // block_size)
    sorted_pairs = torch.full((bound * block_size,), pairs, dtype=torch.int64, device=ids.device)
    sorted_pairs[position] = order
    block_start = torch.arange(bound, device=ids.device) * block_size
    block_experts = torch.searchsorted(ends, block_start, right=True)
    block_experts = torch.where(block_start < ends[-1], block_experts, -1)
    return Alignment(sorted_pairs, block_experts, counts)


def moe_experts_torch(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                      weights: torch.Tensor, ids: torch.Tensor, align: Alignment,
                      first_expert: int = 0) -> torch.Tensor:
    """Every touched expert once on its rows (a grouped product over the experts the step chose;
    an untouched expert's weights are never read), each output scaled by its routing weight:
    [tokens, top_k, hidden], a token's slots in ascending expert id. `w_*` hold experts
    first_expert, first_expert + 1, ... (an expert-parallel rank's share); a pair routed to an
    expert they do not hold stays zero."""
    tokens, top_k = ids.shape
    flat_weights = weights.reshape(-1, 1)
    contributions = x.new_zeros(tokens * top_k, x.shape[1])
    start = 0
    # block_size 1 in the torch path: the groups are back to back, and the counts say where
    for expert, count in enumerate(align.counts.tolist()):
        pairs = align.sorted_pairs[start:start + count]
        start += count
        local = expert - first_expert
        if count == 0 or not 0 <= local < w_down.shape[0]:
            continue
        gate, up = F.linear(x[pairs // top_k], w_gate_up[local]).chunk(2, dim=-1)
        out = F.linear(F.silu(gate) * up, w_down[local])
        contributions[pairs] = (out * flat_weights[pairs]).to(x.dtype)
    return contributions.view(tokens, top_k, -1)


def fused_moe_torch(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                    weights: torch.Tensor, ids: torch.Tensor, align: Alignment) -> torch.Tensor:
    """The whole fused-MoE product, every expert held: the experts' outputs, then `combine`."""
    return combine(moe_experts_torch(x, w_gate_up, w_down, weights, ids, align))


def combine(contributions: torch.Tensor) -> torch.Tensor:
    """[tokens, top_k, hidden] (slots in ascending expert id) → [tokens, hidden], summed one slot
    after another: the one accumulation order every path shares."""
    out = contributions[:, 0]
    for slot in range(1, contributions.shape[1]):
        out = out + contributions[:, slot]
    return out



"""Tensor parallelism's two linears, and a loaded model split across ranks with them.

A linear y = x Wᵀ can be split two ways, and a transformer block uses both (Megatron-LM's
layout, as vLLM, SGLang, nano-vllm and mini-sglang write it):

* **column-parallel**: each rank holds a slice of W's *rows* (its output features) and computes
  its slice of y from the whole x. No communication: q, k, v, gate and up are split this way, so
  each rank holds whole attention heads and a slice of the MLP's hidden features.
* **row-parallel**: each rank holds a slice of W's *columns* (its input features), which is
  exactly the slice of x the column-parallel layer before it produced. Each rank's product is a
  partial sum of every output; one all-reduce adds them up. o_proj and down_proj are split this
  way, so a decoder layer communicates twice: once after attention, once after the MLP.

The embedding and the LM head are replicated, not split by vocabulary: they are a small share of
the weights of the models minicb runs, and a split would add an all-gather of the logits every
step. Only rank 0 samples, so only rank 0 runs the head (minicb/engine/tp_executor.py).

A mixture of experts splits its sparse layers by expert instead (expert parallelism, as vLLM's
enable_expert_parallel): each rank holds num_experts / size whole experts and computes the
outputs routed to them, and one all-reduce per sparse layer gathers them
(SparseMoeBlock.split_experts). Attention stays tensor-parallel over the same ranks.

Grouped-query attention: where the model has at least as many KV heads as ranks, each rank holds
its own KV heads; with fewer, a KV head is replicated on the ranks whose query heads read it.
Each rank's KV pool then holds only the KV heads it holds here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch
from torch import nn

from minicb.model.llama import LlamaForCausalLM, ModelArgs
from minicb.model.moe import SparseMoeBlock


class AllReduce(Protocol):
    """The one collective the model calls: sum a tensor over the ranks, in place."""

    def all_reduce(self, tensor: torch.Tensor) -> None: ...


class ColumnParallelLinear(nn.Linear):
    """This rank's output features [start, stop) of a full linear: its rows of W (and of the
    bias). A plain linear to run; the split is in which rows it holds."""

    def __init__(self, full: nn.Linear, start: int, stop: int):
        with torch.device("meta"):
            super().__init__(full.in_features, stop - start, bias=full.bias is not None)
        # copies, so the full weight is freed once the model lets go of it
        self.weight = nn.Parameter(full.weight.detach()[start:stop].clone(), requires_grad=False)
        if full.bias is not None:
            self.bias = nn.Parameter(full.bias.detach()[start:stop].clone(), requires_grad=False)


class RowParallelLinear(nn.Module):
    """This rank's input features [start, stop) of a full linear: its columns of W. Its product
    is a partial sum of every output feature; the all-reduce adds the ranks' partial sums, and
    the bias (replicated) is added once, after the sum."""

    def __init__(self, full: nn.Linear, start: int, stop: int, group: AllReduce):
        super().__init__()
        with torch.device("meta"):
            self.local = nn.Linear(stop - start, full.out_features, bias=False)
        self.local.weight = nn.Parameter(full.weight.detach()[:, start:stop].clone(),
                                         requires_grad=False)
        self.bias = (None if full.bias is None else
                     nn.Parameter(full.bias.detach().clone(), requires_grad=False))
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.local(x)              # this rank's share of every output feature
        self.group.all_reduce(partial)       # the layer's one communication: sum the shares
        return partial if self.bias is None else partial + self.bias


def valid_sizes(args: ModelArgs) -> list[int]:
    """The tensor_parallel_size values this model can be split into: each rank gets whole query
    heads and an equal share of the MLP, and the KV heads split evenly or replicate evenly."""
    return [size for size in range(1, args.num_heads + 1)
            if args.num_heads % size == 0 and args.intermediate_size % size == 0
            and (args.num_kv_heads % size == 0 or size % args.num_kv_heads == 0)]


def check_split(model: LlamaForCausalLM, size: int) -> None:
    """Refuse, naming the sizes that work, a tensor_parallel_size the model cannot be split into
    (a mixture of experts: also one whose experts do not split evenly over the ranks)."""
    args = model.args
    if args.moe is not None and args.moe.num_experts % size:
        raise ValueError(f"tensor_parallel_size={size} cannot split the {args.moe.num_experts} "
                         "experts evenly (expert parallelism gives each rank whole experts); "
                         "use a size that divides the number of experts.")
    if size not in valid_sizes(args):
        raise ValueError(
            f"tensor_parallel_size={size} cannot split this model: it has {args.num_heads} query "
            f"heads, {args.num_kv_heads} KV heads and {args.intermediate_size} MLP features, and "
            "every rank needs whole heads and an equal share of each; the sizes that work are "
            f"{', '.join(map(str, valid_sizes(args)))}.")


def shard_model(model: LlamaForCausalLM, rank: int, size: int,
                group: AllReduce) -> LlamaForCausalLM:
    """Turn a loaded model (after fuse_projections) into rank `rank`'s shard of `size`, in place:
    its column- and row-parallel linears, its own heads, and `model.args` saying what this rank
    holds (so the runner's KV pool holds this rank's KV heads only)."""
    check_split(model, size)
    args = model.args
    head_dim = args.head_dim
    heads = args.num_heads // size
    kv_heads = max(1, args.num_kv_heads // size)
    # the KV head of this rank's first query head: query head h reads KV head
    # h // (num_heads / num_kv_heads), so with fewer KV heads than ranks, neighbours share one
    first_kv = rank * args.num_kv_heads // size
    features = args.intermediate_size // size
    q_rows = (rank * heads * head_dim, (rank + 1) * heads * head_dim)
    kv_rows = (first_kv * head_dim, (first_kv + kv_heads) * head_dim)
    mlp_rows = (rank * features, (rank + 1) * features)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj = ColumnParallelLinear(attn.q_proj, *q_rows)
        attn.k_proj = ColumnParallelLinear(attn.k_proj, *kv_rows)
        attn.v_proj = ColumnParallelLinear(attn.v_proj, *kv_rows)
        attn.o_proj = RowParallelLinear(attn.o_proj, *q_rows, group)
        attn.num_heads, attn.num_kv_heads = heads, kv_heads
        attn.qkv_proj = None        # fused again below, from this rank's slices
        if isinstance(mlp, SparseMoeBlock):   # expert parallel: whole experts per rank
            mlp.split_experts(rank, size, group)
            continue
        mlp.gate_proj = ColumnParallelLinear(mlp.gate_proj, *mlp_rows)
        mlp.up_proj = ColumnParallelLinear(mlp.up_proj, *mlp_rows)
        mlp.down_proj = RowParallelLinear(mlp.down_proj, *mlp_rows, group)
        mlp.gate_up_proj = None
    model.args = replace(args, num_heads=heads, num_kv_heads=kv_heads,
                         intermediate_size=features)
    model.fuse_projections()
    return model

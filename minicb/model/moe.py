"""Mixture-of-experts feed-forward blocks: Qwen3-MoE, Qwen2-MoE (a shared expert) and Mixtral.

A sparse block replaces a decoder layer's MLP. A router (one linear layer, `gate`) scores every
expert for each token; the token goes to its `top_k` best, and its output is their outputs
weighted by the router's probabilities. The families differ only in the router's rule and in
names:

    family      router rule                                    shared expert   block's name
    Qwen3-MoE   softmax, top-k, renormalised if norm_topk_prob  no              mlp
    Qwen2-MoE   the same                                        sigmoid-gated   mlp
    Mixtral     softmax, top-k, always renormalised             no              block_sparse_moe

The experts' weights are stacked ([num_experts, 2 * expert_size, hidden] for gate and up,
[num_experts, hidden, expert_size] for down) as transformers holds them, so one tensor index
picks an expert. The step's tokens are grouped by expert (`align_by_expert`, vLLM's
moe_align_block_size) and each expert the step touched runs once on its rows: in torch on a CPU
(minicb/kernels/fused_moe_reference.py, the reference), in one C call for a CPU engine's small
steps (kernels/cpu_moe.c, `use_cpu_moe`), in a Triton kernel on a GPU (minicb/kernels/fused_moe.py).

Accumulation order: a token's k weighted expert outputs are summed one after another in
ascending expert id, starting from the smallest. That is transformers' eager order (it loops
over experts in id order, adding into zeros), so the sum is the same bit for bit whatever the
batch; a path that summed in another order would drift from it by rounding and, at a near-tie,
change a greedy token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minicb.kernels.fused_moe_reference import align_by_expert, combine
from minicb.registry import MOE_KERNELS


@dataclass(frozen=True)
class MoeArgs:
    num_experts: int
    top_k: int
    expert_size: int                 # each expert's intermediate size
    renormalize: bool                # divide the top-k probabilities by their sum
    float32_weights: bool            # Mixtral: the routing weights stay float32 in the product
    sparse_layers: tuple[int, ...]   # the layers whose MLP is a sparse block (others: dense)
    shared_expert_size: int = 0      # Qwen2-MoE's always-on expert; 0: none
    prefix: str = "mlp"              # the block's name in the checkpoint
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Family:
    renormalize: bool | None     # None: the config's norm_topk_prob decides
    float32_weights: bool
    prefix: str
    expert_names: tuple[str, str, str]
    expert_size_key: str
    shared_expert: bool
    sparse_step: bool            # decoder_sparse_step and mlp_only_layers pick the sparse layers
    window_always: bool          # a sliding_window applies without use_sliding_window


FAMILIES = {
    "Qwen3MoeForCausalLM": Family(None, False, "mlp", ("gate_proj", "up_proj", "down_proj"),
                                  "moe_intermediate_size", False, True, True),
    "Qwen2MoeForCausalLM": Family(None, False, "mlp", ("gate_proj", "up_proj", "down_proj"),
                                  "moe_intermediate_size", True, True, False),
    "MixtralForCausalLM": Family(True, True, "block_sparse_moe", ("w1", "w3", "w2"),
                                 "intermediate_size", False, False, True),
}
# the config fields the families add, all read by moe_args_from_config (or, qkv_bias, the loader)
MOE_FIELDS = ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
              "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
              "shared_expert_intermediate_size", "qkv_bias")
# training-only fields: the auxiliary balance loss and the router's jitter noise
MOE_INERT = ("router_aux_loss_coef", "output_router_logits", "router_jitter_noise")


def moe_args_from_config(config: dict, architecture: str, source: str) -> MoeArgs | None:
    """The sparse blocks a config describes (None for a dense architecture), or a ValueError
    naming the field that minicb cannot honour."""
    family = FAMILIES.get(architecture)
    if family is None:
        return None
    num_experts = config.get("num_experts", config.get("num_local_experts"))
    top_k, size = config.get("num_experts_per_tok"), config.get(family.expert_size_key)
    sizes = {"num_experts": num_experts, "num_experts_per_tok": top_k,
             family.expert_size_key: size}
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in sizes.values()):
        raise ValueError(f"{source}: an MoE config needs positive integers {sizes}.")
    if top_k > num_experts:
        raise ValueError(f"{source}: num_experts_per_tok={top_k} exceeds the {num_experts} "
                         "experts.")
    window, max_len = config.get("sliding_window"), config.get("max_position_embeddings")
    if family.window_always and window and (max_len is None or window < max_len):
        raise ValueError(f"{source}: sliding_window={window} is not supported; minicb has no "
                         "sliding window: every token attends to all earlier ones.")
    layers = range(config["num_hidden_layers"])
    if family.sparse_step:
        step, dense = config.get("decoder_sparse_step", 1), set(config.get("mlp_only_layers", []))
        sparse = tuple(i for i in layers if i not in dense and (i + 1) % step == 0)
    else:
        sparse = tuple(layers)
    renormalize = family.renormalize
    if renormalize is None:
        renormalize = bool(config.get("norm_topk_prob", False))
    shared = config.get("shared_expert_intermediate_size", 0) if family.shared_expert else 0
    return MoeArgs(num_experts, top_k, size, renormalize, family.float32_weights, sparse,
                   shared, family.prefix, family.expert_names)


def stack_expert_weights(state: dict[str, torch.Tensor],
                         moe: MoeArgs | None) -> dict[str, torch.Tensor]:
    """A checkpoint's per-expert tensors (`...experts.{e}.gate_proj.weight`, ...) as the stacked
    tensors the sparse block holds (`mlp.w_gate_up`, `mlp.w_down`), and the block's other
    tensors under `mlp.`. A checkpoint that lacks some experts' tensors is refused by name."""
    if moe is None:
        return state
    gate, up, down = moe.expert_names
    for layer in moe.sparse_layers:
        old, new = f"model.layers.{layer}.{moe.prefix}.", f"model.layers.{layer}.mlp."
        experts = [f"{old}experts.{e}." for e in range(moe.num_experts)]
        names = [f"{p}{n}.weight" for p in experts for n in (gate, up, down)]
        missing = [name for name in names if name not in state]
        if missing and len(missing) < len(names):
            raise ValueError(f"the checkpoint lacks {len(missing)} expert tensor(s) of layer "
                             f"{layer}: {', '.join(missing[:3])}; it is incomplete or damaged.")
        if not missing:
            state[f"{new}w_gate_up"] = torch.stack([
                torch.cat([state[f"{p}{gate}.weight"], state[f"{p}{up}.weight"]]) for p in experts])
            state[f"{new}w_down"] = torch.stack([state[f"{p}{down}.weight"] for p in experts])
            for name in names:
                del state[name]
        if old != new:
            for name in [n for n in state if n.startswith(old)]:
                state[new + name[len(old):]] = state.pop(name)
    return state


def route(logits: torch.Tensor, top_k: int, renormalize: bool,
          float32_weights: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top_k experts, in ascending id, and their weights: the softmax over all
    experts (in float32), kept for the top k, renormalised to sum to one if the family says so,
    cast back to the activations' dtype unless the family keeps float32 (Mixtral)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if not float32_weights:
        weights = weights.to(logits.dtype)
    ids, order = ids.sort(dim=-1)          # ascending expert id: the order the sum runs in
    return weights.gather(-1, order), ids


class SparseMoeBlock(nn.Module):
    """A decoder layer's feed-forward as a mixture of experts (the module's note)."""

    def __init__(self, hidden: int, moe: MoeArgs, shared_expert: nn.Module | None = None):
        """`shared_expert`: Qwen2-MoE's expert every token uses (a dense MLP of
        shared_expert_size, built by the decoder), gated by a sigmoid; None for none."""
        super().__init__()
        self.moe = moe
        size, experts = moe.expert_size, moe.num_experts
        self.gate = nn.Linear(hidden, experts, bias=False)          # the router
        self.w_gate_up = nn.Parameter(torch.empty(experts, 2 * size, hidden))
        self.w_down = nn.Parameter(torch.empty(experts, hidden, size))
        self.shared_expert = shared_expert
        self.shared_expert_gate = (nn.Linear(hidden, 1, bias=False)
                                   if shared_expert is not None else None)
        self.load, self.load_row = None, 0   # an ExpertLoad (model/expert_load.py), our row
        self.first_expert, self.group = 0, None   # the experts held, from split_experts
        self.cpu_rows = 0     # steps of up to this many float32 rows run the C experts

    def split_experts(self, rank: int, size: int, group) -> None:
        """Expert parallelism: keep only this rank's num_experts / size whole experts (the
        router and a shared expert stay whole on every rank). Each rank computes the outputs of
        the (token, slot) pairs routed to its experts, zeros for the others; `group.all_reduce`
        then sums the ranks' tensors. Each pair is nonzero on one rank only, so the sum adds
        zeros and is exact: the tokens' outputs are those of one rank holding every expert."""
        per_rank = self.moe.num_experts // size
        first = rank * per_rank
        for name in ("w_gate_up", "w_down"):
            weight = getattr(self, name).detach()[first:first + per_rank].clone()
            setattr(self, name, nn.Parameter(weight, requires_grad=False))
        self.first_expert, self.group = first, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.moe.top_k, self.moe.renormalize,
                             self.moe.float32_weights)
        kernel = "triton" if x.is_cuda else "torch"
        if kernel == "torch" and x.shape[0] <= self.cpu_rows and x.dtype == torch.float32:
            kernel = "cpu"     # a rule on the step's shape only, as SmallBatchLinear's
        align = align_by_expert(ids, self.moe.num_experts, 16 if kernel == "triton" else 1)
        if self.load is not None:
            self.load.record(self.load_row, align.counts)
        outputs = MOE_KERNELS.get_part(kernel)(x, self.w_gate_up, self.w_down, weights, ids,
                                               align, self.first_expert)
        if self.group is not None:      # expert parallel: every pair's output from its rank
            self.group.all_reduce(outputs)
        out = combine(outputs)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


def use_cpu_moe(model: nn.Module, max_rows: int) -> None:
    """A CPU engine's sparse blocks run steps of up to `max_rows` float32 rows through the C
    experts (kernels/cpu_moe.c), bigger ones through torch; 0: torch always. A decode step of a
    few rows is where one C call beats the torch path's handful of operations per touched
    expert; the choice depends on the step's shape alone, never on the machine's load, so greedy
    outputs do not change with it."""
    for module in model.modules():
        if isinstance(module, SparseMoeBlock):
            module.cpu_rows = max_rows

"""How a mixture-of-experts model's tokens spread over its experts, step by step.

Every sparse block adds its step's tokens per expert (the alignment's counts, already computed)
into running totals on the model's device, with no host round trip, so counting costs a
GPU step nothing and a CUDA graph replays it. The totals are read when asked (`summary`,
`prometheus_lines` for GET /metrics).

Two figures describe the spread, per layer:

* **imbalance** = the busiest expert's tokens over the mean expert's, summed over steps
  (sum of each step's max / sum of each step's mean). 1.0 is a perfectly even split; top-k
  routing of B tokens over E experts cannot do better than its granularity (one token more on
  one expert); an expert-parallel step waits for its busiest rank, so this is the factor by
  which the busiest expert slows it;
* **experts touched** per step: the distinct experts a step's tokens chose, whose weights the
  step reads. Tokens routed uniformly at random touch E·(1 − (1 − k/E)^B) of them on average.
"""

from __future__ import annotations

import torch
from torch import nn

from minicb.model.moe import SparseMoeBlock


class ExpertLoad:
    def __init__(self, num_layers: int, num_experts: int, top_k: int, device: torch.device):
        self.num_experts, self.top_k = num_experts, top_k
        zeros = dict(dtype=torch.int64, device=device)
        self.tokens = torch.zeros(num_layers, num_experts, **zeros)   # since the last reset
        self.last = torch.zeros(num_layers, num_experts, **zeros)     # the last step's
        self.busiest = torch.zeros(num_layers, **zeros)   # sum over steps of the max expert's
        self.touched = torch.zeros(num_layers, **zeros)   # sum over steps of experts touched
        self.steps = torch.zeros(num_layers, **zeros)

    def record(self, layer: int, counts: torch.Tensor) -> None:
        """One sparse block's step: `counts` [num_experts], tokens routed to each expert."""
        self.tokens[layer] += counts
        self.last[layer] = counts
        self.busiest[layer] += counts.max()
        self.touched[layer] += (counts > 0).sum()
        self.steps[layer] += 1

    def reset(self) -> None:
        for tensor in (self.tokens, self.last, self.busiest, self.touched, self.steps):
            tensor.zero_()

    def summary(self) -> dict:
        """Per sparse layer (lists in layer order): tokens per expert since the reset, the last
        step's, the imbalance and the mean experts touched per step; `steps`, and the worst
        layer's imbalance."""
        steps = self.steps.clamp(min=1).double()
        routed = self.tokens.sum(-1).double()
        mean_per_step = routed / self.num_experts          # sum over steps of the mean expert's
        imbalance = torch.where(routed > 0, self.busiest.double() / mean_per_step.clamp(min=1e-9),
                                torch.zeros_like(routed))
        return {"steps": int(self.steps.max()) if self.steps.numel() else 0,
                "num_experts": self.num_experts, "top_k": self.top_k,
                "tokens_per_expert": self.tokens.tolist(), "last_step": self.last.tolist(),
                "imbalance": imbalance.tolist(),
                "experts_touched_per_step": (self.touched.double() / steps).tolist(),
                "worst_imbalance": float(imbalance.max()) if imbalance.numel() else 0.0}

    def prometheus_lines(self) -> list[str]:
        """The totals in Prometheus' text format: a counter of tokens per (layer, expert), a
        gauge of each layer's imbalance and experts touched per step."""
        s = self.summary()
        lines = ["# HELP minicb_moe_expert_tokens_total Tokens routed to each expert "
                 "(each token counts once per expert it chose).",
                 "# TYPE minicb_moe_expert_tokens_total counter"]
        lines += [f'minicb_moe_expert_tokens_total{{layer="{layer}",expert="{expert}"}} {n}'
                  for layer, row in enumerate(s["tokens_per_expert"]) for expert, n in
                  enumerate(row)]
        for name, key, text in (
                ("minicb_moe_imbalance", "imbalance", "Busiest expert's tokens over the mean "
                 "expert's, per step, summed over steps (1 = even)."),
                ("minicb_moe_experts_touched", "experts_touched_per_step",
                 "Distinct experts a step's tokens chose, mean per step.")):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
            lines += [f'{name}{{layer="{layer}"}} {value}' for layer, value in enumerate(s[key])]
        return lines


def attach_expert_load(model: nn.Module) -> ExpertLoad | None:
    """Give every sparse block of `model` a row of one shared ExpertLoad, kept as
    `model.expert_load` (None for a dense model)."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    load = None
    if blocks:
        moe = blocks[0].moe
        load = ExpertLoad(len(blocks), moe.num_experts, moe.top_k, blocks[0].w_down.device)
        for row, block in enumerate(blocks):
            block.load, block.load_row = load, row
    model.expert_load = load
    return load


def expert_load_of(engine) -> ExpertLoad | None:
    """An engine's model's ExpertLoad, or None (a dense model, or an engine without a model)."""
    return getattr(getattr(engine, "model", None), "expert_load", None)

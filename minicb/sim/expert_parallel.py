"""The sparse layers of a decode step on GPUs, one GPU or expert-parallel over n: the expert
weights the step reads and the all-to-all that carries tokens to their experts and back.

A decode step's sparse layer is memory-bound: its time is the bytes of the experts its B tokens
touched over the memory's bandwidth. Tokens routed independently and uniformly touch

    E · (1 − (1 − k/E)^B)      experts on one GPU holding all E of them,

so one GPU reads nearly every expert once B is a few times E/k. Split over n GPUs (each holds E/n
experts; attention data-parallel, B/n requests per GPU), each GPU reads only its own experts'
share of that, but every token's k hidden vectors go to their experts' GPUs and come back: two
all-to-alls, each GPU sending (n − 1)/n of its B/n · k vectors. The busiest GPU sets the step's
pace, so a routing imbalance (busiest expert over the mean) multiplies the expert reads;
replicating hot experts on several GPUs (DeepSeek's EPLB) is what brings that factor back toward
one (`placement_imbalance` computes it for measured per-expert loads). Inputs are cited facts
(minicb/facts.py): Qwen3-30B-A3B's shape, the A100's memory and NVLink bandwidths, NCCL's
per-message latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicb.facts import fact
from minicb.sim.parallel import A100_HBM_BANDWIDTH, NVLINK, Link


@dataclass(frozen=True)
class MoeShape:
    name: str
    layers: int
    hidden_size: int
    experts: int
    top_k: int
    expert_size: int
    dtype_bytes: int = 2            # bf16

    @property
    def expert_bytes(self) -> int:
        """One expert's gate, up and down matrices."""
        return 3 * self.hidden_size * self.expert_size * self.dtype_bytes


def _shape(prefix: str, name: str) -> MoeShape:
    value = lambda row: int(fact(f"{prefix}_{row}").value)
    return MoeShape(name, value("layers"), value("hidden_size"), value("experts"),
                    value("experts_per_token"), value("expert_size"))


QWEN3_30B_A3B = _shape("qwen3_30b_a3b", "Qwen3-30B-A3B bf16")


def experts_touched(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens choose, each its top_k of `experts` uniformly."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def ep_decode_parts(shape: MoeShape, batch: int, n: int = 1, link: Link = NVLINK,
                    hbm_bandwidth: float = A100_HBM_BANDWIDTH,
                    imbalance: float = 1.0) -> dict[str, float]:
    """Seconds the sparse layers of one decode step of `batch` rows take on the busiest of n
    GPUs: `experts` (reading the touched experts' weights, times the imbalance factor), and
    `all_to_all` (dispatch and combine, zero on one GPU); `touched_per_gpu` per layer."""
    if n < 1 or shape.experts % n:
        raise ValueError(f"n={n} GPUs cannot hold {shape.experts} experts evenly.")
    if imbalance < 1:
        raise ValueError(f"imbalance={imbalance} is below 1: the busiest GPU has at least the "
                         "mean load.")
    touched = experts_touched(shape.experts, shape.top_k, batch) / n
    reads = shape.layers * touched * shape.expert_bytes * imbalance / hbm_bandwidth
    exchange = 0.0
    if n > 1:   # each GPU sends its rows' k vectors to the other GPUs' experts, and back
        sent = batch / n * shape.top_k * shape.hidden_size * shape.dtype_bytes * (n - 1) / n
        exchange = shape.layers * 2 * (link.latency + sent / link.bandwidth)
    return {"experts": reads, "all_to_all": exchange, "touched_per_gpu": touched,
            "total": reads + exchange}


def placement_imbalance(loads: list[float], n: int, redundant: int = 0,
                        balanced: bool = False) -> float:
    """The busiest GPU's tokens over the mean GPU's, for per-expert token counts `loads` placed
    on n GPUs with (len(loads) + redundant) / n expert slots each.

    Without `balanced`, expert e sits on GPU e // (E / n), as minicb's split_experts places it.
    With it, DeepSeek's EPLB idea: the `redundant` extra slots go one by one to the expert with
    the most tokens per copy (its tokens shared evenly between its copies), then the copies,
    heaviest first, each go to the least loaded GPU that has a free slot."""
    experts = len(loads)
    if n < 1 or (experts + redundant) % n:
        raise ValueError(f"{experts} experts and {redundant} redundant copies do not fill "
                         f"{n} GPUs' slots evenly.")
    if redundant and not balanced:
        raise ValueError("redundant copies need balanced=True: contiguous placement has none.")
    per_gpu = [0.0] * n
    if not balanced:
        for expert, load in enumerate(loads):
            per_gpu[expert * n // experts] += load
    else:
        copies = [1] * experts
        for _ in range(redundant):
            hottest = max(range(experts), key=lambda e: loads[e] / copies[e])
            copies[hottest] += 1
        items = sorted((loads[e] / copies[e] for e in range(experts) for _ in range(copies[e])),
                       reverse=True)
        slots = [(experts + redundant) // n] * n
        for load in items:
            gpu = min((g for g in range(n) if slots[g]), key=lambda g: per_gpu[g])
            per_gpu[gpu] += load
            slots[gpu] -= 1
    mean = sum(per_gpu) / n
    return max(per_gpu) / mean if mean else 1.0

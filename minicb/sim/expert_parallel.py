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
one (`placement_imbalance` computes it for measured per-expert loads).

`ep_layer_under_load` prices one layer from per-expert token counts instead of an average: each
GPU reads the copies its tokens touched or computes its tokens, whichever is longer, then
exchanges its tokens; `skewed_loads` draws the counts of a skewed workload (a Zipf law over the
experts), and `eplb_scenarios` sets contiguous, balanced and redundant placements side by side.
Inputs are cited facts (minicb/facts.py): Qwen3-30B-A3B's shape, the A100's memory and NVLink
bandwidths and bf16 peak, NCCL's per-message latency, DeepSeek-V3's share of redundant experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minicb.facts import fact
from minicb.sim.parallel import A100_HBM_BANDWIDTH, NVLINK, Link

A100_FP16_FLOPS = fact("a100_fp16_tflops").value * 1e12      # dense bf16 Tensor Core peak


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


def place(loads: list[float], n: int, redundant: int = 0,
          balanced: bool = False) -> list[list[float]]:
    """Each of n GPUs' expert copies, as the tokens each copy serves, for per-expert token counts
    `loads` placed with (len(loads) + redundant) / n expert slots per GPU.

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
    gpus: list[list[float]] = [[] for _ in range(n)]
    if not balanced:
        for expert, load in enumerate(loads):
            gpus[expert * n // experts].append(load)
        return gpus
    copies = [1] * experts
    for _ in range(redundant):
        hottest = max(range(experts), key=lambda e: loads[e] / copies[e])
        copies[hottest] += 1
    items = sorted((loads[e] / copies[e] for e in range(experts) for _ in range(copies[e])),
                   reverse=True)
    slots = (experts + redundant) // n
    for load in items:
        gpu = min((g for g in range(n) if len(gpus[g]) < slots), key=lambda g: sum(gpus[g]))
        gpus[gpu].append(load)
    return gpus


def placement_imbalance(loads: list[float], n: int, redundant: int = 0,
                        balanced: bool = False) -> float:
    """The busiest GPU's tokens over the mean GPU's, for the placement `place` makes."""
    per_gpu = [sum(copies) for copies in place(loads, n, redundant, balanced)]
    mean = sum(per_gpu) / n
    return max(per_gpu) / mean if mean else 1.0


def expert_imbalance(loads: list[float]) -> float:
    """The imbalance figure of one step's routing: the busiest expert's tokens over the mean
    expert's (1: perfectly even; what /metrics reports per layer)."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


def skewed_loads(experts: int, top_k: int, tokens: int, skew: float,
                 seed: int = 0) -> list[int]:
    """Per-expert token counts of a step whose `tokens` tokens each choose top_k distinct
    experts, expert i's popularity proportional to 1 / rank_i^skew (a Zipf law over ranks
    shuffled across the ids, so hot experts land anywhere); skew 0 is uniform routing. A skewed
    workload is one whose tokens (a language, a task) keep preferring the same few experts."""
    rng = np.random.default_rng(seed)
    popularity = rng.permutation(np.arange(1, experts + 1, dtype=np.float64) ** -skew)
    # weighted sampling without replacement (Efraimidis and Spirakis): the k largest u^(1/w)
    keys = rng.random((tokens, experts)) ** (1 / popularity)
    chosen = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
    return np.bincount(chosen.ravel(), minlength=experts).tolist()


def ep_layer_under_load(shape: MoeShape, loads: list[float], n: int, redundant: int = 0,
                        balanced: bool = False, link: Link = NVLINK,
                        hbm_bandwidth: float = A100_HBM_BANDWIDTH,
                        flops: float = A100_FP16_FLOPS) -> dict[str, float]:
    """One sparse layer's seconds on each of n GPUs, for a step whose per-expert token counts
    are `loads`, and the busiest GPU's, which sets the step's pace. A GPU reads the weights of
    every copy it holds that got a token, and computes its tokens (2 · 3 · hidden · expert_size
    FLOPs each), taking the longer of the two (reading and computing overlap); it receives its
    tokens' hidden vectors from the other GPUs and sends the outputs back (two all-to-alls, its
    (n − 1)/n share crossing the link)."""
    gpus = place(loads, n, redundant, balanced)
    flop = 2 * 3 * shape.hidden_size * shape.expert_size
    vector = shape.hidden_size * shape.dtype_bytes
    times = []
    for copies in gpus:
        tokens = sum(copies)
        read = sum(c > 0 for c in copies) * shape.expert_bytes / hbm_bandwidth
        compute = tokens * flop / flops
        exchange = 2 * (link.latency + tokens * (n - 1) / n * vector / link.bandwidth) \
            if n > 1 else 0.0
        times.append({"read": read, "compute": compute, "all_to_all": exchange,
                      "total": max(read, compute) + exchange, "tokens": tokens})
    busiest = max(times, key=lambda t: t["total"])
    mean = sum(t["total"] for t in times) / n
    return {**busiest, "imbalance": placement_imbalance(loads, n, redundant, balanced),
            "slowest_over_mean": busiest["total"] / mean}


# DeepSeek-V3's share of redundant slots: 32 extra copies for its 256 routed experts
REDUNDANT_SHARE = fact("deepseek_v3_redundant_experts").value / \
    fact("deepseek_v3_routed_experts").value


def eplb_scenarios(shape: MoeShape = QWEN3_30B_A3B, n: int = 8, tokens: int = 4096,
                   skews: tuple[float, ...] = (0.0, 0.6, 1.2), seed: int = 0) -> list[dict]:
    """For each skew: the experts' imbalance figure, and one sparse layer on n GPUs (`tokens`
    tokens in the step, spread data-parallel) placed contiguously, balanced, and balanced with
    DeepSeek-V3's share of redundant slots (REDUNDANT_SHARE of the experts, rounded to fill the
    GPUs evenly): the busiest GPU's tokens over the mean and its microseconds."""
    redundant = round(shape.experts * REDUNDANT_SHARE / n) * n
    rows = []
    for skew in skews:
        loads = skewed_loads(shape.experts, shape.top_k, tokens, skew, seed)
        row = {"skew": skew, "tokens": tokens, "gpus": n, "redundant": redundant,
               "expert_imbalance": expert_imbalance(loads)}
        for name, extra, balanced in (("contiguous", 0, False), ("balanced", 0, True),
                                      ("eplb", redundant, True)):
            parts = ep_layer_under_load(shape, loads, n, extra, balanced)
            row[name] = {"imbalance": parts["imbalance"], "layer_us": parts["total"] * 1e6,
                         "all_to_all_us": parts["all_to_all"] * 1e6}
        rows.append(row)
    return rows

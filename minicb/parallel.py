"""Many GPUs for one model, in the cost model: what crosses a link, and how long it takes.

Two ways a serving system spends a link between GPUs:

* prefill/decode disaggregation moves each request's KV cache from the GPU that computed its
  prompt to the GPU that decodes it: per token, K and V for every layer and KV head,
  `2 x layers x kv_heads x head_dim x bytes per value`, sent at the link's bandwidth after its
  latency;
* tensor parallelism (Megatron-LM's split) cuts every weight matrix n ways: each GPU reads 1/n of
  the weights and 1/n of the KV cache per step, but every layer ends its attention and its MLP
  with an all-reduce of the step's activations (`hidden_size x tokens x bytes`). A ring
  all-reduce (a reduce-scatter, then an all-gather) sends `2(n-1)/n` of the message over each
  GPU's link in `2(n-1)` hops, each hop paying the link's latency; NCCL's own latency model adds
  a base latency per call.

`tp_cost_model` folds both sides of tensor parallelism into the four terms of
`minicb.sim.CostModel` (the all-reduce is a fixed latency per step plus a cost per token, so it
fits them exactly), and the same scheduler runs on a TP group as on one GPU. Every input is a
cited fact (`minicb.facts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from minicb.facts import fact
from minicb.sim.cost_model import CostModel


@dataclass(frozen=True)
class ModelShape:
    """What the cost of moving and splitting a model depends on."""

    name: str
    params: int
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2            # fp16 / bf16

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token, every layer and KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes


@dataclass(frozen=True)
class Link:
    """A link between two GPUs: bytes per second in one direction, and seconds per message."""

    name: str
    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or self.latency < 0:
            raise ValueError(f"link {self.name!r} needs a bandwidth > 0 and a latency >= 0 (got "
                             f"{self.bandwidth!r} B/s, {self.latency!r} s).")


def transfer_time(num_bytes: float, link: Link) -> float:
    """One message of `num_bytes` over `link`: its latency, then the bytes at its bandwidth."""
    return link.latency + num_bytes / link.bandwidth


def kv_transfer_time(shape: ModelShape, num_tokens: int, link: Link) -> float:
    """Moving the KV cache of `num_tokens` tokens from one GPU to another."""
    return transfer_time(shape.kv_bytes_per_token * num_tokens, link)


def ring_allreduce_time(num_bytes: float, n: int, link: Link, base_latency: float = 0.0) -> float:
    """A ring all-reduce of a `num_bytes` message over n GPUs: 2(n-1) hops, each GPU sending
    2(n-1)/n of the message. One GPU has nothing to reduce."""
    if n < 1:
        raise ValueError(f"a ring needs at least one GPU (got n={n}).")
    if n == 1:
        return 0.0
    return base_latency + 2 * (n - 1) * link.latency + 2 * (n - 1) / n * num_bytes / link.bandwidth


def weight_read_time(shape: ModelShape, hbm_bandwidth: float) -> float:
    """Seconds to stream every weight from memory once: the floor of a memory-bound decode step."""
    return shape.weight_bytes / hbm_bandwidth


# --- the cited inputs ----------------------------------------------------------------------------
def model_shape(prefix: str, name: str) -> ModelShape:
    """A model's shape from the facts table's `<prefix>_params`, `_layers`, ... rows."""
    value = lambda row: int(fact(f"{prefix}_{row}").value)
    return ModelShape(name, value("params"), value("layers"), value("hidden_size"),
                      value("kv_heads"), value("head_dim"))


LLAMA2_7B = model_shape("llama2_7b", "Llama-2-7B fp16")
LLAMA2_70B = model_shape("llama2_70b", "Llama-2-70B fp16")
A100_HBM_BANDWIDTH = fact("a100_hbm_bandwidth").value * 1e9          # B/s
A100_MEMORY = fact("a100_memory").value * 1e9                         # bytes
MEMORY_UTILISATION = fact("vllm_gpu_memory_utilization").value       # share of it a server takes
NCCL_BASE_LATENCY = fact("nccl_ring_base_latency").value * 1e-6       # s per all-reduce
# data sheets give both directions together; a ring sends one way on each link at a time
NVLINK = Link("NVLink (A100)", fact("a100_nvlink_bandwidth").value / 2 * 1e9,
              fact("nccl_hop_latency_nvlink").value * 1e-6)
PCIE = Link("PCIe Gen4 x16", fact("a100_pcie_bandwidth").value / 2 * 1e9,
            fact("nccl_hop_latency_pcie").value * 1e-6)
INFINIBAND = Link("InfiniBand HDR", fact("infiniband_hdr_bandwidth").value / 8 * 1e9,
                  fact("nccl_hop_latency_network").value * 1e-6)
ETHERNET_25G = Link("25 Gb/s Ethernet", fact("ethernet_25g_bandwidth").value / 8 * 1e9,
                    fact("nccl_hop_latency_network").value * 1e-6)
LINKS = {"nvlink": NVLINK, "pcie": PCIE, "infiniband": INFINIBAND, "ethernet": ETHERNET_25G}


# --- tensor parallelism in the cost model --------------------------------------------------------
def tp_step_parts(base: CostModel, shape: ModelShape, n: int, link: Link, prefill_tokens: int,
                  decode_rows: int, context_tokens: int = 0,
                  hbm_bandwidth: float = A100_HBM_BANDWIDTH,
                  base_latency: float = NCCL_BASE_LATENCY) -> dict[str, float]:
    """One step of a TP group of n GPUs, in seconds, by where the time goes.

    `base` is the one-GPU cost model of `shape`. Its step overhead is split into the weights'
    read (`weight_read_time`: shrinks n-fold, each GPU holds 1/n of every matrix) and the rest
    (kernel launches, the host's work: every GPU still launches every kernel, so it stays). Prompt
    tokens, decode rows and keys read shrink n-fold (each GPU computes 1/n of the heads and of
    the MLP, and keeps 1/n of the KV heads). Each layer adds two all-reduces of the step's
    activations."""
    weights = weight_read_time(shape, hbm_bandwidth)
    if weights > base.step_overhead * (1 + 1e-9):
        raise ValueError(f"{base.name or 'the cost model'} charges {base.step_overhead:.4g} s per "
                         f"step, less than reading {shape.name}'s weights ({weights:.4g} s): it is "
                         "not this model's cost model.")
    tokens = prefill_tokens + decode_rows
    message = shape.hidden_size * tokens * shape.dtype_bytes
    return {"fixed": base.step_overhead - weights, "weights": weights / n,
            "compute": (base.prefill_token * prefill_tokens + base.decode_seq * decode_rows) / n,
            "kv read": base.context_token * context_tokens / n,
            "all-reduce": 2 * shape.layers * ring_allreduce_time(message, n, link, base_latency)}


def tp_cost_model(base: CostModel, shape: ModelShape, n: int, link: Link,
                  hbm_bandwidth: float = A100_HBM_BANDWIDTH,
                  base_latency: float = NCCL_BASE_LATENCY) -> CostModel:
    """The four cost-model terms of a TP group of n GPUs (see `tp_step_parts`); n = 1 is `base`.

    The all-reduces cost `2 x layers x (base latency + 2(n-1) hop latencies)` per step and
    `2 x layers x 2(n-1)/n x hidden x bytes / bandwidth` per token the step carries."""
    if n == 1:
        return base
    empty = tp_step_parts(base, shape, n, link, 0, 0, 0, hbm_bandwidth, base_latency)
    per_token = 2 * shape.layers * 2 * (n - 1) / n * shape.hidden_size * shape.dtype_bytes \
        / link.bandwidth
    return CostModel(step_overhead=sum(empty.values()),
                     prefill_token=base.prefill_token / n + per_token,
                     decode_seq=base.decode_seq / n + per_token,
                     context_token=base.context_token / n,
                     name=f"{base.name}, TP={n} over {link.name}", unit=base.unit)


def scaled_cost_model(base: CostModel, base_shape: ModelShape, shape: ModelShape,
                      hbm_bandwidth: float = A100_HBM_BANDWIDTH) -> CostModel:
    """A one-GPU cost model for a bigger model, extrapolated from `base` (an estimate, not a
    measurement): the weights' read from the new weight bytes, the rest of the overhead by the
    number of layers (kernel launches), prompt tokens and decode rows by the parameter count
    (FLOPs per token), keys read by the KV bytes per token."""
    weights = weight_read_time(base_shape, hbm_bandwidth)
    params = shape.params / base_shape.params
    return CostModel(step_overhead=(base.step_overhead - weights) * shape.layers / base_shape.layers
                     + weight_read_time(shape, hbm_bandwidth),
                     prefill_token=base.prefill_token * params,
                     decode_seq=base.decode_seq * params,
                     context_token=base.context_token * shape.kv_bytes_per_token
                     / base_shape.kv_bytes_per_token,
                     name=f"{shape.name} (scaled from {base.name})", unit=base.unit)


def kv_blocks_per_gpu(shape: ModelShape, n: int = 1, block_size: int = 16,
                      memory: float = A100_MEMORY,
                      utilisation: float = MEMORY_UTILISATION) -> int:
    """KV blocks one GPU of a TP group of n can hold: `utilisation` of its memory, less its 1/n of
    the weights, in blocks of `block_size` tokens of its 1/n of the KV heads (`utilisation`:
    vLLM's default share). Zero when the weights do not fit."""
    free = memory * utilisation - shape.weight_bytes / n
    return max(int(free // (shape.kv_bytes_per_token / n * block_size)), 0)

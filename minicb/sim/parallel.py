"""Many GPUs for one model, in the cost model: what crosses a link, and how long it takes.

Two ways a serving system spends a link between GPUs:

* prefill/decode disaggregation moves each request's KV cache from the GPU that computed its
  prompt to the GPU that decodes it: per token, K and V for every layer and KV head,
  `2 x layers x kv_heads x head_dim x bytes per value`, sent at the link's bandwidth after its
  latency;
* tensor parallelism (Megatron-LM's split) cuts every weight matrix n ways: each GPU reads 1/n of
  the weights and 1/n of the KV cache per step, but every layer ends its attention and its MLP
  with an all-reduce of the step's activations (`hidden_size x tokens x bytes`).

How long an all-reduce takes depends on who runs it and on the message's size. NCCL's ring (a
reduce-scatter, then an all-gather) sends `2(n-1)/n` of the message over each GPU's link in
`2(n-1)` hops; NCCL's own model prices each of its three protocols (a base latency, a latency
per hop, a share of the link's bandwidth) and runs the fastest: LL for a decode step's small
messages (a fraction of a microsecond per NVLink hop), Simple for a prefill's large ones. Inside
one node whose GPUs all reach each other through NVSwitch, vLLM does not use NCCL for these at
all: its custom all-reduce is one kernel in which, for small messages, every GPU reads its
peers' messages at once (one-shot): no chain of hops, so its latency barely grows with n.
`allreduce_time` picks what vLLM would run; its latencies are the published measurements
(`minicb.facts`). vLLM's kernel was measured on H100s; where this module prices A100 links with
it, those are H100 figures standing in for A100 ones (no A100 measurement is published).

Between two processes on one CPU host, minicb's ranks run gloo: `gloo_allreduce_time`
interpolates gloo's all-reduce as measured on the book's machine (`benchmarks/results/
gloo_allreduce.json`, copied into the facts), so the same `tp_step_parts` predicts a CPU run.

`tp_cost_model` adds the all-reduces to the four terms of `minicb.sim.CostModel`, and the same
scheduler runs on a TP group as on one GPU. Every input is a cited fact (`minicb.facts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from minicb.facts import KIB, fact
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
    """A link between two GPUs: bytes per second in one direction, seconds per message, and its
    kind ("nvlink", "pcie" or "network"), which decides NCCL's per-hop latencies and whether a
    node's GPUs all reach each other through a switch (NVLink: vLLM's custom all-reduce)."""

    name: str
    bandwidth: float
    latency: float
    kind: str = "nvlink"

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


@dataclass(frozen=True)
class Protocol:
    """One of NCCL's protocols: a base latency per call, a latency per hop by link kind, and the
    share of the link's bandwidth it reaches (LL and LL128 send flags with the data)."""

    name: str
    base_latency: float
    hop_latency: dict[str, float] = field(hash=False)
    bandwidth_share: float = 1.0


def _us(name: str) -> float:
    return fact(name).value * 1e-6


NCCL_PROTOCOLS = (
    Protocol("LL", _us("nccl_ll_base_latency"),
             {kind: _us(f"nccl_ll_hop_latency_{kind}") for kind in ("nvlink", "pcie", "network")},
             fact("nccl_ll_bandwidth_share").value),
    # LL128 is enabled by default only over NVLink
    Protocol("LL128", _us("nccl_ll128_base_latency"),
             {"nvlink": _us("nccl_ll128_hop_latency_nvlink")},
             fact("nccl_ll128_bandwidth_share").value),
    Protocol("Simple", _us("nccl_ring_base_latency"),
             {kind: _us(f"nccl_hop_latency_{kind}") for kind in ("nvlink", "pcie", "network")}),
)


def nccl_allreduce_time(num_bytes: float, n: int, link: Link) -> tuple[float, str]:
    """NCCL's ring all-reduce with the protocol its own model finds fastest for this message:
    (seconds, protocol name)."""
    times = [(ring_allreduce_time(num_bytes, n, Link(link.name, link.bandwidth * p.bandwidth_share,
                                                       p.hop_latency[link.kind], link.kind),
                                  p.base_latency), p.name)
             for p in NCCL_PROTOCOLS if link.kind in p.hop_latency]
    return min(times)


# vLLM's custom all-reduce, measured (H100s on NVSwitch): the time at 4 KiB and at 1 MiB per TP
# degree, a straight line in bytes between them. vLLM uses it up to 8 MiB; past the measured 1 MiB
# this model hands the message to NCCL's instead of extrapolating
CUSTOM_ALLREDUCE = {n: (_us(f"vllm_custom_allreduce_tp{n}_4kib"),
                        _us(f"vllm_custom_allreduce_tp{n}_1mib")) for n in (2, 4, 8)}
CUSTOM_ALLREDUCE_MAX_BYTES = 1024 * KIB


def custom_allreduce_time(num_bytes: float, n: int) -> float:
    """vLLM's custom all-reduce of `num_bytes` over n GPUs of one NVSwitch node, interpolated from
    its measured times (one-shot below `vllm_custom_allreduce_one_shot_max_*`, two-shot above:
    the measurements span both; they include the kernel's launch, which a CUDA graph hides)."""
    small, large = CUSTOM_ALLREDUCE[n]
    return small + (large - small) * (num_bytes - 4 * KIB) / (1024 * KIB - 4 * KIB)


def allreduce_time(num_bytes: float, n: int, link: Link) -> float:
    """One all-reduce as vLLM runs it: its custom kernel inside an NVLink node, for the sizes and
    TP degrees it supports, and NCCL's fastest protocol otherwise."""
    if n == 1:
        return 0.0
    if link.kind == "nvlink" and n in CUSTOM_ALLREDUCE and num_bytes <= CUSTOM_ALLREDUCE_MAX_BYTES:
        return custom_allreduce_time(num_bytes, n)
    return nccl_allreduce_time(num_bytes, n, link)[0]


# gloo between two processes on the book's 2-core machine, measured: (bytes, seconds) per message
# size, a decode step's sizes and a prefill's (facts gloo_allreduce_*)
GLOO_SIZES = {"4kib": 4 * KIB, "32kib": 32 * KIB, "128kib": 128 * KIB, "1mib": 1024 * KIB,
              "8mib": 8192 * KIB}
GLOO_ALLREDUCE = tuple((size, _us(f"gloo_allreduce_{name}")) for name, size in GLOO_SIZES.items())


def gloo_allreduce_time(num_bytes: float, n: int = 2, link: Link | None = None,
                        table: tuple[tuple[int, float], ...] = GLOO_ALLREDUCE) -> float:
    """gloo's all-reduce of `num_bytes` between two processes on one host, from its measured
    times (`table`: (bytes, seconds), by size): a straight line between the two measured sizes
    around it, the smallest's time below them, and past the largest its time plus the rest at the
    bandwidth of the last segment. Measured for two ranks only; `link` is unused (the host is the
    link)."""
    if n == 1:
        return 0.0
    if n != 2:
        raise ValueError(f"gloo's all-reduce was measured between 2 processes, not {n}.")
    (small, small_time), (large, large_time) = table[0], table[-1]
    if num_bytes <= small:
        return small_time
    for (lo, lo_time), (hi, hi_time) in zip(table, table[1:]):
        if num_bytes <= hi:
            return lo_time + (hi_time - lo_time) * (num_bytes - lo) / (hi - lo)
    (lo, lo_time) = table[-2]
    return large_time + (num_bytes - large) * (large_time - lo_time) / (large - lo)


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
# data sheets give both directions together; a ring sends one way on each link at a time. A
# link's own latency is NCCL's Simple-protocol hop (a KV transfer is one large message)
NVLINK = Link("NVLink (A100)", fact("a100_nvlink_bandwidth").value / 2 * 1e9,
              _us("nccl_hop_latency_nvlink"), "nvlink")
PCIE = Link("PCIe Gen4 x16", fact("a100_pcie_bandwidth").value / 2 * 1e9,
            _us("nccl_hop_latency_pcie"), "pcie")
INFINIBAND = Link("InfiniBand HDR", fact("infiniband_hdr_bandwidth").value / 8 * 1e9,
                  _us("nccl_hop_latency_network"), "network")
ETHERNET_25G = Link("25 Gb/s Ethernet", fact("ethernet_25g_bandwidth").value / 8 * 1e9,
                    _us("nccl_hop_latency_network"), "network")
LINKS = {"nvlink": NVLINK, "pcie": PCIE, "infiniband": INFINIBAND, "ethernet": ETHERNET_25G}


# --- tensor parallelism in the cost model --------------------------------------------------------
AllReduce = Callable[[float, int, Link], float]      # (bytes, GPUs, link) -> seconds


def tp_step_parts(base: CostModel, shape: ModelShape, n: int, link: Link, prefill_tokens: int,
                  decode_rows: int, context_tokens: int = 0,
                  hbm_bandwidth: float = A100_HBM_BANDWIDTH,
                  allreduce: AllReduce = allreduce_time,
                  fixed: float | None = None, one_machine: bool = False) -> dict[str, float]:
    """One step of a TP group of n GPUs, in seconds, by where the time goes.

    `base` is the one-GPU cost model of `shape`. Its step overhead is split into a part that
    shrinks n-fold (each GPU holds 1/n of every matrix) and a part that stays ("fixed": every GPU
    still launches every kernel, the host still schedules and samples once). Where the split
    lies is an assumption, not a measurement: by default the shrinking part is the weights' read
    at the memory's peak bandwidth (`weight_read_time`) and the rest is fixed; but a real step
    reads its weights below peak, so part of that "fixed" rest is weight reading too and would
    shrink, and the default overstates what stays. Give `fixed` (seconds) where it was measured
    instead. Prompt tokens, decode rows and keys read shrink n-fold (each GPU computes 1/n of the
    heads and of the MLP, and keeps 1/n of the KV heads). Each layer adds two all-reduces of the
    step's activations (`allreduce`: what vLLM runs, by default).

    `one_machine=True` prices ranks that are slices of one machine, such as the cores of one CPU
    standing in for GPUs: `base` is then the machine's step on all of its cores, and a rank's
    1/n of the work runs on 1/n of the cores and of the one memory bus they share, so nothing
    shrinks and the split only adds its all-reduces. n GPUs each bring their own memory; n
    cores of one CPU do not."""
    weights = (weight_read_time(shape, hbm_bandwidth) if fixed is None
               else base.step_overhead - fixed)
    if weights > base.step_overhead * (1 + 1e-9) or weights < 0:
        raise ValueError(f"{base.name or 'the cost model'} charges {base.step_overhead:.4g} s per "
                         f"step, which does not hold a shrinking part of {weights:.4g} s for "
                         f"{shape.name}: it is not this model's cost model.")
    message = shape.hidden_size * (prefill_tokens + decode_rows) * shape.dtype_bytes
    share = 1 if one_machine else n
    return {"fixed": base.step_overhead - weights, "weights": weights / share,
            "compute": (base.prefill_token * prefill_tokens + base.decode_seq * decode_rows) / share,
            "kv read": base.context_token * context_tokens / share,
            "all-reduce": 2 * shape.layers * allreduce(message, n, link) if n > 1 else 0.0}


@dataclass
class TPCostModel(CostModel):
    """A TP group's step: the one-GPU terms divided over the group (`tp_cost_model`), plus the
    all-reduces, which are not linear in the step's tokens (a small step's cost is latency, a
    large one's bandwidth)."""

    allreduce_per_step: Callable[[int], float] = field(default=lambda tokens: 0.0, repr=False,
                                                       compare=False)

    def step_time(self, prefill_tokens: int, decode_rows: int, context_tokens: int = 0) -> float:
        return (super().step_time(prefill_tokens, decode_rows, context_tokens)
                + self.allreduce_per_step(prefill_tokens + decode_rows))


def tp_cost_model(base: CostModel, shape: ModelShape, n: int, link: Link,
                  hbm_bandwidth: float = A100_HBM_BANDWIDTH,
                  allreduce: AllReduce = allreduce_time) -> CostModel:
    """The cost model of a TP group of n GPUs (see `tp_step_parts`); n = 1 is `base`."""
    if n == 1:
        return base
    empty = tp_step_parts(base, shape, n, link, 0, 0, 0, hbm_bandwidth, allreduce)
    per_step = lambda tokens: 2 * shape.layers * allreduce(
        shape.hidden_size * tokens * shape.dtype_bytes, n, link) if tokens else 0.0
    return TPCostModel(step_overhead=empty["fixed"] + empty["weights"],
                       prefill_token=base.prefill_token / n, decode_seq=base.decode_seq / n,
                       context_token=base.context_token / n,
                       name=f"{base.name}, TP={n} over {link.name}", unit=base.unit,
                       allreduce_per_step=per_step)


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


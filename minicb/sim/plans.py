"""Splitting one model over a few GPUs, priced by `minicb.sim.parallel`'s cost model: tensor
parallelism (every layer split n ways) against pipeline parallelism (the layers in p stages, or
p stages of TP groups), compared fairly: at the same requests in flight, and only where the plan's
own KV budget holds them (a plan that does not fit is refused, never priced).
"""

from __future__ import annotations

from dataclasses import dataclass

from minicb.sim.cost_model import CostModel
from minicb.sim.parallel import (
    Link,
    ModelShape,
    kv_blocks_per_gpu,
    tp_cost_model,
    tp_step_parts,
    transfer_time,
)


def kv_tokens(shape: ModelShape, gpus: int, block_size: int = 16) -> int:
    """Tokens of KV a group of `gpus` holds when each GPU keeps 1/gpus of the weights and of every
    token's KV (TP: 1/n of the KV heads; PP: 1/p of the layers): the same for both splits."""
    return kv_blocks_per_gpu(shape, gpus, block_size) * block_size


@dataclass(frozen=True)
class Plan:
    """A split of one model over `gpus` GPUs serving `requests` decodes at once."""

    name: str
    gpus: int
    requests: int
    tpot: float                  # seconds between two tokens of one request

    @property
    def tokens_per_gpu(self) -> float:
        return self.requests / self.tpot / self.gpus


def _check_fits(shape: ModelShape, gpus: int, requests: int, context: int) -> None:
    held = kv_tokens(shape, gpus)
    if requests * context > held:
        raise ValueError(f"{requests} requests of {context} tokens need {requests * context:,} "
                         f"tokens of KV, and {gpus} GPUs holding {shape.name} hold {held:,}: price "
                         "a plan that fits (fewer requests, shorter contexts or more GPUs).")


def tp_plan(base: CostModel, shape: ModelShape, n: int, link: Link, requests: int,
            context: int) -> Plan:
    """TP over n GPUs: every request in one decode step (`tp_step_parts`)."""
    _check_fits(shape, n, requests, context)
    tpot = sum(tp_step_parts(base, shape, n, link, 0, requests, requests * context).values())
    return Plan(f"TP {n}", n, requests, tpot)


def pp_plan(base: CostModel, shape: ModelShape, p: int, link: Link, requests: int, context: int,
            micro_batches: int, tp: int = 1, tp_link: Link | None = None) -> Plan:
    """PP over p stages, each a TP group of `tp` GPUs joined by `tp_link` (one GPU by default),
    consecutive stages joined by `link`; the requests in `micro_batches` equal micro-batches. A
    stage's step on a micro-batch is 1/p of its group's step of those rows (it holds 1/p of the
    layers: of every part of the step, all-reduces included) and then one send of the rows'
    activations to the next stage. A micro-batch is back at the first stage after
    max(micro_batches, p) stage steps: with fewer micro-batches than stages, GPUs wait for each
    other (the bubble)."""
    _check_fits(shape, p * tp, requests, context)
    if requests % micro_batches:
        raise ValueError(f"{requests} requests do not split into {micro_batches} equal "
                         "micro-batches.")
    group = tp_cost_model(base, shape, tp, tp_link or link)
    rows = requests // micro_batches
    stage = (group.step_time(0, rows, rows * context) / p
             + transfer_time(rows * shape.hidden_size * shape.dtype_bytes, link))
    batches = f"{micro_batches} micro-batch{'es' if micro_batches > 1 else ''}"
    name = f"TP {tp} x PP {p}" if tp > 1 else f"PP {p}"
    return Plan(f"{name}, {batches}", p * tp, requests, max(micro_batches, p) * stage)

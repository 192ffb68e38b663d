"""Beyond one GPU, in the cost model: prefill/decode disaggregation against co-located serving
(DistServe's goodput), and what tensor parallelism's all-reduces cost a decode step.

Everything runs the real scheduler on `A100_LLAMA2_7B`, the cost model derived from published
A100 measurements of Llama-2-7B (`minicb.sim.calibrate`), in virtual seconds; links, model
shapes and memory come from the cited facts (`minicb.facts`). Three seeded workloads (chat-like,
long prompts with short answers, short prompts with short answers), each with a TTFT and a TPOT
target, arrive as Poisson processes for a fixed time (so a higher rate means more requests, and
a queue that grows has time to show it). Per system: the highest rate at which 90 % of requests
meet both targets, divided by its GPUs (per-GPU goodput); the same at tighter and looser
targets; the best disaggregated split over slower links. Then tensor parallelism: a decode step
and a prefill step of Llama-2-7B and of a 70B model (its cost model scaled from the 7B one) on
1, 2, 4 and 8 GPUs over NVLink, PCIe and InfiniBand, by where the time goes, and the simulated
TPOT of a chat workload on each group. `python -m minicb bench disagg` (minicb.bench.disagg) runs
these studies and writes their record and pictures.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from minicb.facts import fact
from minicb.metrics import percentiles
from minicb.sim import simulate
from minicb.sim.calibrate import A100_LLAMA2_7B
from minicb.sim.cluster import Pool, attainment_at_rate, max_rate_meeting
from minicb.sim.parallel import (
    LINKS,
    LLAMA2_7B,
    LLAMA2_70B,
    kv_blocks_per_gpu,
    kv_transfer_time,
    scaled_cost_model,
    tp_cost_model,
    tp_step_parts,
)
from minicb.sim.workload import (
    Workload,
    capped_exponential,
    fixed,
    poisson_arrivals,
    uniform_lengths,
)

GOAL = fact("distserve_slo_attainment").value / 100
RATES = (0.5, 1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96)   # requests/s, total
SLO_SCALES = (0.75, 1.0, 1.25, 1.5, 2.0)
TP_DEGREES = (1, 2, 4, 8)
TP_LINKS = ("nvlink", "pcie", "infiniband")


@dataclass(frozen=True)
class Task:
    """A workload and its targets (seconds)."""

    name: str
    prompts: tuple[int, int]          # uniform between
    output_mean: int                  # capped exponential
    output_cap: int
    slo_ttft: float
    slo_tpot: float
    description: str

    def workload(self, duration: float, rate: float) -> Workload:
        """The requests arriving in `duration` seconds at `rate` (at least MIN_REQUESTS): the
        first ones of one seeded draw, so every rate and system sees the same requests first."""
        n = max(MIN_REQUESTS, math.ceil(duration * rate))
        draw = _draw(self)
        if n > len(draw):
            raise ValueError(f"{n} requests asked of {self.name!r}, {len(draw)} drawn; shorten "
                             "--duration.")
        return fixed(self.name, draw.prompt_lens[:n], draw.output_lens[:n], self.description)


MIN_REQUESTS, MAX_REQUESTS = 50, 6000


@functools.cache
def _draw(task: Task, seed: int = 0) -> Workload:
    return fixed(task.name, uniform_lengths(MAX_REQUESTS, *task.prompts, seed),
                 capped_exponential(MAX_REQUESTS, task.output_mean, task.output_cap, seed + 1))


TASKS = {t.name: t for t in (
    Task("chat", (64, 1024), 128, 512, 0.25, 0.020,
         "prompts 64-1024, answers capped-exponential (mean 128, cap 512)"),
    Task("long prompts", (1024, 3072), 64, 256, 1.0, 0.030,
         "prompts 1024-3072, answers capped-exponential (mean 64, cap 256): summarising"),
    Task("short", (128, 512), 32, 128, 0.125, 0.020,
         "prompts 128-512, answers capped-exponential (mean 32, cap 128): completing code"),
)}


def knobs(max_num_batched_tokens: int = 2048) -> dict:
    """One A100 running Llama-2-7B: KV blocks from its memory, up to 128 requests a step."""
    return dict(max_num_seqs=128, max_num_batched_tokens=max_num_batched_tokens,
                num_kv_blocks=kv_blocks_per_gpu(LLAMA2_7B), block_size=16)


def systems(link_name: str = "nvlink") -> dict[str, tuple[int, dict]]:
    """name -> (GPUs, simulate_cluster's arguments)."""
    cost, link = A100_LLAMA2_7B, LINKS[link_name]

    def split(p: int, d: int) -> tuple[int, dict]:
        return p + d, dict(prefill=Pool(p, cost, knobs()), decode=Pool(d, cost, knobs()),
                           shape=LLAMA2_7B, link=link)

    return {"co-located x2": (2, dict(colocated=Pool(2, cost, knobs()))),
            "co-located x2, chunks of 512": (2, dict(colocated=Pool(2, cost, knobs(512)))),
            "1P1D": split(1, 1), "2P1D": split(2, 1), "1P2D": split(1, 2)}


def attainment(task: Task, rate: float, duration: float, cluster: dict,
               scale: float = 1.0) -> float:
    """SLO attainment of `duration` seconds of the task's requests arriving at `rate`."""
    return attainment_at_rate(task.workload(duration, rate), rate, task.slo_ttft * scale,
                              task.slo_tpot * scale, **cluster)


def goodput(task: Task, duration: float, gpus: int, cluster: dict, scale: float = 1.0) -> dict:
    """The highest rate meeting the goal at `scale` x the task's targets, per GPU."""
    best, tried = max_rate_meeting(lambda rate: attainment(task, rate, duration, cluster, scale),
                                   RATES, GOAL)
    capped = best >= max(RATES)     # met at the top of the scan: the true goodput is higher
    return {"max_rate": best, "per_gpu": best / gpus, "gpus": gpus, "capped": capped,
            "tried": tried}


def attainment_curve(task: Task, duration: float, gpus: int, cluster: dict,
                     per_gpu_rates: list[float]) -> list[tuple[float, float]]:
    return [(r, attainment(task, r * gpus, duration, cluster)) for r in per_gpu_rates]


def disaggregation(duration: float, scales: tuple[float, ...], progress: bool = True) -> dict:
    rows, curves, links, scale_rows = [], [], [], []
    say = print if progress else (lambda *a, **k: None)
    for task in TASKS.values():
        found = {}
        for name, (gpus, cluster) in systems().items():
            found[name] = goodput(task, duration, gpus, cluster)
            rows.append({"workload": task.name, "system": name, "link": "nvlink",
                         **found[name]})
            say(f"{task.name:>13} {name:<29} {found[name]['per_gpu']:6.2f} req/s per GPU",
                flush=True)
        colocated = max((s for s in found if s.startswith("co-located")),
                        key=lambda s: found[s]["per_gpu"])
        split = max((s for s in found if "P" in s), key=lambda s: found[s]["per_gpu"])
        top = max(found[colocated]["per_gpu"], found[split]["per_gpu"], 0.5)
        grid = [round(top * k / 8, 3) for k in range(1, 13)]
        for name in (colocated, split):
            gpus, cluster = systems()[name]
            curves.append({"workload": task.name, "system": name,
                           "points": attainment_curve(task, duration, gpus, cluster, grid)})
        mean_prompt = sum(task.prompts) / 2
        for link in LINKS:
            gpus, cluster = systems(link)[split]
            result = found[split] if link == "nvlink" else goodput(task, duration, gpus, cluster)
            links.append({"workload": task.name, "system": split, "link": link,
                          "transfer_s_mean_prompt": kv_transfer_time(LLAMA2_7B,
                                                                     round(mean_prompt),
                                                                     LINKS[link]),
                          **result})
            say(f"{task.name:>13} {split} over {link:<10} {result['per_gpu']:6.2f} req/s per GPU",
                flush=True)
        for scale in scales:
            for name in (colocated, split):
                gpus, cluster = systems()[name]
                result = (found[name] if scale == 1.0 else
                          goodput(task, duration, gpus, cluster, scale))
                scale_rows.append({"workload": task.name, "system": name, "scale": scale,
                                   **result})
    return {"goodput": rows, "curves": curves, "links": links, "slo_scale": scale_rows}


def tensor_parallel(duration: float) -> list[dict]:
    """Per model, link and TP degree: a decode step (32 rows of 1,024 keys) and a 2,048-token
    prefill step by part, and the chat workload's simulated TPOT p50/p95 on that group (at a rate
    one group of two serves without a queue of prompts: 4 requests/s for 7B, 1 for 70B)."""
    base = A100_LLAMA2_7B
    models = {LLAMA2_7B.name: (LLAMA2_7B, base, 4.0),
              LLAMA2_70B.name: (LLAMA2_70B, scaled_cost_model(base, LLAMA2_7B, LLAMA2_70B), 1.0)}
    rows = []
    for model, (shape, cost, rate) in models.items():
        chat = TASKS["chat"].workload(duration, rate)
        timed = chat.with_arrivals(poisson_arrivals(len(chat), rate, seed=0))
        for link_name in TP_LINKS:
            link = LINKS[link_name]
            for degree in TP_DEGREES:
                blocks = kv_blocks_per_gpu(shape, degree)
                row = {"model": model, "link": link_name, "tp": degree, "kv_blocks": blocks,
                       "fits": blocks > 0,
                       "decode_parts": tp_step_parts(cost, shape, degree, link, 0, 32, 32 * 1024),
                       "prefill_parts": tp_step_parts(cost, shape, degree, link, 2048, 0, 0)}
                if blocks > 0:
                    result = simulate(timed, cost=tp_cost_model(cost, shape, degree, link),
                                      **{**knobs(), "num_kv_blocks": blocks})
                    tpot = percentiles(m.tpot for m in result.metrics)
                    row.update(sim_rate=rate, tpot_p50=tpot["p50"], tpot_p95=tpot["p95"])
                rows.append(row)
    return rows

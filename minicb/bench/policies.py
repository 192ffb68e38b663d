"""Scheduler policies side by side: who goes first, how a step is composed, how much KV headroom
admission keeps — each measured at rising request rates.

    python -m minicb bench policies             # cost model and real engine, several minutes on 2
    cores
    python -m minicb bench policies --quick     # a smaller sweep (about a minute)

Every policy serves the same seeded workloads (chat-like and long-tail) at the same arrival
times, twice: with the cost-model runner (virtual time units, hundreds of requests) and with the
real engine on the CPU (seconds, a few dozen shorter requests). The request rates are multiples
of the throughput FCFS reaches when everything arrives at once, measured first on each runner
(a steady stream can run somewhat faster: the all-at-once run ends with a few long requests
alone), plus that all-at-once point itself (an offline batch job). Per point: TTFT p50/p95 (and p95
of the
high-priority quarter of the requests), TPOT p95, output throughput, the longest wait in the queue
and the number of preemptions. Ratios between policies in one run are the result; absolute
seconds belong to the machine named in the output.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from minicb.bench.harness import add_flags, announce, bench_parser, dated_record, write_record
from minicb.config import EngineConfig
from minicb.engine.llm_engine import LLMEngine
from minicb.metrics import RequestMetrics, summarize
from minicb.params import SamplingParams
from minicb.request import Request
from minicb.sim import simulate
from minicb.sim.workload import Workload, chat, fixed, long_tail, poisson_arrivals
from minicb.viz.base import PALETTE, new_figure


@dataclass
class Setup:
    """One runner's machine: engine knobs shared by every policy, and the sizes of its workloads."""

    runner: str                     # "cost model" or "engine"
    knobs: dict
    num_requests: int
    length_scale: float             # the book's workloads, lengths multiplied by this
    loads: tuple[float, ...]        # request rates, as multiples of FCFS's all-at-once throughput
    max_wait_steps: int
    unit: str                       # of the latency columns


COST_MODEL = Setup("cost model", dict(max_num_seqs=32, max_num_batched_tokens=512, block_size=16,
                                      num_kv_blocks=384, max_model_len=1024),
                   num_requests=400, length_scale=1.0, loads=(0.5, 1.0, 1.25, 1.5, 2.0),
                   max_wait_steps=128, unit="time units")
ENGINE = Setup("engine", dict(max_num_seqs=8, max_num_batched_tokens=128, block_size=16,
                              num_kv_blocks=40, max_model_len=256),
               num_requests=32, length_scale=0.25, loads=(1.0, 2.0, 4.0), max_wait_steps=32,
               unit="s")
QUICK = {"cost model": dict(num_requests=150, loads=(1.0, 1.5)),
         "engine": dict(num_requests=12, loads=(2.0,))}


def policies(setup: Setup) -> dict[str, dict]:
    """The knobs each curve turns on, on top of the setup's (FCFS, decode-first, no cap, no
    watermark). The cap is a quarter of the step's token budget; the watermark a tenth of the pool
    (room for a long prompt's remaining chunks)."""
    budget, pool = setup.knobs["max_num_batched_tokens"], setup.knobs["num_kv_blocks"]
    return {
        "fcfs": {},
        "priority": {"policy": "priority"},
        "priority+ageing": {"policy": "priority", "max_wait_steps": setup.max_wait_steps},
        "shortest-prompt-first": {"policy": "shortest_prompt_first"},
        "spf+ageing": {"policy": "shortest_prompt_first", "max_wait_steps": setup.max_wait_steps},
        "prefill-first": {"step_order": "prefill_first"},
        "prefill-cap": {"max_prefill_tokens_per_step": budget // 4},
        "watermark": {"watermark_blocks": pool // 10},
        "cap+watermark": {"max_prefill_tokens_per_step": budget // 4,
                          "watermark_blocks": pool // 10},
    }


def make_workloads(setup: Setup, seed: int = 0) -> dict[str, Workload]:
    """Chat-like and long-tail, scaled to the runner; one request in four is high priority (0)."""
    priorities = np.where(np.random.default_rng(seed + 7).random(setup.num_requests) < 0.25, 0, 1)
    workloads = {}
    for name, make in (("chat", chat), ("long-tail", long_tail)):
        base = make(setup.num_requests, seed)
        scaled = fixed(base.name, [max(1, round(p * setup.length_scale)) for p in base.prompt_lens],
                       [max(1, round(o * setup.length_scale)) for o in base.output_lens],
                       base.description)
        requests = [replace(r, priority=int(q)) for r, q in zip(scaled.requests, priorities)]
        description = f"{base.description}, lengths x{setup.length_scale:g}"
        workloads[name] = Workload(base.name, requests, description)
    return workloads


# --- the two runners ------------------------------------------------------------------------------
def run_cost_model(setup: Setup, workload: Workload, knobs: dict,
                   model: str | None) -> list[Request]:
    return simulate(workload, **setup.knobs, **knobs).requests


def run_engine(setup: Setup, workload: Workload, knobs: dict, model: str | None) -> list[Request]:
    """Serve the workload in wall-clock time: each request is added at its arrival time (or at the
    end of the step running then) with that arrival time, so time spent queued counts."""
    engine = LLMEngine(EngineConfig(model=model, **setup.knobs, **knobs))
    prompts = workload.prompt_token_ids(engine.vocab_size)
    order = sorted(range(len(workload)), key=lambda i: workload.requests[i].arrival)
    requests, start = [], time.perf_counter()
    while len(requests) < len(order) or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while len(requests) < len(order) and workload.requests[order[len(requests)]].arrival <= now:
            i = order[len(requests)]
            spec = workload.requests[i]
            params = SamplingParams(max_tokens=spec.output_len, temperature=0, ignore_eos=True)
            requests.extend(engine.add_request(str(i), prompts[i], params,
                                               arrival_time=start + spec.arrival,
                                               priority=spec.priority))
        if engine.has_unfinished_requests():
            engine.step()
        elif len(requests) < len(order):
            time.sleep(max(workload.requests[order[len(requests)]].arrival - now, 0.0))
    return requests


RUNNERS = {"cost model": run_cost_model, "engine": run_engine}


def measure(requests: list[Request]) -> dict:
    metrics = [RequestMetrics.from_request(r) for r in requests]
    summary = summarize(metrics)
    high = summarize([m for m, r in zip(metrics, requests) if r.priority == 0] or metrics)
    return {"completed": len(metrics), "duration": summary.duration,
            "request_throughput": summary.request_throughput,
            "output_throughput": summary.output_throughput, "ttft_p50": summary.ttft["p50"],
            "ttft_p95": summary.ttft["p95"], "ttft_p95_high": high.ttft["p95"],
            "tpot_p95": summary.tpot["p95"], "itl_p99": summary.itl["p99"],
            "wait_max": max(m.queue_time for m in metrics),
            "preemptions": sum(r.num_preemptions for r in requests)}


def sweep(setup: Setup, model: str | None = None, progress: bool = True) -> list[dict]:
    """Every policy at every load, on both workloads: one row per point."""
    run, rows = RUNNERS[setup.runner], []
    for name, workload in make_workloads(setup).items():
        all_at_once = workload.with_arrivals(np.zeros(len(workload)))
        capacity = measure(run(setup, all_at_once, {}, model))["request_throughput"]
        for load in (*setup.loads, math.inf):
            rate = capacity * load
            timed = workload.with_arrivals(poisson_arrivals(len(workload), rate, seed=1))
            for policy, knobs in policies(setup).items():
                row = {"runner": setup.runner, "workload": name, "policy": policy, "load": load,
                       "rate": rate, "unit": setup.unit, **measure(run(setup, timed, knobs, model))}
                rows.append(row)
                if progress:
                    print(format_rows([row], header=len(rows) == 1), flush=True)
    return rows


# --- reporting ------------------------------------------------------------------------------------
def format_rows(rows: list[dict], header: bool = True) -> str:
    """A markdown table, the form benchmarks/policies.md quotes."""
    lines = ["| runner | workload | load | policy | out tok/unit | TTFT p50 | TTFT p95 | TTFT p95 "
             "(high) | TPOT p95 | ITL p99 | longest wait | preempt |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"] if header else []
    for r in rows:
        cells = [f"{r['runner']} ({r['unit']})", r["workload"], f"{r['load']:g}", r["policy"]]
        cells += [f"{r[k]:.3g}" for k in ("output_throughput", "ttft_p50", "ttft_p95",
                                          "ttft_p95_high", "tpot_p95", "itl_p99", "wait_max")]
        lines.append("| " + " | ".join(cells + [str(r["preemptions"])]) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path | None = None):
    """Throughput (x) against p95 TTFT (y, log), one curve per policy, one panel per runner and
    workload; the points of a curve are the rising loads, the all-at-once point last."""
    panels = sorted({(r["runner"], r["workload"]) for r in rows},
                    key=lambda p: (p[0] != "cost model", p[1]))
    names = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = new_figure(11, 4.2 * math.ceil(len(panels) / 2), rows=math.ceil(len(panels) / 2),
                           cols=2)
    for ax, (runner, workload) in zip(axes, panels):
        unit = "s" if runner == "engine" else "time unit"
        for index, name in enumerate(names):
            points = sorted((r for r in rows if (r["runner"], r["workload"], r["policy"])
                             == (runner, workload, name)),
                            key=lambda r: r["load"])
            ax.plot([p["output_throughput"] for p in points], [p["ttft_p95"] for p in points],
                    "o-" if index < 5 else "s--", color=PALETTE[index], label=name, markersize=4)
        ax.set_yscale("log")
        ax.set_title(f"{runner}: {workload}", fontsize=10)
        ax.set_xlabel(f"output tokens per {unit}")
        ax.set_ylabel(f"p95 TTFT ({unit}s)" if unit != "s" else "p95 TTFT (s)")
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7, ncol=2)
    if path is not None:
        fig.savefig(path)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("policies", __doc__)
    add_flags(parser, "model")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller sweep: fewer requests and loads")
    parser.add_argument("--runners", nargs="+", choices=list(RUNNERS), default=list(RUNNERS))
    add_flags(parser, "out_dir", threads=dict(
        default=1, help="torch CPU threads (1: a shared machine makes more threads spin and "
                        "stall)"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    setups = [COST_MODEL, ENGINE]
    if args.quick:
        setups = [replace(s, **QUICK[s.runner]) for s in setups]
    started, rows = time.perf_counter(), []
    announce()
    for setup in setups:
        if setup.runner in args.runners:
            rows += sweep(setup, args.model)
    name = "policies-quick" if args.quick else "policies"
    record = dated_record(torch=torch.__version__, torch_threads=args.threads,
                          model=args.model or "default",
                          setups={s.runner: {**vars(s), "policies": policies(s)}
                                  for s in setups if s.runner in args.runners},
                          wall_time_s=time.perf_counter() - started, rows=rows)
    json_path, _ = write_record(args.out_dir, name, record, lambda r: plot(r["rows"]))
    print(f"\nresults: {json_path} and .png ({record['wall_time_s']:.0f} s)")
    return 0

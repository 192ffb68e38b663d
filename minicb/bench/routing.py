"""Replicas behind vLLM's router: one replica against two, the router's policies on prefix-heavy
traffic, and a replica killed mid-run.

    python -m minicb bench routing              # all three studies, about 10 minutes on 2 cores
    python -m minicb bench routing --study policies --num-prompts 64
    python -m minicb bench routing --study trace    # one seeded trace, one request at a time

Every run starts a fresh cluster (`minicb.serving.cluster`: replicas pinned to their own cores,
prefix caching on, vllm-router in front), drives it through the router's one URL with the load
generator (`bench serve`'s, unchanged) on the seeded prefix-heavy workload (multi-turn chats under
shared system prompts), and reads each replica's own /metrics before and after: requests served
(the load balance) and prefix-cache hits over queries (the hit rate). Results: JSON and PNGs in
benchmarks/results/ (routing-*.json), read by benchmarks/cluster.md.

The failure drill sends the workload at a steady rate through two replicas, SIGKILLs one halfway,
and records every request's outcome against its send time: how many failed, what the clients
saw, and how long until every request succeeded again.

The trace study (`minicb.bench.routing_trace`) sends a small seeded trace one request at a time
through each policy, so its answers and hit rates are deterministic: chapter 09's proxy is
compared with it.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from minicb.bench import routing_trace
from minicb.bench.harness import add_flags, bench_parser, load_average, write_record
from minicb.bench.machine import machine_line
from minicb.serving.cluster import Cluster
from minicb.serving.loadgen import BenchConfig, benchmark
from minicb.viz.base import new_figure

# the router's policies, and cache_aware with its load-balance trigger scaled to these replicas:
# the router's default (64 requests more in flight than the least loaded replica) is sized for
# GPU batches of hundreds and never fires at 8 sequences per replica
POLICIES = ("round_robin", "power_of_two", "cache_aware", "cache_aware:balance=4")


@dataclass
class RoutingConfig:
    num_prompts: int = 160
    request_rate: float = 8.0             # requests per second offered (Poisson)
    max_num_seqs: int = 8
    # each replica's KV pool (8,960 tokens): room for half the chats' histories (about 6,300
    # tokens) but not for all of them (about 12,600), so a replica that sees every chat (round
    # robin) evicts what one that sees half of them (prefix affinity) keeps
    num_kv_blocks: int = 560
    # the prefix-heavy workload: 32 chats of 5 turns under 8 system prompts
    workload_options: dict = field(default_factory=lambda: {
        "systems": 8, "turns": 5, "system_len": 64, "user_len": 32, "answer_len": 32})
    seed: int = 0
    policies: tuple[str, ...] = POLICIES
    kill_after: float = 0.5               # the failure drill kills a replica this far into the run
    serve_args: list[str] = field(default_factory=list)


def _load_config(config: RoutingConfig, url: str) -> BenchConfig:
    return BenchConfig(base_url=url, model="minicb", num_prompts=config.num_prompts,
                       request_rate=config.request_rate, workload="prefix-heavy",
                       workload_options=dict(config.workload_options),
                       ignore_eos=True, temperature=0.0, seed=config.seed, disable_tqdm=True)


def _cluster(config: RoutingConfig, replicas: int, policy: str, log_dir: Path | None) -> Cluster:
    """`policy` is the router's name, optionally with ":balance=N" (cache_aware's trigger)."""
    name, _, balance = policy.partition(":balance=")
    router_args = ["--balance-abs-threshold", balance] if balance else []
    return Cluster(replicas=replicas, policy=name, router_args=router_args,
                   serve_args=["--enable-prefix-caching", "--max-num-seqs",
                               str(config.max_num_seqs), "--num-kv-blocks",
                               str(config.num_kv_blocks), *config.serve_args],
                   log_dir=log_dir)


def run_once(config: RoutingConfig, replicas: int, policy: str, log_dir: Path | None = None
             ) -> dict:
    """One cluster, one run of the workload through its router: the client's numbers and each
    replica's requests served and prefix-cache hit rate during the run."""
    with _cluster(config, replicas, policy, log_dir) as cluster:
        before = routing_trace.replica_counts(cluster.replica_urls)
        result = benchmark(_load_config(config, cluster.url))
        after = routing_trace.replica_counts(cluster.replica_urls)
    per_replica = []
    for b, a in zip(before, after):
        queries, hits = a["queries"] - b["queries"], a["hits"] - b["hits"]
        per_replica.append({"served": a["served"] - b["served"], "prefix_queries": queries,
                            "prefix_hits": hits, "hit_rate": hits / queries if queries else 0.0})
    served = [r["served"] for r in per_replica]
    queries = sum(r["prefix_queries"] for r in per_replica)
    return {"replicas": replicas, "policy": policy, "completed": result["completed"],
            "failed": result["failed"], "request_throughput": result["request_throughput"],
            "output_throughput": result["output_throughput"],
            "ttft_p50_ms": result["ttft_ms"]["p50"], "ttft_p95_ms": result["ttft_ms"]["p95"],
            "tpot_p50_ms": result["tpot_ms"]["p50"], "e2e_p50_ms": result["e2e_ms"]["p50"],
            "per_replica": per_replica,
            "hit_rate": sum(r["prefix_hits"] for r in per_replica) / queries if queries else 0.0,
            # the busiest replica's share over a fair share: 1.0 is perfectly even
            "imbalance": max(served) / (sum(served) / len(served)) if sum(served) else math.nan}


def failure_drill(config: RoutingConfig, policy: str = "round_robin",
                  log_dir: Path | None = None) -> dict:
    """Two replicas; SIGKILL replica 1 `kill_after` of the way through the offered load."""
    duration = config.num_prompts / config.request_rate
    with _cluster(config, 2, policy, log_dir) as cluster:
        killed_at: dict[str, float] = {}

        def kill() -> None:
            time.sleep(config.kill_after * duration)
            killed_at["t"] = time.perf_counter()
            cluster.kill_replica(1)

        killer = threading.Thread(target=kill)
        started = time.perf_counter()
        killer.start()
        result = benchmark(_load_config(config, cluster.url))
        killer.join()
        after = routing_trace.replica_counts(cluster.replica_urls)
    # send times count from the load generator's start, milliseconds after `started`
    kill_t = killed_at["t"] - started
    sends = np.array(result["send_times"])
    failed = [bool(e) for e in result["errors"]]
    failures = [s for s, f in zip(sends, failed) if f]
    last_failure_sent = max(failures) if failures else None
    return {"policy": policy, "killed_at_s": kill_t, "num_prompts": config.num_prompts,
            "request_rate": config.request_rate, "completed": result["completed"],
            "failed": result["failed"], "send_times": list(map(float, sends)),
            "failed_flags": failed, "errors": sorted(set(e[:200] for e in result["errors"] if e)),
            "last_failure_sent_s": last_failure_sent,
            "recovered_after_s": (last_failure_sent - kill_t) if last_failure_sent else 0.0,
            "ttfts": result["ttfts"], "survivor_served": after[0]["served"]}


def plot_policies(rows: list[dict], path: Path | None = None):
    fig, axes = new_figure(13, 4, cols=3)
    labels = [f"{r['replicas']}x {r['policy']}" for r in rows]
    x = np.arange(len(rows))
    axes[0].bar(x, [r["output_throughput"] for r in rows])
    axes[0].set(title="output tokens / s", xticks=x)
    axes[0].set_xticklabels(labels, rotation=20, ha="right")
    axes[1].bar(x - 0.2, [r["ttft_p50_ms"] for r in rows], 0.4, label="p50")
    axes[1].bar(x + 0.2, [r["ttft_p95_ms"] for r in rows], 0.4, label="p95")
    axes[1].set(title="time to first token (ms)", xticks=x)
    axes[1].set_xticklabels(labels, rotation=20, ha="right")
    axes[1].legend()
    width = 0.8 / max(len(r["per_replica"]) for r in rows)
    for i in range(max(len(r["per_replica"]) for r in rows)):
        axes[2].bar(x + (i - 0.5) * width, [r["per_replica"][i]["hit_rate"]
                                            if i < len(r["per_replica"]) else 0 for r in rows],
                    width, label=f"replica {i}")
    axes[2].set(title="prefix-cache hit rate per replica", xticks=x, ylim=(0, 1))
    axes[2].set_xticklabels(labels, rotation=20, ha="right")
    axes[2].legend()
    if path is not None:
        fig.savefig(path)
    return fig


def plot_drill(drill: dict, path: Path | None = None):
    fig, (ax,) = new_figure(8, 3.5)
    sends = np.array(drill["send_times"])
    failed = np.array(drill["failed_flags"])
    ttft = np.array([np.nan if t is None else t for t in drill["ttfts"]], dtype=float)
    ax.scatter(sends[~failed], ttft[~failed] * 1000, s=10, label="served: TTFT (ms)")
    ax.scatter(sends[failed], np.full(failed.sum(), 1.0), s=25, marker="x", color="red",
               label="failed")
    ax.axvline(drill["killed_at_s"], color="black", linestyle="--", label="replica 1 killed")
    ax.set(xlabel="request sent at (s)", ylabel="ms", yscale="log",
           title=f"a replica killed mid-run ({drill['policy']}): {drill['failed']} of "
                 f"{drill['num_prompts']} requests failed")
    ax.legend(fontsize=8)
    if path is not None:
        fig.savefig(path)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("routing", __doc__)
    parser.add_argument("--study", choices=["all", "scale", "policies", "failure", "trace"],
                        default="all")
    add_flags(parser, "num_prompts", num_prompts=RoutingConfig.num_prompts)
    parser.add_argument("--request-rate", type=float, default=RoutingConfig.request_rate)
    parser.add_argument("--max-num-seqs", type=int, default=RoutingConfig.max_num_seqs)
    parser.add_argument("--num-kv-blocks", type=int, default=RoutingConfig.num_kv_blocks,
                        help="each replica's KV pool, in blocks of 16 tokens")
    add_flags(parser, "out_dir")
    parser.add_argument("--log-dir", default=None, help="the replicas' and router's output")
    args = parser.parse_args(argv)
    config = RoutingConfig(num_prompts=args.num_prompts, request_rate=args.request_rate,
                           max_num_seqs=args.max_num_seqs, num_kv_blocks=args.num_kv_blocks)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(args.log_dir) if args.log_dir else None
    record = {"machine": machine_line(), "config": asdict(config),
              "load_average_before": load_average()}
    rows = []
    if args.study in ("all", "scale", "policies"):      # one replica: the baseline
        rows.append(run_once(config, 1, "round_robin", log_dir))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "per_replica"}), flush=True)
    if args.study in ("all", "scale", "policies"):
        for policy in config.policies if args.study != "scale" else ("round_robin",):
            rows.append(run_once(config, 2, policy, log_dir))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "per_replica"}),
                  flush=True)
    if rows:
        record["rows"] = rows
        record["load_average_after"] = load_average()
        write_record(out, "routing-policies", record, lambda r: plot_policies(r["rows"]))
    if args.study in ("all", "failure"):
        drill = failure_drill(config, "round_robin", log_dir)
        drill.update(machine=machine_line(), load_average=load_average())
        write_record(out, "routing-failure", drill, plot_drill)
        print(json.dumps({k: drill[k] for k in ("failed", "completed", "killed_at_s",
                                                "recovered_after_s", "errors")}), flush=True)
    if args.study in ("all", "trace"):
        trace = routing_trace.record(routing_trace.TraceConfig(), out / "routing-trace.json")
        print(json.dumps({run["policy"]: run["hit_rate"] for run in trace["runs"]}), flush=True)
    return 0

"""One seeded prefix-heavy trace through a router, one request at a time: every answer, and each
replica's prefix-cache hit rate. Chapter 09 replays it through its own small proxy and compares
with what vLLM's router did on the same trace:

    python -m minicb bench routing --study trace     # writes benchmarks/results/routing-trace.json

Sent one at a time, a trace is deterministic: every replica starts empty, the greedy answers do
not depend on which replica computed them, and a replica's cache hits depend only on the order
of the prompts it was sent. So two routers that make the same choices get the same hit rates,
and the hit rates rank routing policies without the noise of timing.
"""

from __future__ import annotations

import asyncio
import math
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from minicb.bench.harness import load_average, write_record
from minicb.bench.machine import machine_line
from minicb.serving.cluster import Cluster, scrape
from minicb.serving.loadgen import PROMPT_WORDS
from minicb.serving.server import ServerThread, build_app
from minicb.sim.workload import Workload, prefix_heavy, prefix_texts

QUERIES, HITS = "minicb_prefix_cache_queries_total", "minicb_prefix_cache_hits_total"
SERVED = "minicb_request_success_total"
ROUTER_POLICIES = ("round_robin", "power_of_two", "cache_aware")


@dataclass
class TraceConfig:
    chats: int = 8
    turns: int = 3
    systems: int = 3
    system_len: int = 64
    user_len: int = 24
    answer_len: int = 24
    max_tokens: int = 6                 # each answer's length (greedy, end of text ignored)
    seed: int = 0
    replicas: int = 2
    # each replica's engine: prefix caching on, a pool that holds the whole trace, so a hit is
    # lost only to routing, never to eviction
    replica_knobs: dict = field(default_factory=lambda: {
        "enable_prefix_caching": True, "max_num_seqs": 4})


def trace_workload(config: TraceConfig) -> Workload:
    """The trace: every chat's turn 1 (in a seeded order), then every turn 2, and so on;
    `extra["turns"]` says (system, chat, turn) per request."""
    return prefix_heavy(config.chats * config.turns, seed=config.seed, systems=config.systems,
                        turns=config.turns, system_len=config.system_len,
                        user_len=config.user_len, answer_len=config.answer_len)


def trace_prompts(config: TraceConfig) -> list[str]:
    """The trace's text prompts, in the order they are sent."""
    return prefix_texts(trace_workload(config), PROMPT_WORDS)


def start_replicas(config: TraceConfig, stack: ExitStack) -> list[str]:
    """Fresh in-process `minicb serve` replicas on free ports (stopped when `stack` closes)."""
    return [stack.enter_context(ServerThread(build_app(served_model_name="minicb",
                                                       **config.replica_knobs))).url
            for _ in range(config.replicas)]


async def replay(url: str, prompts: list[str], max_tokens: int) -> list[str]:
    """Send each prompt to `url` after the previous one's answer; the answers' texts."""
    answers = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for prompt in prompts:
            response = await client.post("/v1/completions", json={
                "model": "minicb", "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True})
            response.raise_for_status()
            answers.append(response.json()["choices"][0]["text"])
    return answers


def replica_counts(urls: list[str]) -> list[dict]:
    """Each replica's requests served and prefix-cache hits over queries, from its /metrics
    (NaN for a replica that no longer answers: a killed one)."""
    counts = []
    for url in urls:
        try:
            samples = scrape(url)
        except Exception:             # a killed replica has no /metrics
            counts.append(dict.fromkeys(("served", "hit_rate", "hits", "queries"), math.nan))
            continue
        queries, hits = samples.get(QUERIES, 0.0), samples.get(HITS, 0.0)
        counts.append({"served": int(sum(v for k, v in samples.items() if k.startswith(SERVED))),
                       "hit_rate": hits / queries if queries else 0.0,
                       "hits": hits, "queries": queries})
    return counts


def overall_hit_rate(counts: list[dict]) -> float:
    queries = sum(c["queries"] for c in counts)
    return sum(c["hits"] for c in counts) / queries if queries else 0.0


def through_router(config: TraceConfig, policy: str, router: str | None = None) -> dict:
    """The trace through vLLM's router (`policy`) in front of fresh replicas."""
    prompts = trace_prompts(config)
    with ExitStack() as stack:
        urls = start_replicas(config, stack)
        cluster = stack.enter_context(Cluster(policy=policy, worker_urls=urls, router=router))
        answers = asyncio.run(replay(cluster.url, prompts, config.max_tokens))
        counts = replica_counts(urls)
    return {"policy": policy, "answers": answers, "per_replica": counts,
            "hit_rate": overall_hit_rate(counts)}


def record(config: TraceConfig, out: Path, router: str | None = None) -> dict:
    """Every router policy on the trace, written to `out` (routing-trace.json)."""
    result = {"machine": machine_line(), "load_average": load_average(),
              "router": "vllm-router", "config": asdict(config),
              "runs": [through_router(config, policy, router) for policy in ROUTER_POLICIES]}
    write_record(out.parent, out.stem, result)
    return result

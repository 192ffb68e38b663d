"""Chapter 09: a prefix-affinity router bounded by load, checked choice by choice against the rule,
then scored on the shipped trace with real replicas against vLLM's router's record."""

from __future__ import annotations

import asyncio
import json
import random
from contextlib import ExitStack
from pathlib import Path

import httpx
from adapter import chapter, run_docstring_examples

from minicb.bench.routing_trace import (
    TraceConfig,
    overall_hit_rate,
    replica_counts,
    start_replicas,
    trace_prompts,
)

ch09 = chapter("09")
RECORD = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "routing-trace.json"


def expected_choice(sent: list[list[str]], prompt: str, threshold: float,
                    max_imbalance: int) -> int:
    """The rule, written out once more: longest prefix, else the least-sent replica when the match
    is under the threshold or its replica too far ahead."""
    def shared(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    match = [max((shared(prompt, p) for p in prompts), default=0) for prompts in sent]
    best = match.index(max(match))
    counts = [len(prompts) for prompts in sent]
    least = counts.index(min(counts))
    if match[best] < threshold * len(prompt) or counts[best] - counts[least] > max_imbalance:
        return least
    return best


def random_prompts(rng: random.Random, n: int) -> list[str]:
    """Conversations that grow turn by turn under a few shared starts, in a shuffled order."""
    starts = ["".join(rng.choice("ab") for _ in range(rng.randint(0, 6))) for _ in range(3)]
    chats = [rng.choice(starts) + "|" + "".join(rng.choice("abc") for _ in range(3))
             for _ in range(rng.randint(2, 6))]
    prompts = []
    for _ in range(n):
        i = rng.randrange(len(chats))
        chats[i] += "".join(rng.choice("abc ") for _ in range(rng.randint(1, 6)))
        prompts.append(chats[i] if rng.random() < 0.9 else "".join(rng.choice("xyz")
                                                                   for _ in range(5)))
    return prompts


def test_ch09_worked_examples():
    run_docstring_examples(ch09)


def test_ch09_common_prefix_length_matches_the_definition():
    rng = random.Random(9)
    for _ in range(300):
        a = "".join(rng.choice("ab") for _ in range(rng.randint(0, 6)))
        b = a[:rng.randint(0, len(a))] + "".join(rng.choice("ab") for _ in range(rng.randint(0, 3)))
        expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        got = ch09.common_prefix_length(a, b)
        assert got == expected, (f"common_prefix_length({a!r}, {b!r}) should be {expected}, "
                                 f"got {got}")


def test_ch09_routes_by_the_rule_choice_by_choice():
    rng = random.Random(0)
    for case in range(60):
        replicas, threshold = rng.randint(1, 4), rng.choice([0.0, 0.3, 0.6])
        max_imbalance = rng.choice([0, 1, 3, 100])
        router = ch09.PrefixAffinityRouter(replicas, threshold=threshold,
                                           max_imbalance=max_imbalance)
        sent: list[list[str]] = [[] for _ in range(replicas)]
        for step, prompt in enumerate(random_prompts(rng, 25)):
            want = expected_choice(sent, prompt, threshold, max_imbalance)
            got = router.route(prompt)
            assert got == want, (
                f"case {case} ({replicas} replicas, threshold {threshold}, max_imbalance "
                f"{max_imbalance}), request {step} {prompt!r}: the rule picks replica {want}, "
                f"yours picked {got}; sent so far: {sent}")
            sent[want].append(prompt)


def test_ch09_load_bound_keeps_the_replicas_within_the_slack():
    """Every prompt shares most of its text: affinity alone would send all of them to one
    replica."""
    for max_imbalance in (0, 2, 5):
        router = ch09.PrefixAffinityRouter(3, max_imbalance=max_imbalance)
        counts = [0, 0, 0]
        for i in range(40):
            counts[router.route(f"the same long system prompt, then question {i}")] += 1
            assert max(counts) - min(counts) <= max_imbalance + 1, (
                f"max_imbalance {max_imbalance}: after {i + 1} requests the replicas were sent "
                f"{counts}; the busiest may lead the least sent by at most {max_imbalance + 1}")


async def _send(urls: list[str], choices: list[int], prompts: list[str], max_tokens: int) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        for replica, prompt in zip(choices, prompts):
            response = await client.post(urls[replica] + "/v1/completions", json={
                "model": "minicb", "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True})
            response.raise_for_status()


def test_ch09_real_replicas_hit_what_vllms_router_hit_on_the_trace():
    """The shipped trace, one request at a time, into two real replicas with prefix caching:
    the hit rate their /metrics report equals vLLM's cache_aware on the same trace (the committed
    record) and beats round robin's."""
    config = TraceConfig()
    prompts = trace_prompts(config)
    router = ch09.PrefixAffinityRouter(config.replicas)
    choices = [router.route(prompt) for prompt in prompts]
    record = {run["policy"]: run["hit_rate"] for run in json.loads(RECORD.read_text())["runs"]}
    with ExitStack() as stack:
        urls = start_replicas(config, stack)
        asyncio.run(_send(urls, choices, prompts, config.max_tokens))
        hit_rate = overall_hit_rate(replica_counts(urls))
    assert hit_rate > record["round_robin"], (
        f"your router's hit rate on the trace was {hit_rate:.3f}, no better than round robin's "
        f"{record['round_robin']:.3f}; choices: {choices}")
    assert abs(hit_rate - record["cache_aware"]) < 1e-9, (
        f"your router's hit rate on the trace was {hit_rate:.3f}, vLLM's cache_aware reached "
        f"{record['cache_aware']:.3f} on the same trace; choices: {choices}")

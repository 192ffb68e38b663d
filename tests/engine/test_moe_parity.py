"""Mixture-of-experts models served token for token as transformers generates them with its eager
experts: every scheduler × KV layout, and a small pool with shared prompt prefixes (preemption
and prefix caching), for Qwen3-MoE, Mixtral and the 32-expert top-8 Qwen2-MoE."""

from __future__ import annotations

import random

import pytest
from reference import check_all, hf_greedy, run_with_arrivals

from minicb import LLM
from minicb.model.moe import SparseMoeBlock

LAYOUTS = [(scheduler, kv) for scheduler in ("naive", "static", "continuous")
           for kv in ("contiguous", "paged")]
SHARED_PREFIX = 40      # tokens every prefix-caching prompt starts with: two and a half blocks


def make_workload(seed: int, num_requests: int, shared_prefix: int = 0):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(shared_prefix)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(rng.randint(1, 60))]
               for _ in range(num_requests)]
    max_tokens = [rng.randint(1, 20) for _ in prompts]
    max_tokens[:2] = [1, 20]
    arrivals = sorted(rng.randint(0, 8) for _ in prompts)
    return prompts, max_tokens, arrivals


@pytest.fixture(scope="module")
def cases(tiny_moe):
    """The model, and its two workloads with transformers' answers (eager experts)."""
    out = {"model": tiny_moe}
    for name, workload in (("plain", make_workload(0, 8)),
                           ("shared", make_workload(1, 6, SHARED_PREFIX))):
        prompts, max_tokens, _ = workload
        out[name] = (workload, hf_greedy(tiny_moe, prompts, max_tokens,
                                         experts_implementation="eager"))
    return out


def _check(llm, workload, references) -> None:
    prompts, max_tokens, arrivals = workload
    verdicts = check_all(references, run_with_arrivals(llm, prompts, max_tokens, arrivals))
    assert verdicts.count("equal") >= len(prompts) - 1, verdicts     # one near-tie at most
    kv = llm.llm_engine.kv
    assert kv.num_free_blocks() == kv.num_blocks, "KV blocks leaked after every request ended"


@pytest.mark.parametrize("scheduler,kv_cache,attention",
                         [(*layout, "torch") for layout in LAYOUTS]
                         + [("continuous", "paged", "cpu")])   # the C attention and experts
def test_greedy_equals_transformers(cases, scheduler, kv_cache, attention):
    llm = LLM(cases["model"], scheduler=scheduler, kv_cache=kv_cache, attention=attention,
              max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128, block_size=16)
    if attention == "cpu":   # every decode step (4 rows at most) through kernels/cpu_moe.c
        blocks = [layer.mlp for layer in llm.llm_engine.model.model.layers
                  if isinstance(layer.mlp, SparseMoeBlock)]
        assert blocks and all(block.cpu_rows >= 4 for block in blocks)
    _check(llm, *cases["plain"])


def test_preemption_and_prefix_caching(cases):
    """Ten blocks cannot hold four requests of up to 120 tokens (preemption), and the prompts
    share their first 40 tokens (prefix caching): the tokens do not change."""
    llm = LLM(cases["model"], scheduler="continuous", kv_cache="paged", attention="torch",
              enable_prefix_caching=True, num_kv_blocks=10, max_num_seqs=4,
              max_num_batched_tokens=64, max_model_len=128, block_size=16)
    _check(llm, *cases["shared"])
    engine = llm.llm_engine
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    assert engine.kv.prefix_stats().hit_tokens > 0, "the shared prefixes were meant to be found"

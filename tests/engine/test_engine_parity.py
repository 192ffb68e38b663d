"""Greedy outputs of every scheduler × KV layout × attention backend equal transformers' generate,
request by request. (The Triton backend's engine parity is in test_engine_triton.py.)"""

from __future__ import annotations

import random

import pytest
from reference import check_all, greedy, hf_greedy, run_with_arrivals

from minicb import LLM

CONFIGS = [("naive", "paged", "cpu"), ("static", "paged", "cpu"), ("static", "contiguous", "cpu"),
           ("continuous", "contiguous", "cpu"), ("continuous", "paged", "cpu"),
           ("static", "contiguous", "torch"), ("continuous", "paged", "torch")]


def make_workload(num_requests: int = 32, seed: int = 0, vocab: int = 512):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 200))]
               for _ in range(num_requests)]
    max_tokens = [rng.randint(1, 64) for _ in range(num_requests)]
    max_tokens[:3] = [1, 64, 2]                       # the edges on purpose
    prompts[0], prompts[1] = prompts[0][:1], prompts[1][:200]
    arrival_steps = sorted(rng.randint(0, 40) for _ in range(num_requests))
    return prompts, max_tokens, arrival_steps


@pytest.fixture(scope="module")
def workload():
    return make_workload()


@pytest.fixture(scope="module")
def references(tiny_model, workload):
    prompts, max_tokens, _ = workload
    return hf_greedy(tiny_model, prompts, max_tokens)


@pytest.mark.parametrize("scheduler,kv_cache,attention", CONFIGS)
def test_greedy_equals_transformers(tiny_model, workload, references, scheduler, kv_cache,
                                    attention):
    prompts, max_tokens, arrival_steps = workload
    llm = LLM(tiny_model, scheduler=scheduler, kv_cache=kv_cache, attention=attention,
              max_num_seqs=8, max_num_batched_tokens=256, max_model_len=320, block_size=16)
    outputs = run_with_arrivals(llm, prompts, max_tokens, arrival_steps)
    verdicts = check_all(references, outputs)
    assert len(verdicts) == len(prompts)
    assert verdicts.count("equal") >= len(prompts) - 2, ("too many near-ties to be chance: "
                                                         f"{verdicts}")
    engine = llm.llm_engine
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, ("KV blocks leaked after every "
                                                                 "request ended")


@pytest.fixture(scope="module")
def variant_workload():
    return make_workload(seed=5)


@pytest.fixture(scope="module")
def variant_references(tiny_variant, variant_workload):
    prompts, max_tokens, _ = variant_workload
    return hf_greedy(tiny_variant, prompts, max_tokens)


@pytest.mark.parametrize("scheduler,kv_cache,attention", [("continuous", "paged", "cpu"),
                                                          ("continuous", "paged", "torch"),
                                                          ("static", "contiguous", "cpu")])
def test_qwen3_and_biased_llama_greedy_equal_transformers(tiny_variant, variant_workload,
                                                          variant_references, scheduler, kv_cache,
                                                          attention, monkeypatch):
    """Qwen3 (per-head q/k norms) and Llama with attention_bias and mlp_bias, random biases and
    norm weights: through the torch modules, the cpu attention kernel and the fused decode layer
    (the cpu backend's decode steps)."""
    from minicb.kernels import cpu

    prompts, max_tokens, arrival_steps = variant_workload
    fused = []
    real = cpu.decode_layer_cpu
    monkeypatch.setattr(cpu, "decode_layer_cpu", lambda *a, **k: fused.append(1) or real(*a, **k))
    llm = LLM(tiny_variant, scheduler=scheduler, kv_cache=kv_cache, attention=attention,
              max_num_seqs=8, max_num_batched_tokens=256, max_model_len=320, block_size=16)
    outputs = run_with_arrivals(llm, prompts, max_tokens, arrival_steps)
    verdicts = check_all(variant_references, outputs)
    assert verdicts.count("equal") >= len(prompts) - 2, verdicts
    assert bool(fused) == (attention == "cpu"), "the cpu backend's decode steps were not fused"


def test_chunked_prefill_equals_transformers(tiny_llama):
    """A token budget smaller than the prompts forces chunked prefill; outputs do not change."""
    prompts, max_tokens, arrival_steps = make_workload(8, seed=3)
    references = hf_greedy(tiny_llama, prompts, max_tokens)
    llm = LLM(tiny_llama, scheduler="continuous", kv_cache="paged", max_num_seqs=4,
              max_num_batched_tokens=24, max_model_len=320)
    outputs = run_with_arrivals(llm, prompts, max_tokens, arrival_steps)
    check_all(references, outputs)


def test_default_model_greedy_equals_transformers():
    """The shipped model, on real code prompts, under continuous batching with a paged cache."""
    from minicb.model.default import default_model_path

    path = default_model_path()
    heads = ["def add(a, b):\n", "import os\n\n\ndef list_python_files(root):\n", "class Stack:\n",
             "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
             "    for line in lines:\n", "def parse_args(argv=None):\n    parser = ", "x = [",
             "# Helpers\n"]
    llm = LLM(path, scheduler="continuous", kv_cache="paged", max_num_seqs=4,
              max_num_batched_tokens=64)
    prompts = [llm.tokenizer.encode(h, add_special_tokens=False) for h in heads]
    max_tokens = [48, 32, 40, 48, 24, 32, 16, 40]
    references = hf_greedy(path, prompts, max_tokens)
    outputs = llm.generate(prompts, [greedy(n) for n in max_tokens], use_tqdm=False)
    verdicts = check_all(references, outputs, "prompt")
    assert verdicts.count("equal") >= len(heads) - 1, verdicts

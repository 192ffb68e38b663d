"""Speculative decoding in the engine: prompt-lookup proposals verified as multi-token rows.

Greedy outputs with speculation must equal transformers' generate token for token (random Llama
and Qwen2 configs and the shipped model), with preemption forced and prefix caching on; rejected
positions are rolled back (a request's block table never outgrows its accepted tokens, and the
pool ends with every block free); seeded sampled requests reproduce; bad settings are refused.
"""

from __future__ import annotations

import random

import pytest
from reference import check_all, greedy, hf_greedy, run_with_arrivals

from minicb import LLM, SamplingParams
from minicb.config import EngineConfig, blocks_for
from minicb.kv.paged import PagedKVManager
from minicb.request import Request

SPEC = dict(speculative_method="ngram", num_speculative_tokens=4, prompt_lookup_min=2,
            prompt_lookup_max=4)


def repeating_workload(num_requests: int = 12, seed: int = 0, vocab: int = 512):
    """Prompts that repeat a random phrase (so prompt lookup has something to find), some of them
    sharing their first 40 tokens (so prefix caching has something to reuse)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    prompts = []
    for i in range(num_requests):
        phrase = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 12))]
        tail = [rng.randrange(3, vocab) for _ in range(rng.randint(0, 8))]
        body = phrase * rng.randint(2, 6) + tail
        prompts.append((shared if i % 3 == 0 else []) + body)
    max_tokens = [rng.randint(8, 48) for _ in range(num_requests)]
    max_tokens[:2] = [1, 2]                        # the edges: no room to speculate, or barely
    return prompts, max_tokens, sorted(rng.randint(0, 12) for _ in range(num_requests))


def blocks_cover_only_computed_tokens(engine):
    """After a step: no running request holds a block past its computed tokens (rejected
    positions were rolled back)."""
    for request in engine.scheduler.running:
        table = engine.kv.block_table(request)
        assert len(table) == blocks_for(request.num_computed_tokens, engine.kv.block_size), (
            f"{request}: {len(table)} blocks for {request.num_computed_tokens} computed tokens")


def run_checked(llm, prompts, max_tokens, arrival_steps):
    return run_with_arrivals(llm, prompts, max_tokens, arrival_steps,
                             after_step=blocks_cover_only_computed_tokens)


@pytest.mark.parametrize("setting", ["plain", "preempt+prefix"])
def test_greedy_with_speculation_equals_transformers(tiny_model, setting):
    prompts, max_tokens, arrivals = repeating_workload()
    references = hf_greedy(tiny_model, prompts, max_tokens)
    extra = dict(num_kv_blocks=16, enable_prefix_caching=True) if setting != "plain" else {}
    llm = LLM(tiny_model, max_num_seqs=6, max_num_batched_tokens=128, max_model_len=320,
              block_size=8, **SPEC, **extra)
    outputs = run_checked(llm, prompts, max_tokens, arrivals)
    verdicts = check_all(references, outputs)
    assert verdicts.count("equal") >= len(prompts) - 1, verdicts
    engine = llm.llm_engine
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked"
    proposed = sum(o.metrics.num_proposed_tokens for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert proposed > 0 and accepted > 0, (proposed, accepted)
    if setting != "plain":
        assert engine.scheduler.num_preemptions > 0, "the small pool forced no preemption"
        assert engine.kv.prefix_stats().hit_tokens > 0, "no prefix was reused"


def test_default_model_greedy_with_speculation_equals_transformers():
    """The shipped model on code prompts: identical tokens, and prompt lookup pays (accepted
    proposals) on a prompt that repeats itself."""
    from minicb.model.default import default_model_path

    path = default_model_path()
    heads = ["def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(",
             "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self",
             "import os\n\n\ndef list_python_files(root):\n", "x = ["]
    llm = LLM(path, max_num_seqs=4, max_num_batched_tokens=64, **SPEC)
    prompts = [llm.tokenizer.encode(h, add_special_tokens=False) for h in heads]
    max_tokens = [40, 40, 32, 16]
    references = hf_greedy(path, prompts, max_tokens)
    outputs = llm.generate(prompts, [greedy(n) for n in max_tokens], use_tqdm=False)
    verdicts = check_all(references, outputs, "prompt")
    assert verdicts.count("equal") >= len(heads) - 1, verdicts
    metrics = outputs[0].metrics
    assert metrics.num_accepted_tokens > 0 and metrics.acceptance_rate > 0, vars(metrics)
    assert metrics.mean_accepted_length > 1, "speculation emitted no more than a decode would"
    engine = llm.llm_engine
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks


def test_seeded_sampled_requests_reproduce(tiny_llama):
    prompts, _, _ = repeating_workload(6, seed=2)
    params = [SamplingParams(max_tokens=32, temperature=0.7, top_p=0.95, seed=100 + i)
              for i in range(len(prompts))]
    runs = []
    for _ in range(2):
        llm = LLM(tiny_llama, max_num_seqs=4, max_num_batched_tokens=64,
                  **{**SPEC, "prompt_lookup_min": 1})
        runs.append(llm.generate(prompts, params, use_tqdm=False))
    assert [o.outputs[0].token_ids for o in runs[0]] == [o.outputs[0].token_ids for o in runs[1]]
    assert sum(o.metrics.num_proposed_tokens for o in runs[0]) > 0, "nothing was verified"


def test_budget_and_batch_size_lower_k(tiny_llama):
    """Verification rows count against max_num_batched_tokens, and speculation is off while more
    requests run than speculative_disable_by_batch_size."""
    check_budget_and_batch_size(tiny_llama, SPEC)


def check_budget_and_batch_size(model: str, knobs: dict) -> None:
    """Steps stay within a budget of 8 tokens yet still verify; with
    speculative_disable_by_batch_size=2 no request proposes until at most 2 run."""
    prompts, _, _ = repeating_workload(6, seed=3)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    llm = LLM(model, max_num_seqs=6, max_num_batched_tokens=8, **knobs)
    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    rows = 0
    while engine.has_unfinished_requests():
        plan = engine.scheduler.schedule()
        assert plan.num_tokens <= 8
        rows += sum(bool(s.proposal) for s in plan.seqs)
        engine.scheduler.update(plan, engine.runner.execute(plan))
    assert rows > 0

    off = LLM(model, max_num_seqs=6, max_num_batched_tokens=128,
              speculative_disable_by_batch_size=2, **knobs)
    outputs = off.generate(prompts, params, use_tqdm=False)
    assert all(o.metrics.num_proposed_tokens == 0 for o in outputs[:-2]), \
        "requests proposed while more than 2 were running"


def test_truncate_frees_whole_blocks_past_the_length():
    kv = PagedKVManager(num_blocks=8, block_size=4)
    request = Request("r", list(range(10)), SamplingParams(max_tokens=10))
    kv.allocate(request, 15)                  # 4 blocks
    assert len(kv.block_table(request)) == 4 and kv.num_free_blocks() == 4
    first_two = kv.block_table(request)[:2]
    kv.truncate(request, 6)                   # 6 tokens fit in 2 blocks
    assert kv.block_table(request) == first_two and kv.num_free_blocks() == 6
    kv.truncate(request, 8)                   # nothing past 8 tokens: unchanged
    assert kv.block_table(request) == first_two
    kv.free(request)
    assert kv.num_free_blocks() == 8


@pytest.mark.parametrize("knobs,words", [
    (dict(speculative_method="ngram", scheduler="static"), "scheduler='continuous'"),
    (dict(speculative_method="ngram", kv_cache="contiguous"), "kv_cache='paged'"),
    (dict(speculative_method="medusa"), "not one of"),
    (dict(speculative_method="ngram", num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(speculative_method="ngram", prompt_lookup_min=5, prompt_lookup_max=3),
     "prompt_lookup_min=5"),
    (dict(num_speculative_tokens=8), "only apply with speculative_method"),
])
def test_bad_speculative_config_is_refused(knobs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        EngineConfig(**knobs)


def test_abort_during_speculation_frees_everything(tiny_llama):
    from reference import run_with_arrivals

    prompts, max_tokens, arrivals = repeating_workload(8, seed=4)
    max_tokens = [40] * len(prompts)
    llm = LLM(tiny_llama, max_num_seqs=4, max_num_batched_tokens=64, **SPEC)
    outputs = run_with_arrivals(llm, prompts, max_tokens, arrivals, aborts={2: 16, 5: 20})
    assert {o.outputs[0].finish_reason for o in outputs[2:6:3]} == {"abort"}
    assert sum(o.metrics.num_proposed_tokens for o in outputs) > 0
    engine = llm.llm_engine
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked after aborts"


def test_simulator_refuses_speculation():
    from minicb.sim import simulate
    from minicb.sim.workload import Workload, WorkloadRequest

    with pytest.raises(ValueError, match="speculative_method"):
        simulate(Workload("one", [WorkloadRequest(8, 4)]), speculative_method="ngram")


def test_a_request_with_stop_strings_is_not_speculated():
    """Stop strings are found in the text after a step; tokens accepted past one could not be
    taken back, so such a request decodes one token a step, its output as without speculation."""
    from minicb.model.default import default_model_path

    path = default_model_path()
    head = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul("
    params = [SamplingParams(max_tokens=40, temperature=0, stop=["\n\n"]),
              SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)]
    outputs = {}
    for name, knobs in [("plain", {}), ("speculative", SPEC)]:
        llm = LLM(path, max_num_seqs=2, **knobs)
        outputs[name] = llm.generate([head, head], params, use_tqdm=False)
    plain, speculative = outputs["plain"], outputs["speculative"]
    for a, b in zip(plain, speculative):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
    assert speculative[0].outputs[0].finish_reason == "stop"
    assert speculative[0].metrics.num_proposed_tokens == 0
    assert speculative[1].metrics.num_proposed_tokens > 0, "the other request was speculated"

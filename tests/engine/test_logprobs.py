"""Log-probabilities against transformers' log-softmax on the same weights: the sampled tokens'
(`logprobs`) and the prompt's (`prompt_logprobs`), through whole and chunked prefills, parallel
samples, the static batch's padding, and a prefix-cache hit (the request recomputes its prompt).

Tolerance: ATOL below, in nats. Both sides compute in float32; the engine's attention and
matmuls sum in another order than transformers', which moves a log-probability by about 6e-6
nats on the shipped model (the assertion prints the largest difference when it fails)."""

from __future__ import annotations

import random

import pytest
import torch

from minicb import LLM, SamplingParams

ATOL = 5e-5
K = 3


def hf_logprobs(model_dir: str, token_ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every position of one sequence: [len, vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().log_softmax(-1)


def check_request(model_dir: str, output, k: int = K, k_out: int | None = None) -> float:
    """Every prompt and output log-probability of a finished output against transformers';
    returns the largest difference. `k`: prompt_logprobs, `k_out`: logprobs (default k)."""
    prompt = output.prompt_token_ids
    completion = output.outputs[0]
    reference = hf_logprobs(model_dir, prompt + completion.token_ids)
    worst = 0.0
    assert output.prompt_logprobs is not None and len(output.prompt_logprobs) == len(prompt)
    assert output.prompt_logprobs[0] is None, "nothing predicts the first prompt token"
    wanted = [(output.prompt_logprobs[i], i - 1, prompt[i], k) for i in range(1, len(prompt))]
    wanted += [(top, len(prompt) - 1 + j, token, k if k_out is None else k_out)
               for j, (top, token) in enumerate(zip(completion.logprobs, completion.token_ids))]
    for top, position, token, top_k in wanted:
        row = reference[position]
        top_ids = row.topk(top_k).indices.tolist() if top_k else []
        assert set(top) == set(top_ids) | {token}, f"position {position}: ids {set(top)}"
        for token_id, value in top.items():
            worst = max(worst, abs(value - row[token_id].item()))
    assert worst < ATOL, f"largest difference {worst:.2e} nats"
    return worst


def prompts_for(vocab: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(1, 60))] for _ in range(count)]


@pytest.mark.parametrize("scheduler,budget", [("continuous", 2048), ("continuous", 16),
                                              ("static", 2048)])
def test_logprobs_equal_transformers_on_random_configs(tiny_model, scheduler, budget):
    """Whole prompts, prompts chunked by a 16-token budget, and a static batch's left padding."""
    llm = LLM(tiny_model, scheduler=scheduler, max_num_batched_tokens=budget, max_num_seqs=4,
              max_model_len=128)
    prompts = prompts_for(512, 6, seed=budget)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=K,
                            prompt_logprobs=K)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for output in outputs:
        check_request(tiny_model, output)
    assert [len(o.prompt_logprobs) for o in outputs] == [len(p) for p in prompts]


def test_logprobs_equal_transformers_on_the_shipped_model():
    llm = LLM(max_num_batched_tokens=8, max_num_seqs=4)     # chunks the longer prompts
    from minicb.model.loader import resolve_model_path

    model_dir = str(resolve_model_path(None))
    texts = ["def add(a, b):\n    return a + b\n", "import os\n\nfor name in os.listdir(path):",
             "x"]
    params = [SamplingParams(max_tokens=4, temperature=0, logprobs=K, prompt_logprobs=K),
              SamplingParams(max_tokens=4, temperature=0.8, seed=1, logprobs=0, prompt_logprobs=0,
                             ignore_eos=True),
              SamplingParams(max_tokens=3, temperature=0, logprobs=1, prompt_logprobs=5)]
    outputs = llm.generate(texts, params, use_tqdm=False)
    for output, p in zip(outputs, params):
        check_request(model_dir, output, k=p.prompt_logprobs, k_out=p.logprobs)
    assert outputs[2].prompt_logprobs == [None]          # a one-token prompt


def test_a_prefix_cache_hit_still_gives_prompt_logprobs(tiny_llama):
    """A request asking for prompt logprobs claims no cached blocks: it recomputes its prompt, and
    its blocks still serve the requests after it."""
    llm = LLM(tiny_llama, enable_prefix_caching=True, max_model_len=128)
    prompt = prompts_for(512, 1, seed=7)[0] * 2
    plain = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    asking = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, logprobs=K,
                            prompt_logprobs=K)
    first = llm.generate([prompt], plain, use_tqdm=False)[0]
    second = llm.generate([prompt], asking, use_tqdm=False)[0]
    third = llm.generate([prompt], plain, use_tqdm=False)[0]
    assert second.metrics.num_cached_tokens == 0
    assert third.metrics.num_cached_tokens > 0
    check_request(tiny_llama, second)
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == third.outputs[0].token_ids


def test_parallel_samples_each_get_prompt_logprobs(tiny_llama):
    llm = LLM(tiny_llama, max_model_len=128)
    prompt = prompts_for(512, 1, seed=3)[0]
    outputs = llm.generate([prompt], SamplingParams(n=3, max_tokens=3, seed=5, logprobs=1,
                                                    prompt_logprobs=2, ignore_eos=True),
                           use_tqdm=False)
    assert len(outputs) == 1 and len(outputs[0].outputs) == 3
    reference = hf_logprobs(tiny_llama, prompt)
    for i in range(1, len(prompt)):
        assert outputs[0].prompt_logprobs[i][prompt[i]] == pytest.approx(
            reference[i - 1, prompt[i]].item(), abs=ATOL)


def test_prompt_logprobs_survive_a_preemption(tiny_llama):
    """A request preempted after its prefill recomputes the prompt: its prompt logprobs are kept
    once, not twice."""
    llm = LLM(tiny_llama, max_model_len=128, num_kv_blocks=6, block_size=16, max_num_seqs=4)
    prompts = prompts_for(512, 4, seed=11)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, logprobs=K,
                            prompt_logprobs=K)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert sum(o.metrics.num_preemptions for o in outputs) > 0, "no preemption happened"
    for output in outputs:
        check_request(tiny_llama, output)


def test_no_prompt_logprobs_unless_asked(tiny_llama):
    llm = LLM(tiny_llama, max_model_len=128)
    output = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert output.prompt_logprobs is None and output.outputs[0].logprobs is None

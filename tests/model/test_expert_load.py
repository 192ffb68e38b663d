"""Tokens per expert per step: counted by the sparse blocks, summarised, and shown on /metrics."""

from __future__ import annotations

import torch

from minicb import LLM, SamplingParams
from minicb.model.expert_load import ExpertLoad
from minicb.serving.metrics import ServingStats


def test_imbalance_and_experts_touched_by_hand():
    load = ExpertLoad(num_layers=1, num_experts=4, top_k=1, device=torch.device("cpu"))
    load.record(0, torch.tensor([4, 0, 0, 0]))    # all on one expert: max 4, mean 1
    load.record(0, torch.tensor([1, 1, 1, 1]))    # even: max 1, mean 1
    s = load.summary()
    assert s["imbalance"] == [(4 + 1) / (1 + 1)]
    assert s["experts_touched_per_step"] == [(1 + 4) / 2]
    assert s["tokens_per_expert"] == [[5, 1, 1, 1]] and s["last_step"] == [[1, 1, 1, 1]]
    load.reset()
    assert load.summary()["steps"] == 0


def test_engine_counts_every_token_k_times_and_metrics_show_it(tiny_qwen3_moe):
    """Every token the model computes (each prompt token, each fed-back sampled token) is
    routed to top_k experts in each sparse layer: the counts add up to exactly that."""
    llm = LLM(tiny_qwen3_moe, attention="torch", max_num_seqs=4, max_model_len=128)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12] * 30]
    max_tokens = [6, 3, 9]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in max_tokens]
    llm.generate(prompts, params, use_tqdm=False)
    load = llm.llm_engine.model.expert_load
    s = load.summary()
    computed = sum(len(p) + n - 1 for p, n in zip(prompts, max_tokens))
    assert [sum(row) for row in s["tokens_per_expert"]] == [computed * s["top_k"]] * 2
    assert s["steps"] == max(max_tokens)       # one prefill step for all three, then decodes
    assert all(1.0 <= x <= s["num_experts"] / s["top_k"] for x in s["imbalance"])
    assert all(s["top_k"] <= x <= s["num_experts"] for x in s["experts_touched_per_step"])
    text = ServingStats(load).render(0, 0, 0, 1)
    for expert, n in enumerate(s["tokens_per_expert"][1]):
        assert f'minicb_moe_expert_tokens_total{{layer="1",expert="{expert}"}} {n}\n' in text
    assert f'minicb_moe_imbalance{{layer="0"}} {s["imbalance"][0]}' in text
    assert "minicb_moe" not in ServingStats().render(0, 0, 0, 1), "a dense model shows none"

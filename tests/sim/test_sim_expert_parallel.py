"""The expert-parallel decode cost model: experts touched, expert reads, the all-to-all."""

from __future__ import annotations

import pytest
import torch

from minicb.sim.expert_parallel import (
    QWEN3_30B_A3B,
    ep_decode_parts,
    ep_layer_under_load,
    eplb_scenarios,
    expert_imbalance,
    experts_touched,
    placement_imbalance,
    skewed_loads,
)


def test_experts_touched_matches_uniform_routing():
    """k at one token, all E at many; in between, the mean of random top-k choices."""
    assert experts_touched(64, 8, 1) == pytest.approx(8)
    assert experts_touched(64, 8, 256) == pytest.approx(64, abs=1e-6)
    gen = torch.Generator().manual_seed(0)
    for tokens in (2, 8, 16):
        trials = [len(set(torch.rand(tokens, 64, generator=gen).topk(8).indices.flatten()
                          .tolist())) for _ in range(400)]
        assert sum(trials) / len(trials) == pytest.approx(experts_touched(64, 8, tokens), rel=0.02)


def test_expert_parallel_splits_the_reads_and_pays_an_exchange():
    one = ep_decode_parts(QWEN3_30B_A3B, batch=64, n=1)
    eight = ep_decode_parts(QWEN3_30B_A3B, batch=64, n=8)
    assert one["all_to_all"] == 0 and eight["all_to_all"] > 0
    assert eight["experts"] == pytest.approx(one["experts"] / 8)
    assert eight["touched_per_gpu"] == pytest.approx(one["touched_per_gpu"] / 8)
    bigger = ep_decode_parts(QWEN3_30B_A3B, batch=256, n=8)
    assert bigger["all_to_all"] > eight["all_to_all"]
    skewed = ep_decode_parts(QWEN3_30B_A3B, batch=64, n=8, imbalance=1.5)
    assert skewed["experts"] == pytest.approx(1.5 * eight["experts"])
    assert skewed["all_to_all"] == eight["all_to_all"]


def test_bad_splits_are_refused():
    with pytest.raises(ValueError, match="cannot hold 128 experts evenly"):
        ep_decode_parts(QWEN3_30B_A3B, batch=8, n=3)
    with pytest.raises(ValueError, match="imbalance=0.5 is below 1"):
        ep_decode_parts(QWEN3_30B_A3B, batch=8, n=2, imbalance=0.5)


def test_a_balanced_placement_with_redundant_experts_evens_a_skewed_load():
    """Even loads: every placement is even. A Zipf-skewed load of 64 experts on 8 GPUs: the
    contiguous split is uneven, a balanced one less so, and 8 redundant copies of the hottest
    experts less still."""
    assert placement_imbalance([5.0] * 64, 8) == pytest.approx(1.0)
    skewed = [1000 / (rank + 1) for rank in range(64)]
    contiguous = placement_imbalance(skewed, 8)
    balanced = placement_imbalance(skewed, 8, balanced=True)
    replicated = placement_imbalance(skewed, 8, redundant=8, balanced=True)
    assert contiguous > balanced > replicated >= 1.0
    assert replicated < 1.1
    with pytest.raises(ValueError, match="do not fill 8 GPUs' slots evenly"):
        placement_imbalance(skewed, 8, redundant=3, balanced=True)


def test_a_skewed_workload_raises_the_imbalance_figure_and_eplb_brings_it_back():
    """Skewed routing: the busiest expert far above the mean, the contiguous split's busiest GPU
    slower than the balanced one's, and DeepSeek-V3's share of redundant copies nearly even."""
    uniform = skewed_loads(64, 8, 2048, skew=0.0)
    skewed = skewed_loads(64, 8, 2048, skew=1.2)
    assert sum(uniform) == sum(skewed) == 2048 * 8 and max(skewed) <= 2048
    assert expert_imbalance(uniform) < 1.3 < 3 < expert_imbalance(skewed)
    contiguous = ep_layer_under_load(QWEN3_30B_A3B, skewed_loads(128, 8, 4096, 1.2), 8)
    eplb = ep_layer_under_load(QWEN3_30B_A3B, skewed_loads(128, 8, 4096, 1.2), 8, 16, True)
    assert contiguous["imbalance"] > 1.3 and eplb["imbalance"] < 1.01
    assert contiguous["total"] > 1.3 * eplb["total"]
    assert contiguous["all_to_all"] > eplb["all_to_all"] > 0
    rows = eplb_scenarios(skews=(0.0, 1.2), tokens=1024)
    assert rows[0]["redundant"] == 16, "an eighth of 128 experts, as DeepSeek-V3's 32 of 256"
    assert rows[1]["contiguous"]["layer_us"] > rows[1]["eplb"]["layer_us"]

"""Chapter 14: the router, the dispatch and the combine, bit for bit against minicb's MoE block
(itself equal to transformers' eager experts bit for bit, tests/model/test_moe.py)."""

from __future__ import annotations

import pytest
import torch
from adapter import chapter, run_docstring_examples
from minicb.kernels.fused_moe_reference import align_by_expert, fused_moe_torch

from minicb.model.moe import route as minicb_route

ch14 = chapter("14")


def _problem(tokens: int, experts: int, hidden: int = 32, size: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, hidden, generator=gen),
            torch.randn(experts, 2 * size, hidden, generator=gen) / hidden ** 0.5,
            torch.randn(experts, hidden, size, generator=gen) / size ** 0.5,
            torch.randn(tokens, experts, generator=gen) * 2)


def test_ch14_worked_examples():
    run_docstring_examples(ch14)


@pytest.mark.parametrize("renormalize", [True, False])
def test_ch14_route_matches_minicb(renormalize):
    *_, logits = _problem(50, 16, seed=1)
    weights, ids = ch14.route(logits, 4, renormalize)
    want_weights, want_ids = minicb_route(logits, 4, renormalize, float32_weights=False)
    assert torch.equal(ids, want_ids), "each token's top-k experts, in ascending id"
    assert torch.equal(weights, want_weights), (
        f"the weights differ (renormalize={renormalize}): the softmax over every expert, "
        "kept for the top k" + (", divided by their sum" if renormalize else ", as they are"))


def test_ch14_dispatch_groups_every_pair_once_by_expert():
    ids = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(t))[:4]
                       for t in range(20)]).sort(-1).values
    groups = ch14.dispatch(ids)
    experts = [expert for expert, _ in groups]
    assert experts == sorted(set(ids.flatten().tolist())), \
        "one group per touched expert, in ascending id, none for an untouched one"
    pairs = torch.cat([p for _, p in groups]).tolist()
    assert sorted(pairs) == list(range(ids.numel())), "every (token, slot) pair exactly once"
    for expert, group in groups:
        assert (ids.flatten()[group] == expert).all() and (group.diff() > 0).all()


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 8, 2), (37, 8, 2), (23, 32, 8)])
def test_ch14_forward_equals_minicb_bit_for_bit(tokens, experts, top_k):
    x, w_gate_up, w_down, logits = _problem(tokens, experts, seed=tokens)
    weights, ids = minicb_route(logits, top_k, True, float32_weights=False)
    want = fused_moe_torch(x, w_gate_up, w_down, weights, ids, align_by_expert(ids, experts, 1))
    got = ch14.moe_forward(x, w_gate_up, w_down, weights, ids)
    assert torch.equal(got, want), (
        f"differs by up to {(got - want).abs().max():.2e}: sum each token's outputs slot after "
        "slot in ascending expert id (another order rounds differently), and weight each "
        "expert's output after its down projection")


def test_ch14_untouched_experts_are_never_read():
    x, w_gate_up, w_down, logits = _problem(3, 16, seed=5)
    weights, ids = minicb_route(logits, 2, False, float32_weights=False)
    untouched = sorted(set(range(16)) - set(ids.flatten().tolist()))
    w_gate_up[untouched], w_down[untouched] = float("nan"), float("nan")
    out = ch14.moe_forward(x, w_gate_up, w_down, weights, ids)
    assert out.isfinite().all(), "an expert no token chose was read (its weights are NaN here)"

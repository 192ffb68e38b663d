"""The C experts (kernels/cpu_moe.c) against the torch reference, and through a whole MoE block.

Tolerance: 1e-5, relative and absolute, on outputs of order one. The C products sum each output
over hidden (or expert_size) float32 terms in cpu_linear.c's order, torch's in its BLAS's; the
two roundings differ by a few units of float32's 6e-8 per term. Equality bit for bit is asked of
the combine stage, which both paths share."""

from __future__ import annotations

import pytest
import torch
from minicb.kernels.cpu_moe import moe_experts_cpu
from minicb.kernels.fused_moe_reference import align_by_expert, combine, moe_experts_torch

from minicb.model.moe import MoeArgs, SparseMoeBlock, route
from minicb.registry import MOE_KERNELS

TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def _problem(tokens: int, experts: int, top_k: int, hidden: int, size: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w_gate_up = torch.randn(experts, 2 * size, hidden, generator=gen) / hidden ** 0.5
    w_down = torch.randn(experts, hidden, size, generator=gen) / size ** 0.5
    weights, ids = route(torch.randn(tokens, experts, generator=gen) * 3, top_k,
                         renormalize=True, float32_weights=False)
    return x, w_gate_up, w_down, weights, ids


@pytest.mark.parametrize("tokens,experts,top_k,hidden,size", [
    (1, 8, 2, 64, 48),        # a one-row decode: two experts of eight read
    (37, 8, 2, 64, 48),       # every expert touched, groups of more rows than a tile's three
    (5, 32, 8, 96, 36),       # many small experts, top-8, sizes not a vector's multiple
])
def test_c_experts_equal_the_reference_and_read_only_the_chosen(tokens, experts, top_k, hidden,
                                                                size):
    x, w_gate_up, w_down, weights, ids = _problem(tokens, experts, top_k, hidden, size, tokens)
    align = align_by_expert(ids, experts, 1)
    want = moe_experts_torch(x, w_gate_up, w_down, weights, ids, align)
    untouched = align.counts == 0
    if untouched.any():    # an expert no token chose is poison: reading it would spread NaN
        w_gate_up[untouched], w_down[untouched] = float("nan"), float("nan")
    got = moe_experts_cpu(x, w_gate_up, w_down, weights, ids, align)
    torch.testing.assert_close(got, want, **TOLERANCE)


def test_an_expert_parallel_share_leaves_the_other_ranks_pairs_zero():
    """Experts 4..7 held (first_expert 4): their pairs as the reference computes them, the
    others exactly zero, so the ranks' sum is one rank's answer."""
    x, w_gate_up, w_down, weights, ids = _problem(9, 8, 2, 64, 32, seed=5)
    align = align_by_expert(ids, 8, 1)
    share = w_gate_up[4:].contiguous(), w_down[4:].contiguous()
    got = moe_experts_cpu(x, *share, weights, ids, align, first_expert=4)
    torch.testing.assert_close(got, moe_experts_torch(x, *share, weights, ids, align, 4),
                               **TOLERANCE)
    assert (got[ids < 4] == 0).all() and (got[ids >= 4] != 0).any()


def test_bad_inputs_are_refused_by_name():
    x, w_gate_up, w_down, weights, ids = _problem(3, 8, 2, 64, 32, seed=6)
    align = align_by_expert(ids, 8, 1)
    with pytest.raises(ValueError, match="float32"):
        moe_experts_cpu(x.bfloat16(), w_gate_up, w_down, weights, ids, align)
    with pytest.raises(ValueError, match="blocks of one row"):
        moe_experts_cpu(x, w_gate_up, w_down, weights, ids, align_by_expert(ids, 8, 4))
    wrong = align._replace(counts=align.counts + 1)
    with pytest.raises(ValueError, match="do not add up"):
        moe_experts_cpu(x, w_gate_up, w_down, weights, ids, wrong)


def test_a_block_runs_small_steps_in_c_and_big_ones_in_torch(monkeypatch):
    """cpu_rows picks the path by the step's rows alone; both give the block's answer."""
    moe = MoeArgs(num_experts=8, top_k=2, expert_size=32, renormalize=True,
                  float32_weights=False, sparse_layers=(0,))
    torch.manual_seed(7)
    block = SparseMoeBlock(64, moe)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.1)
    calls = []
    monkeypatch.setitem(MOE_KERNELS, "cpu",
                        lambda *a: calls.append(a[0].shape[0]) or moe_experts_cpu(*a))
    block.cpu_rows = 4
    x = torch.randn(6, 64)
    with torch.no_grad():
        weights, ids = route(block.gate(x), 2, True, False)
        reference = combine(moe_experts_torch(x, block.w_gate_up, block.w_down, weights, ids,
                                              align_by_expert(ids, 8, 1)))
        small, big = block(x[:4]), block(x)
    assert calls == [4], "the 4-row step in C, the 6-row one in torch"
    torch.testing.assert_close(small, reference[:4], **TOLERANCE)
    assert torch.equal(big, reference), "above cpu_rows the block is the torch reference"

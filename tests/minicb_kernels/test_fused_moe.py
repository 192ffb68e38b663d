"""The Triton fused-MoE kernel against the torch reference (float32, in Triton's interpreter on a
CPU; compiled on a GPU), and through a whole MoE block."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from minicb.kernels.fused_moe import fused_moe_triton  # noqa: E402
from minicb.kernels.fused_moe_reference import align_by_expert, fused_moe_torch  # noqa: E402

from minicb.model.moe import route  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _problem(tokens: int, experts: int, top_k: int, hidden: int, size: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w_gate_up = torch.randn(experts, 2 * size, hidden, generator=gen) / hidden ** 0.5
    w_down = torch.randn(experts, hidden, size, generator=gen) / size ** 0.5
    logits = torch.randn(tokens, experts, generator=gen) * 3
    return [t.to(DEVICE) for t in (x, w_gate_up, w_down, logits)]


@pytest.mark.parametrize("tokens,experts,top_k,hidden,size", [
    (1, 8, 2, 64, 48),        # a one-row decode: one block per touched expert, mostly padding
    (37, 8, 2, 64, 48),       # every expert touched, blocks past 16 rows, N not a tile multiple
    (5, 32, 8, 96, 32),       # many small experts, top-8, K not a multiple of BLOCK_K
])
def test_kernel_equals_the_reference(tokens, experts, top_k, hidden, size):
    x, w_gate_up, w_down, logits = _problem(tokens, experts, top_k, hidden, size, seed=tokens)
    weights, ids = route(logits, top_k, renormalize=True, float32_weights=False)
    want = fused_moe_torch(x, w_gate_up, w_down, weights, ids, align_by_expert(ids, experts, 1))
    got = fused_moe_triton(x, w_gate_up, w_down, weights, ids, align_by_expert(ids, experts, 16))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_untouched_experts_are_never_read_and_a_wrong_block_is_caught():
    """NaN in every expert no token chose leaves the output finite; labelling a block with the
    wrong expert changes it (the comparison above can fail)."""
    x, w_gate_up, w_down, logits = _problem(3, 8, 2, 64, 32, seed=7)
    weights, ids = route(logits, 2, renormalize=False, float32_weights=True)
    align = align_by_expert(ids, 8, 16)
    untouched = sorted(set(range(8)) - set(ids.flatten().tolist()))
    w_gate_up[untouched], w_down[untouched] = float("nan"), float("nan")
    good = fused_moe_triton(x, w_gate_up, w_down, weights, ids, align)
    assert good.isfinite().all()
    wrong = align._replace(block_experts=align.block_experts.roll(1))
    assert not torch.allclose(fused_moe_triton(x, w_gate_up, w_down, weights, ids, wrong), good)


def test_misaligned_blocks_are_refused():
    x, w_gate_up, w_down, logits = _problem(4, 8, 2, 64, 32, seed=8)
    weights, ids = route(logits, 2, renormalize=True, float32_weights=False)
    with pytest.raises(ValueError, match="block_size=16"):
        fused_moe_triton(x, w_gate_up, w_down, weights, ids, align_by_expert(ids, 8, 4))


def test_two_shares_of_the_experts_add_up_to_all_of_them():
    """Expert parallelism's arithmetic: two ranks holding experts 0-3 and 4-7 compute disjoint
    pairs (zeros elsewhere), so their sum is the one-rank result exactly in torch, and to
    rounding through the kernel."""
    from minicb.kernels.fused_moe import moe_experts_triton
    from minicb.kernels.fused_moe_reference import moe_experts_torch

    x, w_gate_up, w_down, logits = _problem(9, 8, 2, 64, 32, seed=9)
    weights, ids = route(logits, 2, renormalize=True, float32_weights=False)
    full = moe_experts_torch(x, w_gate_up, w_down, weights, ids, align_by_expert(ids, 8, 1))
    for experts, block_size in ((moe_experts_torch, 1), (moe_experts_triton, 16)):
        align = align_by_expert(ids, 8, block_size)
        low, high = (experts(x, w_gate_up[f:f + 4], w_down[f:f + 4], weights, ids, align, f)
                     for f in (0, 4))
        held_low = (ids < 4)[..., None]
        assert (low * ~held_low == 0).all() and (high * held_low == 0).all()
        if experts is moe_experts_torch:
            assert torch.equal(low + high, full)
        else:
            torch.testing.assert_close(low + high, full, rtol=1e-5, atol=1e-5)

"""The mixture-of-experts block against transformers' own (eager experts), bit for bit; the router's
rules; the expert alignment's invariants; the loader's refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from minicb.kernels.fused_moe_reference import align_by_expert, fused_moe_torch

from minicb.model.loader import load_model, model_args_from_config
from minicb.model.moe import SparseMoeBlock, route


def _blocks(path: str):
    """Each layer's feed-forward in transformers (eager experts) and in minicb, same weights."""
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                  experts_implementation="eager").eval()
    ours = load_model(Path(path), attention="torch")
    return [(a.mlp, b.mlp) for a, b in zip(theirs.model.layers, ours.model.layers)]


def test_block_equals_transformers_bit_for_bit(tiny_moe):
    """Same routing, same products, the same summation order: the same bits, for a batch of
    many tokens (every expert touched) and for one token."""
    torch.manual_seed(1)
    blocks = _blocks(tiny_moe)
    assert any(isinstance(ours, SparseMoeBlock) for _, ours in blocks)
    for theirs, ours in blocks:
        for tokens in (53, 1):
            x = torch.randn(tokens, ours.gate.in_features if isinstance(ours, SparseMoeBlock)
                            else ours.gate_proj.in_features)
            with torch.no_grad():
                assert torch.equal(theirs(x[None])[0], ours(x))


def test_a_wrong_router_rule_is_caught(tiny_qwen3_moe, tiny_mixtral):
    """The check above can fail: renormalising where the family does not (or the reverse), or
    summing a token's experts in another order, changes the block's output."""
    torch.manual_seed(2)
    for path in (tiny_qwen3_moe, tiny_mixtral):
        theirs, ours = _blocks(path)[0]
        x = torch.randn(40, ours.gate.in_features)
        ours.moe = type(ours.moe)(**{**ours.moe.__dict__, "renormalize": not ours.moe.renormalize})
        with torch.no_grad():
            assert not torch.allclose(theirs(x[None])[0], ours(x), atol=1e-4)


def test_summation_order_matters_and_is_fixed():
    """Three float32 contributions summed in two orders differ in the last bits; the block's
    combine sums in ascending expert id whatever order the router ranked them."""
    torch.manual_seed(3)
    logits = torch.randn(64, 8)
    weights, ids = route(logits, 3, renormalize=False, float32_weights=False)
    assert (ids.diff(dim=-1) > 0).all(), "each token's experts come in ascending id"
    ranked = torch.softmax(logits, -1).topk(3).indices
    assert torch.equal(ranked.sort(-1).values, ids)
    assert torch.allclose(weights, torch.softmax(logits, -1).gather(-1, ids))
    renorm, _ = route(logits, 3, renormalize=True, float32_weights=False)
    assert torch.allclose(renorm.sum(-1), torch.ones(64))


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_alignment_groups_every_pair_once_by_expert(block_size):
    torch.manual_seed(4)
    num_experts, tokens, top_k = 16, 11, 4
    ids = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(tokens)]).sort(-1).values
    align = align_by_expert(ids, num_experts, block_size)
    pad = tokens * top_k
    real = align.sorted_pairs[align.sorted_pairs != pad]
    assert sorted(real.tolist()) == list(range(pad)), "every (token, slot) pair exactly once"
    assert torch.equal(align.counts, torch.bincount(ids.flatten(), minlength=num_experts))
    blocks = align.sorted_pairs.view(-1, block_size)
    for block, expert in zip(blocks, align.block_experts.tolist()):
        pairs = block[block != pad]
        if expert < 0:
            assert pairs.numel() == 0, "a block past the last expert's holds only padding"
        else:   # a block's rows all belong to its expert, in the order of the pairs
            assert (ids.flatten()[pairs] == expert).all() and (pairs.diff() > 0).all()
    touched = int((align.counts > 0).sum())
    assert int((align.block_experts >= 0).sum()) == int(
        ((align.counts + block_size - 1) // block_size).sum()) >= touched


def test_untouched_experts_are_never_read():
    """The grouped product reads only the experts the step chose: the others may hold NaN."""
    torch.manual_seed(5)
    experts, hidden, size = 8, 16, 8
    w_gate_up, w_down = torch.randn(experts, 2 * size, hidden), torch.randn(experts, hidden, size)
    x = torch.randn(3, hidden)
    weights, ids = route(torch.randn(3, experts), 2, True, False)
    untouched = sorted(set(range(experts)) - set(ids.flatten().tolist()))
    w_gate_up[untouched], w_down[untouched] = float("nan"), float("nan")
    out = fused_moe_torch(x, w_gate_up, w_down, weights, ids, align_by_expert(ids, experts, 1))
    assert out.isfinite().all()


def _config(path: str) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def test_families_read_their_rules(tiny_qwen3_moe, tiny_mixtral, tiny_many_experts):
    qwen3 = model_args_from_config(_config(tiny_qwen3_moe)).moe
    mixtral = model_args_from_config(_config(tiny_mixtral)).moe
    many = model_args_from_config(_config(tiny_many_experts)).moe
    assert (qwen3.renormalize, qwen3.float32_weights, qwen3.sparse_layers) == (True, False, (0, 1))
    assert (mixtral.renormalize, mixtral.float32_weights, mixtral.prefix) == (
        True, True, "block_sparse_moe")
    assert (many.num_experts, many.top_k, many.renormalize, many.sparse_layers,
            many.shared_expert_size) == (32, 8, False, (0, 2), 64)


def test_loader_refuses_what_it_cannot_compute(tiny_mixtral, tmp_path):
    config = _config(tiny_mixtral)
    with pytest.raises(ValueError, match="sliding_window=64"):
        model_args_from_config({**config, "sliding_window": 64})
    with pytest.raises(ValueError, match="num_experts_per_tok=9 exceeds the 8 experts"):
        model_args_from_config({**config, "num_experts_per_tok": 9})
    with pytest.raises(ValueError, match="router_z_loss"):    # a field no family here reads
        model_args_from_config({**config, "router_z_loss": 0.1})
    with pytest.raises(ValueError, match="not supported for a mixture of experts"):
        load_model(Path(tiny_mixtral), attention="torch", quantization="int8")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_mixtral, broken)
    from safetensors.torch import load_file, save_file

    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="experts.3.w2"):
        load_model(broken, attention="torch")

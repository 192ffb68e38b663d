"""Fused projections: q/k/v and gate/up as one matrix product each, on the same weights."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from minicb import default_model_path
from minicb.bench.common import weight_bytes
from minicb.model.loader import load_model


def unfuse(model):
    for layer in model.model.layers:
        layer.self_attn.qkv_proj = None
        layer.mlp.gate_up_proj = None


def test_fused_weights_are_the_checkpoint_weights_without_a_copy():
    model = load_model(Path(default_model_path()))
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.qkv_proj is not None and mlp.gate_up_proj is not None
    fused = attn.qkv_proj.weight
    assert torch.equal(fused, torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                         attn.v_proj.weight]))
    # the separate weights are views into the fused one: one copy of the numbers in memory
    assert attn.k_proj.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == \
        mlp.gate_up_proj.weight.untyped_storage().data_ptr()
    # the bytes in memory are the checkpoint's bytes, not more
    checkpoint = {}
    for file in Path(default_model_path()).glob("*.safetensors"):
        checkpoint.update(load_file(str(file)))
    if model.args.tie_word_embeddings:
        checkpoint.pop("lm_head.weight", None)
    assert weight_bytes(model) == sum(t.numel() * t.element_size() for t in checkpoint.values())


def test_fused_and_separate_projections_agree():
    from minicb.model.attention import AttentionMetadata  # noqa: F401  (the forward's contract)

    model = load_model(Path(default_model_path()))
    x = torch.randn(7, model.args.hidden_size, generator=torch.Generator().manual_seed(0))
    layer = model.model.layers[1]
    with torch.inference_mode():
        fused_mlp = layer.mlp(x)
        q, k, v = layer.self_attn.qkv_proj(x).split(
            [layer.self_attn.q_proj.out_features, layer.self_attn.k_proj.out_features,
             layer.self_attn.v_proj.out_features], dim=-1)
        unfuse(model)
        separate_mlp = layer.mlp(x)
        assert torch.allclose(fused_mlp, separate_mlp, atol=1e-5, rtol=1e-5)
        for fused_part, proj in ((q, layer.self_attn.q_proj), (k, layer.self_attn.k_proj),
                                 (v, layer.self_attn.v_proj)):
            assert torch.allclose(fused_part, proj(x), atol=1e-5, rtol=1e-5)


def test_the_model_counts_each_weight_once_as_its_checkpoint_does():
    """Fusing adds no parameter: the fused q/k/v and gate/up matrices hold the same numbers as the
    separate projections (which are views of them), so parameters() and state_dict() list the
    checkpoint's tensors, each once (the shipped model's 4.0 M, not 6.0 M)."""
    model = load_model(Path(default_model_path()))
    checkpoint = {}
    for file in Path(default_model_path()).glob("*.safetensors"):
        checkpoint.update(load_file(str(file)))
    if model.args.tie_word_embeddings:
        checkpoint.pop("lm_head.weight", None)
    assert sum(p.numel() for p in model.parameters()) == \
        sum(t.numel() for t in checkpoint.values())
    assert {name for name, _ in model.named_parameters()} == set(checkpoint)
    assert set(model.state_dict()) - {"lm_head.weight"} == set(checkpoint)

"""Checkpoints stored quantized in the compressed-tensors format load as they are: written here by
compressed-tensors itself (llm-compressor, which would normally write them, pins an older
transformers than this project's, so it is not installed), they give the tokens of the same
weights quantized at load (8 bits per channel: minicb's own int8) or of transformers running the
weights compressed-tensors' own decompression gives (W8A16 and W4A16 in groups). transformers
does not load the checkpoints itself: with compressed-tensors 0.20 it reinitialises an
asymmetric scheme's packed zero points (their shape differs from what it expects)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference import check_all, greedy, hf_greedy

from minicb import LLM
from minicb.model.compressed import split_compressed
from minicb.model.int4 import Int4Linear, dequantize_int4
from minicb.model.loader import load_model
from minicb.model.quant import Int8Linear

PROMPTS = [[3 + (7 * i + j) % 500 for j in range(5 + 9 * i)] for i in range(4)]
MAX_TOKENS = [24, 6, 20, 12]
# name: (bits, strategy, group size, symmetric); W8A16 and W4A16 are compressed-tensors' presets
SCHEMES = {"W8A16-channel": (8, "channel", None, True), "W8A16": (8, "group", 128, True),
           "W4A16": (4, "group", 128, True), "W4A16_ASYM-g32": (4, "group", 32, False)}


def write_compressed(source: str, target: Path, bits: int, strategy: str, group: int | None,
                     symmetric: bool) -> str:
    """The checkpoint at `source` quantized and saved by compressed-tensors, pack-quantized,
    every Linear but the head: scales and zero points from each group's min and max (what
    llm-compressor's default min-max observer computes)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy=strategy,
                            group_size=group)
    apply_quantization_config(model, QuantizationConfig(config_groups={
        "group_0": QuantizationScheme(targets=["Linear"], weights=args)}, ignore=["lm_head"]))
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            w = module.weight.detach()
            groups = w.view(w.shape[0], -1, group or w.shape[1])
            scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            module.weight_scale.data.copy_(scale.view_as(module.weight_scale))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(zero.view_as(module.weight_zero_point))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(target)
    compressor.update_config(str(target))
    return str(target)


def write_decompressed(path: str, target: Path) -> dict[str, torch.Tensor]:
    """The compressed checkpoint at `path` as a float32 one at `target`, each Linear's weight
    what compressed-tensors' own pack-quantized decompressor makes of it; returns its state."""
    import json

    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file, save_file

    config = json.loads((Path(path) / "config.json").read_text())
    scheme = QuantizationScheme(**config.pop("quantization_config")["config_groups"]["group_0"])
    state = load_file(str(Path(path) / "model.safetensors"))
    for prefix in [key.removesuffix(".weight_packed") for key in state
                   if key.endswith(".weight_packed")]:
        local = {key.removeprefix(prefix + "."): state.pop(key) for key in list(state)
                 if key.startswith(prefix + ".weight_")}
        state[f"{prefix}.weight"] = PackedQuantizationCompressor.decompress(local, scheme)[
            "weight"].float().contiguous()
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config))
    save_file(state, str(target / "model.safetensors"))
    return state


@pytest.fixture(scope="module")
def float_model(tmp_path_factory, save_checkpoint) -> str:
    """A Llama whose rows split into groups of 128 (hidden 128, intermediate 256)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0)
    return save_checkpoint(LlamaForCausalLM, config, tmp_path_factory.mktemp("ct-float"))


@pytest.fixture(scope="module")
def checkpoints(float_model, tmp_path_factory) -> dict[str, str]:
    """Each scheme's compressed checkpoint, and beside it (name + "-float") its decompression.
    compressed-tensors is imported here, not at collection: its import pulls in torch's compiler
    stack (several seconds), which only these tests should pay."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors writes the checkpoints "
                        "(pyproject dev)")
    root = tmp_path_factory.mktemp("ct")
    paths = {name: write_compressed(float_model, root / name, *scheme)
             for name, scheme in SCHEMES.items()}
    for path in paths.values():
        write_decompressed(path, Path(path + "-float"))
    return paths


def _tokens(path: str, **knobs) -> list[list[int]]:
    llm = LLM(path, max_num_seqs=3, **knobs)
    outputs = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS], use_tqdm=False)
    return [out.outputs[0].token_ids for out in outputs]


@pytest.mark.slow
def test_8_bits_per_channel_are_minicbs_int8_quantized_at_load(float_model, checkpoints):
    """(Marked slow, as the tests that share its checkpoints: their fixture imports
    compressed-tensors, 4-10 s on 2 cores, since it pulls in torch's compiler stack.)
    compressed-tensors' symmetric 8-bit scale is max|w| / 127.5, as minicb's int8 (torchao's),
    so the scales are equal; it rounds w / scale where minicb rounds w * (1 / scale), so a
    value on a rounding boundary (about 1 in 1,500 here) lands one step away. The tokens are the
    same."""
    stored = load_model(Path(checkpoints["W8A16-channel"]))
    at_load = load_model(Path(float_model), quantization="int8")
    for layer, ref in zip(stored.model.layers, at_load.model.layers):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                     "mlp.down_proj"):
            got, want = layer.get_submodule(name), ref.get_submodule(name)
            assert isinstance(got, Int8Linear), name
            steps = (got.weight.int() - want.weight.int()).abs()
            assert steps.max() <= 1 and steps.float().mean() < 1e-3, name
            torch.testing.assert_close(got.scale, want.scale, rtol=1e-6, atol=0)
    assert _tokens(checkpoints["W8A16-channel"]) == _tokens(float_model, quantization="int8")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["W8A16", "W4A16", "W4A16_ASYM-g32"])
def test_grouped_checkpoints_equal_transformers_on_their_decompressed_weights(checkpoints, scheme):
    """transformers loads the checkpoint through compressed-tensors, which dequantizes it to
    float32 weights; minicb keeps it quantized and dequantizes inside its kernels."""
    path = checkpoints[scheme]
    model = load_model(Path(path))
    kind = Int4Linear if scheme.startswith("W4") else Int8Linear
    assert isinstance(model.model.layers[1].mlp.down_proj, kind)
    references = hf_greedy(str(path) + "-float", PROMPTS, MAX_TOKENS)
    llm = LLM(path, max_num_seqs=3)
    assert llm.llm_engine.config.attention == "cpu"     # decodes through the fused C layer
    outputs = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS], use_tqdm=False)
    verdicts = check_all(references, outputs)
    assert verdicts.count("equal") >= len(PROMPTS) - 1, verdicts


@pytest.mark.slow
def test_the_int4_layers_hold_compressed_tensors_own_weights(checkpoints):
    """Dequantized, minicb's layers are the weights compressed-tensors decompresses to."""
    from safetensors.torch import load_file

    path = checkpoints["W4A16_ASYM-g32"]
    want = load_file(path + "-float/model.safetensors")
    ours = load_model(Path(path)).model.layers[0]
    qkv = ours.self_attn.qkv_proj
    parts = [want[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
    torch.testing.assert_close(dequantize_int4(qkv.weight, qkv.scale), torch.cat(parts),
                               atol=1e-6, rtol=1e-6)
    down = ours.mlp.down_proj
    torch.testing.assert_close(dequantize_int4(down.weight, down.scale),
                               want["model.layers.0.mlp.down_proj.weight"], atol=1e-6, rtol=1e-6)


def test_a_stored_quantization_is_run_as_stored_or_refused_by_name(checkpoints):
    with pytest.raises(ValueError, match="already quantized .* pass quantization=None, not "
                       "'int4'"):
        load_model(Path(checkpoints["W4A16"]), quantization="int4")
    config = {"quantization_config": {"quant_method": "gptq"}}
    with pytest.raises(ValueError, match="quant_method 'gptq'; minicb loads compressed-tensors"):
        split_compressed(config, {}, None, "config.json")
    config = {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"},
              "input_activations": {"num_bits": 8}, "format": "float-quantized"}}}}
    state = {"model.layers.0.self_attn.q_proj.weight_packed": torch.zeros(4, 1, dtype=torch.int32)}
    with pytest.raises(ValueError, match="quantizes activations too"):
        split_compressed(config, state, None, "config.json")
    state = {"lm_head.weight_packed": torch.zeros(4, 1, dtype=torch.int32)}
    with pytest.raises(ValueError, match="quantizes lm_head; minicb quantizes the decoder's"):
        split_compressed(config, state, None, "config.json")

"""The W8A8 checkpoint the peers' benchmark gives vLLM (its CPU build's int8 path): what
compressed-tensors itself reads as a W8A8 int scheme, each decoder matrix int8 per output channel
within half a step of the float weight, the rest untouched; minicb refuses it by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minicb import LLM
from minicb.model.compressed import W8A8_LAYERS, write_w8a8_checkpoint


def test_the_w8a8_checkpoint_is_compressed_tensors_int8_per_channel(tiny_llama, tmp_path):
    ct = pytest.importorskip("compressed_tensors.quantization")
    target = write_w8a8_checkpoint(tiny_llama, tmp_path / "w8a8")
    config = json.loads((target / "config.json").read_text())["quantization_config"]
    parsed = ct.QuantizationConfig.model_validate(config)
    scheme = parsed.config_groups["group_0"]
    assert parsed.format == "int-quantized" and parsed.quant_method == "compressed-tensors"
    assert (scheme.weights.num_bits, scheme.weights.strategy, scheme.weights.dynamic) == \
        (8, "channel", False)
    assert (scheme.input_activations.num_bits, scheme.input_activations.strategy,
            scheme.input_activations.dynamic) == (8, "token", True)

    source = {}
    for shard in Path(tiny_llama).glob("*.safetensors"):
        source.update(load_file(str(shard)))
    written = load_file(str(target / "model.safetensors"))
    quantized = [n for n in source if n.endswith(".weight") and n.split(".")[-2] in W8A8_LAYERS]
    assert quantized, "the tiny model has decoder matrices"
    for name, weight in source.items():
        if name in quantized:
            q, scale = written[name], written[name[:-len("weight")] + "weight_scale"]
            assert q.dtype == torch.int8 and scale.shape == (weight.shape[0], 1)
            error = (q.float() * scale - weight.float()).abs()
            assert (error <= scale / 2 + 1e-6).all(), name
        else:
            assert torch.equal(written[name], weight), name
    with pytest.raises(ValueError, match="quantizes activations too"):
        LLM(str(target))


def test_bench_offline_runs_vllm_w8a8_on_the_written_checkpoint(tiny_llama, monkeypatch):
    """`bench offline --peers vllm-w8a8` hands vLLM the W8A8 copy of the model, in bfloat16."""
    from types import SimpleNamespace

    from minicb.bench import offline, vllm_peer

    seen = {}

    def fake_run_vllm(path, prompts, lens, max_model_len, settings):
        seen.update(path=path, settings=settings)
        return "ran"

    monkeypatch.setattr(vllm_peer, "run_vllm", fake_run_vllm)
    args = SimpleNamespace(dtype="float32", max_model_len=64, max_num_seqs=2)
    assert offline.run_peer("vllm-w8a8", tiny_llama, args, [[3, 4]], [2]) == "ran"
    config = json.loads((Path(seen["path"]) / "config.json").read_text())
    assert config["quantization_config"]["format"] == "int-quantized"
    assert seen["settings"] == {"max_num_seqs": 2, "dtype": "bfloat16"}

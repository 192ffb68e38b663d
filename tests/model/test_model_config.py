"""What a checkpoint's config.json may ask for: every field the forward does not compute is
refused at load with its name, never skipped; the fields it does compute load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from minicb.model.loader import load_model, model_args_from_config


def config(**changes) -> dict:
    base = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 512,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
            "hidden_act": "silu", "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": 28, "layer_types": ["full_attention"] * 4,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "bos_token_id": 1, "eos_token_id": 2, "dtype": "float32", "use_cache": True,
            "transformers_version": "5.23.0", "attention_dropout": 0.0}
    return base | changes


def test_a_plain_config_loads():
    args = model_args_from_config(config())
    assert (args.qkv_bias, args.o_bias, args.qk_norm) == (True, False, False)


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "relu"])
def test_an_activation_other_than_silu_is_refused_naming_the_field(act):
    with pytest.raises(ValueError, match=f"hidden_act='{act}' is not supported"):
        model_args_from_config(config(hidden_act=act))


@pytest.mark.parametrize("changes", [
    # transformers' own spelling: the layers listed as sliding_attention
    {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2,
     "layer_types": ["full_attention"] * 2 + ["sliding_attention"] * 2},
    # an older config without layer_types: the layers from max_window_layers on
    {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0,
     "layer_types": None},
], ids=["layer_types", "max_window_layers"])
def test_a_sliding_window_that_takes_effect_is_refused(changes):
    changes = {k: v for k, v in changes.items() if v is not None}
    cfg = config(**changes)
    if "layer_types" not in changes:
        del cfg["layer_types"]
    with pytest.raises(ValueError, match="use_sliding_window with sliding_window=64 on layers"):
        model_args_from_config(cfg)


def test_a_window_that_never_takes_effect_loads():
    # switched off (transformers then uses no window), or wider than any sequence the model reads
    model_args_from_config(config(use_sliding_window=False, sliding_window=64))
    model_args_from_config(config(use_sliding_window=True, sliding_window=512, max_window_layers=0,
                                  layer_types=["sliding_attention"] * 4))


@pytest.mark.parametrize("field, value", [("attn_logit_softcapping", 50.0),
                                          ("final_logit_softcapping", 30.0),
                                          ("partial_rotary_factor", 0.5)])
def test_a_field_minicb_does_not_know_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"does not know the field\\(s\\) {field}"):
        model_args_from_config(config(**{field: value}))


def test_rope_settings_the_type_does_not_read_are_refused():
    rope = {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match="RoPE settings partial_rotary_factor"):
        model_args_from_config(config(rope_parameters=rope))


def test_architecture_flags():
    qwen3 = model_args_from_config(config(architectures=["Qwen3ForCausalLM"], attention_bias=True))
    assert (qwen3.qkv_bias, qwen3.o_bias, qwen3.qk_norm) == (True, True, True)
    llama = model_args_from_config(config(architectures=["LlamaForCausalLM"], attention_bias=True,
                                          mlp_bias=True))
    assert (llama.qkv_bias, llama.o_bias, llama.mlp_bias, llama.qk_norm) == (True, True, True,
                                                                               False)


def test_a_gelu_checkpoint_is_refused_at_load(tiny_llama, tmp_path):
    target = tmp_path / "gelu"
    shutil.copytree(tiny_llama, target)
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(cfg | {"hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        load_model(Path(target))


def test_attention_bias_llama_and_qwen3_load_every_tensor(tiny_llama_bias, tiny_qwen3):
    """Every tensor of the checkpoint lands in the model (load_model raises on any missing or
    unexpected one); the biases and norms are the checkpoint's, not defaults."""
    from safetensors.torch import load_file

    for path, names in ((tiny_llama_bias, ["self_attn.o_proj.bias", "mlp.down_proj.bias"]),
                        (tiny_qwen3, ["self_attn.q_norm.weight", "self_attn.k_norm.weight"])):
        model = load_model(Path(path))
        (weights,) = Path(path).glob("*.safetensors")
        state = load_file(str(weights))
        for name in names:
            ours = model.model.layers[1].get_parameter(name)
            assert ours.equal(state[f"model.layers.1.{name}"]), name

"""Load a Hugging Face checkpoint (a local directory or a hub id) into minicb's decoder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from minicb.config import DTYPES as DTYPE_NAMES
from minicb.model.expert_load import attach_expert_load
from minicb.model.llama import LlamaForCausalLM, ModelArgs, rope_inv_freq
from minicb.model.moe import (
    FAMILIES,
    MOE_FIELDS,
    MOE_INERT,
    moe_args_from_config,
    stack_expert_weights,
)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", *FAMILIES)
SUPPORTED_ROPE_TYPES = ("default", "llama3")
# what each RoPE type reads from rope_parameters (or the older rope_scaling)
ROPE_FIELDS = {"default": ("rope_type", "type", "rope_theta"),
               "llama3": ("rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                          "high_freq_factor", "original_max_position_embeddings")}
SUPPORTED_ACTIVATIONS = ("silu",)       # the MLP is SwiGLU: silu(gate) * up
# the torch dtype of each name EngineConfig accepts
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """None → the shipped default model; a directory → itself; anything else → a hub download."""
    if model is None:
        from minicb.model.default import default_model_path

        return Path(default_model_path())
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise ValueError(f"model={model!r} names no checkpoint; pass a checkpoint directory or hub "
                         "id, or model=None for the shipped default model.")
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"model={str(model)!r} is a file; pass the checkpoint's directory.")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(
            str(model),
            allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]))
    except Exception as error:  # offline, unknown id, gated repo...
        raise ValueError(f"model={str(model)!r} is neither a local directory nor a hub id that "
                         f"could be downloaded ({type(error).__name__}: {error}). Pass a local "
                         "checkpoint directory, or model=None for the shipped default "
                         "model.") from error


REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads")
# Every config.json field minicb knows. A field in neither list is refused at load: minicb cannot
# tell whether it changes the forward pass, and a model that silently computes something else
# than its checkpoint means is worse than one that does not load.
HONOURED = (*REQUIRED, "architectures", "model_type", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
            "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias",
            # checked below: only the values the forward computes are accepted
            "hidden_act", "layer_types", "use_sliding_window", "sliding_window",
            "max_window_layers", *MOE_FIELDS,
            "quantization_config")              # compressed-tensors' (minicb/model/compressed.py)
INERT = ("bos_token_id", "eos_token_id", "pad_token_id",   # the tokenizer's and sampler's business
         "dtype", "torch_dtype",                 # the engine's dtype decides
         "transformers_version", "_name_or_path", "use_cache", "initializer_range",
         "attention_dropout",                    # dropout is off at inference
         "pretraining_tp",                       # read by no forward (transformers ignores it too)
         "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
         "tokenizer_class", *MOE_INERT)


def check_fields(config: dict, source: str) -> None:
    """Refuse, naming the field, every config field whose effect the forward does not compute:
    an unknown field, an activation other than SiLU, a sliding window that would take effect."""
    unknown = sorted(set(config) - set(HONOURED) - set(INERT))
    if unknown:
        raise ValueError(f"{source}: minicb does not know the field(s) {', '.join(unknown)}; it "
                         "cannot tell whether they change the model's arithmetic, so it refuses "
                         "the checkpoint rather than run it differently from transformers.")
    act = config.get("hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise ValueError(f"{source}: hidden_act={act!r} is not supported; minicb's MLP computes "
                         f"{' or '.join(SUPPORTED_ACTIVATIONS)} (SwiGLU).")
    layers, max_len = config["num_hidden_layers"], config.get("max_position_embeddings")
    window = config.get("sliding_window") if config.get("use_sliding_window") else None
    if "layer_types" in config:
        types = config["layer_types"] or []
        sliding = [i for i, kind in enumerate(types) if kind != "full_attention"]
        if any(kind not in ("full_attention", "sliding_attention") for kind in types):
            raise ValueError(f"{source}: layer_types={types!r}; minicb runs 'full_attention' "
                             "layers only.")
    else:   # older configs: the layers from max_window_layers on use the window
        sliding = list(range(config.get("max_window_layers", 0), layers)) if window else []
    binding = window is None or max_len is None or window < max_len
    if sliding and binding:
        raise ValueError(f"{source}: use_sliding_window with sliding_window={window} on layers "
                         f"{sliding} (layer_types / max_window_layers) is not supported; minicb "
                         "has no sliding window: every token attends to all earlier ones.")


def model_args_from_config(config: dict, source: str = "config.json") -> ModelArgs:
    architectures = config.get("architectures") or [config.get("model_type", "?")]
    if architectures[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"architecture {architectures[0]!r} is not supported; minicb runs "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported; minicb handles "
                         f"{SUPPORTED_ROPE_TYPES}.")
    extra = sorted(set(rope) - set(ROPE_FIELDS[rope_type]))
    if extra:
        raise ValueError(f"{source}: the RoPE settings {', '.join(extra)} are not supported for "
                         f"rope_type {rope_type!r}; minicb reads "
                         f"{', '.join(ROPE_FIELDS[rope_type])}.")
    missing = [name for name in REQUIRED if name not in config]
    if missing:
        raise ValueError(f"{source} lacks {', '.join(missing)}: a Llama-family config needs "
                         f"{', '.join(REQUIRED)}.")
    sizes = {name: config[name] for name in REQUIRED} | {
        name: config[name]
        for name in ("num_key_value_heads", "head_dim", "max_position_embeddings")
        if config.get(name) is not None}
    bad = {name: value for name, value in sizes.items()
           if not isinstance(value, int) or isinstance(value, bool) or value < 1}
    if bad:
        raise ValueError(f"{source} has sizes that must be positive integers: {bad}.")
    num_heads = config["num_attention_heads"]
    num_kv_heads = config.get("num_key_value_heads") or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"{source}: num_attention_heads={num_heads} is not a multiple of "
                         f"num_key_value_heads={num_kv_heads}.")
    check_fields(config, source)
    is_qwen2 = architectures[0] in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")
    attention_bias = bool(config.get("attention_bias", False))
    return ModelArgs(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        # Qwen2: always (Qwen2-MoE: as its qkv_bias says), and never on o_proj
        qkv_bias=is_qwen2 and config.get("qkv_bias", True) or attention_bias,
        o_bias=attention_bias and not is_qwen2,
        mlp_bias=bool(config.get("mlp_bias", False)),
        rope_scaling=rope if rope_type == "llama3" else None,
        qk_norm=architectures[0] in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        moe=moe_args_from_config(config, architectures[0], source),
    )


class _Skeleton(torch.overrides.TorchFunctionMode):
    """The model is made on the meta device and then given memory, every value to come from the
    checkpoint. Two of the meta device's paths run torch's Python reference kernels, whose first
    use imports torch's compiler and sympy (seconds of CPU in every process that loads a model,
    shared with the tokenizer's import of the same compiler): random initialisation
    (torch.nn.init.*), skipped, since the checkpoint overwrites it; and empty_like, which
    to_empty calls, replaced by a plain empty. A function mode is this thread's alone."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        if func is torch.empty_like and args[0].is_meta:
            like = args[0]
            return torch.empty(like.shape, dtype=kwargs.get("dtype") or like.dtype,
                               device=kwargs.get("device") or like.device)
        return func(*args, **kwargs)


def load_model(path: Path, device: str = "cpu", dtype: str = "float32",
               attention: str = "torch", quantization: str | None = None) -> LlamaForCausalLM:
    """The checkpoint at `path` as minicb's decoder, its projections fused; with
    `quantization` (minicb/model/quant.py), its decoder matrices quantized at load."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but this torch ({torch.__version__}) sees no CUDA "
                         "GPU; use device='cpu', or install a CUDA build of torch (see the README, "
                         "'Using a GPU').")
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {config_file}: {error}") from None
    args = model_args_from_config(config, str(config_file))
    if quantization is not None and args.moe is not None:
        raise ValueError(f"quantization={quantization!r} is not supported for a mixture of experts "
                         f"({config_file}): its experts' weights stay float; pass "
                         "quantization=None.")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path}; minicb loads safetensors "
                         "checkpoints only.")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except Exception as error:     # truncated or not safetensors at all
            raise ValueError(f"cannot read the weights in {file}: {type(error).__name__}: "
                             f"{error}") from None
    if args.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    prequantized = None
    if config.get("quantization_config"):   # stored quantized: its quantized matrices set aside
        from minicb.model.compressed import split_compressed

        state, prequantized = split_compressed(config, state, quantization, str(config_file))
    state = stack_expert_weights(state, args.moe)
    with torch.device("meta"), _Skeleton():
        model = LlamaForCausalLM(args, attention)
    with _Skeleton():
        model = model.to_empty(device=device)
    model = model.to(DTYPES[dtype])
    # the rotary frequencies are not in the checkpoint: compute them for real after to_empty
    model.model.rotary_emb.inv_freq = rope_inv_freq(args).to(device)
    expected = model.state_dict()
    wrong = [f"{name} {tuple(tensor.shape)} (the config implies {tuple(expected[name].shape)})"
             for name, tensor in state.items() if name in expected
             and tensor.shape != expected[name].shape]
    if wrong:
        raise ValueError(f"checkpoint {path} does not match its config.json: "
                         f"{'; '.join(wrong[:3])}.")
    broken = [name for name, tensor in state.items() if tensor.is_floating_point() and
              not tensor.isfinite().all()]
    if broken:
        raise ValueError(f"checkpoint {path} has NaN or infinite weights in "
                         f"{', '.join(broken[:3])}; the checkpoint is damaged.")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (args.tie_word_embeddings and k == "lm_head.weight")
               and not (prequantized is not None and k in prequantized.missing)]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the {args} decoder: missing "
                         f"{missing[:5]}, unexpected {unexpected[:5]}.")
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.fuse_projections()
    if quantization is not None or prequantized is not None:
        from minicb.model.quant import quantize_model

        quantize_model(model, quantization or prequantized.method, prequantized)
    attach_expert_load(model)     # a mixture of experts counts its tokens per expert
    return model.eval()


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer, or None when the directory has none (prompts must be token
    ids)."""
    if not any((path / name).exists()
               for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), **_light_config(path))


def _light_config(path: Path) -> dict:
    """AutoTokenizer's `config`, read without the model's own configuration class, when the
    checkpoint names its tokenizer class and brings no code of its own.

    Left to itself, AutoTokenizer loads the model's configuration class (LlamaConfig, ...),
    whose imports pull in torch's compiler and distributed tensors: seconds of CPU in every
    process that starts an engine (a server, a replica, a notebook's kernel). With the tokenizer
    class named, AutoTokenizer reads only the config's model_type, name and tokenizer_class, which
    the generic config holds the same, so the tokenizer it picks is the same (tested). Without a
    named class it picks by the config's type, so that case keeps the full config."""
    config_file = path / "tokenizer_config.json"
    if not (path / "config.json").exists() or not config_file.exists():
        return {}
    tokenizer_config = json.loads(config_file.read_text())
    if not tokenizer_config.get("tokenizer_class") or "auto_map" in tokenizer_config:
        return {}
    try:
        from transformers import PreTrainedConfig
    except ImportError:                   # transformers 4 (PretrainedConfig): its default path
        return {}
    config_dict = PreTrainedConfig.get_config_dict(str(path))[0]
    if "auto_map" in config_dict:
        return {}
    config = PreTrainedConfig.from_dict(config_dict)
    config._name_or_path = str(path)
    return {"config": config}

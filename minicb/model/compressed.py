"""Checkpoints already quantized in the compressed-tensors format (what llm-compressor writes).

A checkpoint whose config.json carries ``quantization_config`` with ``quant_method:
"compressed-tensors"`` stores each quantized Linear as (the format's "pack-quantized"):

* ``weight_packed`` int32 [n, k * bits / 32]: value i of a row at bits ``i * bits`` (lowest
  first), stored as ``q + 2 ** (bits - 1)`` so every stored value is unsigned;
* ``weight_scale`` [n, k / group] (``group`` = k for one scale per output channel);
* ``weight_zero_point`` (asymmetric schemes only) [n, k / group], packed the same way along the
  output rows; and ``weight_shape`` (n, k).

The weight is ``(q - zero_point) * scale``. minicb reads two of its weight-only schemes straight
into its own layers, never through a float copy of the weight:

* 8 bits, one scale per output channel, symmetric: an Int8Linear, the same arithmetic as
  ``quantization="int8"`` (its scale is ``max|w| / 127.5`` too);
* 8 bits in groups of a multiple of 32 (W8A16 as compressed-tensors 0.20's preset writes it,
  groups of 128): an Int8Linear with per-group (scale, offset) pairs, which the C kernels read as
  they read int4's (kernels/cpu_linear.c); torch has no such product, so it needs the C kernels;
* 4 bits in groups of a multiple of 32 or per channel, symmetric or not (W4A16, W4A16_ASYM):
  an Int4Linear.

A group of G values becomes G / 32 of minicb's groups with the same scale, and the offset is
``-(zero_point + 2 ** (bits - 1)) * scale`` for the stored unsigned codes ``u``. Anything else
(activation quantization, floating-point formats, other bit widths) is refused by name.

The loader (minicb/model/loader.py) takes the quantized tensors out of the state before it loads
the rest, and quantize_model puts these layers where the float ones were. The other way,
``write_w8a8_checkpoint`` writes a checkpoint in the format's W8A8 scheme (int8 weights and
activations) for the peers' benchmarks, which minicb itself refuses to run.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from minicb.kernels.cpu import I4_GROUP
from minicb.model.int4 import Int4Linear, pack_int4
from minicb.model.quant import Int8Linear, _c_kernel, quantize_int8

PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")


def unpack_int32(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first `count` unsigned values of each row of int32 words (value i at bits i * bits)."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int32) * bits
    values = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count]


def _scheme(config: dict, name: str, source: str) -> dict:
    """The weights' arguments of the config group whose targets name this Linear."""
    for group in config.get("config_groups", {}).values():
        for target in group.get("targets", []):
            if (target == "Linear" or target == name or
                    target.startswith("re:") and re.match(target[3:], name)):
                if group.get("input_activations") or group.get("output_activations"):
                    raise ValueError(f"{source}: {name} quantizes activations too; minicb loads "
                                     "weight-only compressed-tensors schemes (W8A16, W4A16).")
                fmt = group.get("format") or config.get("format")
                if fmt != "pack-quantized":
                    raise ValueError(f"{source}: format {fmt!r}; minicb reads compressed-tensors' "
                                     "'pack-quantized' weights (W8A16, W4A16).")
                return group["weights"]
    raise ValueError(f"{source}: no config group's targets name {name}.")


def _layer(state: dict, name: str, args: dict, source: str) -> Int8Linear | Int4Linear:
    """One checkpoint Linear as minicb's quantized layer (its bias comes later, fused)."""
    bits, strategy = args.get("num_bits"), args.get("strategy")
    n, k = (int(v) for v in state[f"{name}.weight_shape"])
    u = unpack_int32(state[f"{name}.weight_packed"], bits, k)
    scale = state[f"{name}.weight_scale"].float().reshape(n, -1)
    group = k // scale.shape[1]
    zero = state.get(f"{name}.weight_zero_point")
    if zero is not None:      # packed along the output rows
        zero = unpack_int32(zero.T.contiguous(), bits, n).T - (1 << (bits - 1))
    if args.get("type") != "int" or bits not in (4, 8) or strategy not in ("group", "channel"):
        raise ValueError(f"{source}: {name} is {args.get('type')} {bits}-bit by {strategy}; minicb "
                         "loads int 8-bit and 4-bit weights by group or channel (W8A16, W4A16).")
    if bits == 8 and strategy == "channel" and (zero is None or not zero.any()):
        return Int8Linear((u - 128).to(torch.int8), scale[:, 0].contiguous(), None)
    if group % I4_GROUP:
        raise ValueError(f"{source}: {name} has groups of {group}; minicb's grouped kernels take "
                         f"groups of a multiple of {I4_GROUP}.")
    # q = u - 2 ** (bits - 1) is what was quantized: w = (q - zero) * scale
    middle = 1 << (bits - 1)
    offset = -(middle + (0 if zero is None else zero.float())) * scale
    pairs = torch.stack([scale, offset.expand_as(scale)], dim=-1)
    pairs = pairs.repeat_interleave(group // I4_GROUP, dim=1).contiguous()
    if bits == 4:
        return Int4Linear(pack_int4(u.to(torch.uint8)), pairs, None)
    if not _c_kernel():
        raise ValueError(f"{source}: {name} is 8-bit in groups, which only minicb's C kernels "
                         "multiply (torch has no grouped int8 product); install a C compiler.")
    # stored as int8 q = u - 128: w = q * scale + offset with the offset of u's + 128 * scale
    return Int8Linear((u - 128).to(torch.int8), torch.stack(
        [pairs[..., 0], pairs[..., 1] + 128 * pairs[..., 0]], dim=-1), None)


class Prequantized:
    """The quantized Linears of a compressed-tensors checkpoint, by module name, handed to
    quantize_model as its ``quantized``: a fused projection is its parts' rows stacked."""

    def __init__(self, layers: dict[str, Int8Linear | Int4Linear], method: str):
        self.layers, self.method = layers, method
        # the float weights the checkpoint does not have: the loader does not miss them
        self.missing = {f"{name}.weight" for name in layers}

    def __call__(self, fused_name: str, linear: nn.Linear) -> Int8Linear | Int4Linear:
        prefix, _, kind = fused_name.rpartition(".")
        names = [f"{prefix}.{part}" for part in PARTS.get(kind, (kind,))]
        absent = [name for name in names if name not in self.layers]
        if absent:
            raise ValueError(f"the checkpoint quantizes some of the decoder's matrices but not "
                             f"{', '.join(absent)}; minicb runs a layer's matrices in one format.")
        parts = [self.layers[name] for name in names]
        device = linear.weight.device
        if device.type != "cpu" and parts[0].scale.dim() == 3 and isinstance(parts[0], Int8Linear):
            raise ValueError(f"{fused_name} is 8-bit in groups, which only minicb's CPU kernels "
                             "multiply; use device='cpu'.")
        bias = None if linear.bias is None else linear.bias.detach().float()
        return type(parts[0])(torch.cat([p.weight for p in parts]).to(device),
                              torch.cat([p.scale for p in parts]).to(device), bias)


def split_compressed(config: dict, state: dict[str, torch.Tensor], quantization: str | None,
                     source: str) -> tuple[dict[str, torch.Tensor], Prequantized | None]:
    """(the state without its quantized tensors, the quantized layers) of a checkpoint; (state,
    None) for one with no compressed-tensors quantization."""
    qconfig = config.get("quantization_config")
    if not qconfig:
        return state, None
    if qconfig.get("quant_method") != "compressed-tensors":
        raise ValueError(f"{source}: quant_method {qconfig.get('quant_method')!r}; minicb loads "
                         "compressed-tensors checkpoints (llm-compressor's W8A16, W4A16).")
    if quantization is not None:
        raise ValueError(f"{source} is already quantized (compressed-tensors); pass "
                         f"quantization=None, not {quantization!r}, to run it as stored.")
    names = sorted(key.removesuffix(".weight_packed") for key in state
                   if key.endswith(".weight_packed"))
    if not names:     # another format stores no weight_packed: say which, by its config
        _scheme(qconfig, "model.layers.0.self_attn.q_proj", source)
        raise ValueError(f"{source}: its quantization_config names compressed-tensors, but no "
                         "tensor is stored as weight_packed; minicb reads the 'pack-quantized' "
                         "format (W8A16, W4A16).")
    outside = [name for name in names if not re.fullmatch(
        r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)", name)]
    if outside:
        raise ValueError(f"{source} quantizes {', '.join(outside[:3])}; minicb quantizes the "
                         "decoder's dense matrices only (list the others in the recipe's "
                         "ignore).")
    layers = {name: _layer(state, name, _scheme(qconfig, name, source), source)
              for name in names}
    kinds = {(type(layer), layer.scale.dim()) for layer in layers.values()}
    if len(kinds) > 1:
        raise ValueError(f"{source} mixes formats (8-bit and 4-bit, or per channel and per "
                         "group); minicb runs every layer's matrices in one format.")
    quantized = {f"{name}.{suffix}" for name in names for suffix in SUFFIXES}
    rest = {key: t for key, t in state.items() if key not in quantized}
    return rest, Prequantized(layers, "int4" if kinds.pop()[0] is Int4Linear else "int8")


W8A8_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_w8a8_checkpoint(source: str | Path, target: str | Path) -> Path:
    """A copy of the Llama checkpoint at `source` with its decoder matrices as compressed-tensors
    W8A8 (format "int-quantized", what llm-compressor's W8A8 preset writes): each matrix int8
    with one float32 scale per output channel (quantize_int8: symmetric, max|w| / 127.5, the
    scale compressed-tensors computes for this scheme), activations quantized per token at run
    time, the embeddings and the head as they are. minicb refuses to run it (split_compressed
    names the activation scheme); it is written for the peers' benchmarks: vLLM's CPU build
    runs it on its int8 path (CompressedTensorsW8A8Int8)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(source.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".weight") and name.split(".")[-2] in W8A8_LAYERS:
            out[name], scale = quantize_int8(tensor)
            out[name[:-len("weight")] + "weight_scale"] = scale[:, None].contiguous()
        else:
            out[name] = tensor.contiguous()
    save_file(out, str(target / "model.safetensors"), metadata={"format": "pt"})
    for extra in source.iterdir():
        if extra.is_file() and not extra.name.endswith(".safetensors") \
                and extra.name != "model.safetensors.index.json":
            shutil.copy(extra, target / extra.name)
    config = json.loads((source / "config.json").read_text())
    quant = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None,
             "block_structure": None, "actorder": None, "observer_kwargs": {}}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"], "output_activations": None,
            "weights": {**quant, "strategy": "channel", "dynamic": False, "observer": "minmax"},
            "input_activations": {**quant, "strategy": "token", "dynamic": True,
                                  "observer": None}}}}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target

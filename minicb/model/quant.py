"""Weight-only int8 and int4: fewer bytes per weight, so fewer bytes per decode step.

A decode step reads every weight once for a handful of rows: its speed is the bytes it reads.
int8 weights with one float32 scale per output channel read a quarter of float32's bytes (half
of bfloat16's). ``quantization="int8"`` (vLLM's knob name) quantizes a loaded model's decoder
matrices (q/k/v, o, gate/up, down) this way; the embedding and the head stay as they are, as in
vLLM's and torchao's defaults for a tied head. ``quantization="int4"`` stores them as 4-bit
codes in groups of 32 with a scale and offset each (minicb/model/int4.py).

The arithmetic is torchao's ``Int8WeightOnlyConfig``, so the two can be compared weight for
weight: per output channel j, ``scale_j = max|W_j| / 127.5`` and ``q = clamp(round(W * (1 /
scale)), -128, 127)``; the layer computes ``x (q * scale)^T + bias`` with x left in its own
dtype (weight-only: activations are never quantized).

The dequantize happens inside the product, never as a float copy of the weight per call (which
is what makes a naive int8 layer slower than float): the C kernel (kernels/cpu_linear.c) widens
the int8 values in registers, for every row count. Without a C compiler, torch's
``_weight_int8pack_mm`` does the same inside its own loop; on the torch build this was measured
with (2.13, x86) that loop ran 30-70 times slower than the C kernel, so it is the fallback only.
A prompt's many rows are compute-bound: there int8 weights save no time (the C kernel ran 512
rows about 1.7x slower than torch's float32 product), which is where weight-only quantization
does not pay.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from minicb.config import QUANTIZATIONS
from minicb.kernels import fp8
from minicb.kernels.cpu import KV_SCALE_BYTES
from minicb.model.int4 import Int4Linear
from minicb.model.moe import SparseMoeBlock


def auto_dtype(path: Path, device: str) -> str:
    """dtype="auto", as vLLM's: bfloat16 where the device computes it natively (a CPU with
    AVX-512 BF16 or AMX: the C kernels' vdpbf16ps and torch's oneDNN; any GPU, which falls back
    to float16 where it lacks bfloat16), else float32; a float16 checkpoint stays float16 on a
    GPU. The book's parity tests pin float32 instead: there minicb and transformers agree to
    about 1e-6, so a greedy token may differ only at a genuine tie."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        config = {}
    stored = config.get("dtype") or config.get("torch_dtype")
    if torch.device(device).type == "cuda":
        return "float16" if stored == "float16" else "bfloat16"
    from minicb.kernels import isa

    native = isa.cpu_flags() & {"avx512_bf16", "amx_bf16"}
    return "bfloat16" if native else "float32"


def check_quantization(quantization: str | None) -> None:
    """None (no quantization) or one of QUANTIZATIONS; anything else names the choices."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} is not one of {QUANTIZATIONS} (or None "
                         "for none); pick one of those.")


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [n, k], scale float32 [n]) of a weight [n, k], per output channel, as torchao's
    Int8WeightOnlyConfig computes them (symmetric, quant range -128..127, scale = amax / 127.5)."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.5).clamp(min=torch.finfo(torch.float32).eps)
    q = torch.clamp(torch.round(w * (1.0 / scale[:, None])), -128, 127).to(torch.int8)
    return q, scale


def kv_cache_layout(num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                    kv_cache_dtype: str) -> tuple[tuple[int, int], torch.dtype]:
    """(the last two dimensions of a cache block, [kv_heads, row], and the cache's dtype): the
    model's dtype, or for kv_cache_dtype="int8" int8 rows of head_dim values and their scale. A
    block's bytes follow: at head_dim 64 an int8 row is 68 bytes where a float32 one is 256, so
    the same memory holds 3.76 times the tokens."""
    if kv_cache_dtype == "int8":
        return (num_kv_heads, head_dim + KV_SCALE_BYTES), torch.int8
    if kv_cache_dtype in fp8.KV_CACHE_DTYPE_NAMES:   # e4m3 bytes, then the same 4-byte scale
        return (num_kv_heads, head_dim + fp8.SCALE_BYTES), fp8.FP8
    return (num_kv_heads, head_dim), dtype


def kv_bytes_per_token(args, dtype: torch.dtype, kv_cache_dtype: str) -> int:
    """The bytes one token's K and V take in a model's pool, every layer, as stored (int8 rows
    with their scales): what sizes a pool in memory."""
    row, stored = kv_cache_layout(args.num_kv_heads, args.head_dim, dtype, kv_cache_dtype)
    return 2 * args.num_layers * row[0] * row[1] * stored.itemsize


def pack_kv_int8(x: torch.Tensor) -> torch.Tensor:
    """Keys or values x [..., head_dim] as int8 cache rows [..., head_dim + 4]: one scale per
    token and KV head, max|x| / 127 (1 for an all-zero head), its 4 bytes stored right after
    the row's values, so a block holds its own scales (copying a block copies them). The C
    kernels' KV write (minicb_store_kv) computes the same bytes."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(x * (1.0 / scale)).clamp(-127, 127).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def unpack_kv_int8(rows: torch.Tensor) -> torch.Tensor:
    """float32 [..., head_dim] of int8 cache rows [..., head_dim + 4] (pack_kv_int8)."""
    # the scale's 4 bytes copied out (a view of them may sit at an offset float32 cannot use)
    scale = rows[..., -KV_SCALE_BYTES:].clone(memory_format=torch.contiguous_format)
    scale = scale.view(torch.float32)
    return rows[..., :-KV_SCALE_BYTES].float() * scale


class Int8Linear(nn.Module):
    """A Linear whose weight is int8 with one float32 scale per output channel (or, read from a
    checkpoint quantized in groups, minicb/model/compressed.py, a (scale, offset) pair per group
    of 32: ``scale`` [n, k / 32, 2], which only the C kernels multiply). Its tensors are buffers
    named ``weight``, ``scale`` and ``bias``, so a fused projection's parts can be views of it,
    as fuse_linears makes them for a float Linear."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        q, scale = quantize_int8(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().float()
        return cls(q, scale, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.is_cuda:   # the Triton kernel (kernels/quant_matmul.py): int8 tiles widened inside
            from minicb import kernels

            out = kernels.int8_matmul(rows.contiguous(), self.weight, self.scale, self.bias)
        elif _c_kernel():
            from minicb.kernels.cpu import linear_cpu

            out = linear_cpu(rows.float().contiguous(), self.weight, self.bias, self.scale)
        else:   # torch's int8 product: the weight widened inside its loop, x in its own dtype
            out = torch.ops.aten._weight_int8pack_mm(rows.contiguous(), self.weight,
                                                     self.scale.to(rows.dtype))
            if self.bias is not None:
                out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def _c_kernel() -> bool:
    from minicb.kernels.cpu import available

    return available()[0]


LINEARS = {"int8": Int8Linear, "int4": Int4Linear}


def _views(fused: Int8Linear | Int4Linear, parts: list[nn.Module]) -> list[nn.Module]:
    """Each part of a fused projection as a quantized Linear of the fused one's class whose
    tensors are views of the fused one's (scales split along the output rows as the weights
    do)."""
    views, start = [], 0
    for part in parts:
        rows = part.weight.shape[0]
        bias = None if fused.bias is None else fused.bias[start:start + rows]
        views.append(type(fused)(fused.weight[start:start + rows],
                                 fused.scale[start:start + rows], bias))
        start += rows
    return views


def quantize_model(model: nn.Module, quantization: str,
                   quantized: Callable[[str, nn.Linear], nn.Module] | None = None) -> nn.Module:
    """Quantize every decoder matrix of a loaded model in place (after fuse_projections), and
    free the float weights. The embedding and the head are left as they are. ``quantized``, for
    a checkpoint stored quantized (minicb/model/compressed.py), gives the quantized Linear of a
    fused projection from its name (``model.layers.0.self_attn.qkv_proj``) and the float one
    (for its bias) instead of quantizing the float one."""
    if quantized is None:
        check_quantization(quantization)
    device = model.model.embed_tokens.weight.device.type
    if device not in ("cpu", "cuda"):
        raise ValueError(f"quantization={quantization!r} runs on a CPU (C kernels, torch's int8 "
                         "and int4 products) or a CUDA GPU (Triton kernels, "
                         f"kernels/quant_matmul.py); got device {device!r}: use 'cpu' or 'cuda'.")
    for number, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if isinstance(mlp, SparseMoeBlock):
            raise ValueError(f"quantization={quantization!r} quantizes dense layers; layer "
                             f"{number}'s MLP is a {type(mlp).__name__} (mixture of experts), "
                             "whose experts it does not quantize. Leave quantization=None.")
        if attn.qkv_proj is None or mlp.gate_up_proj is None:
            raise ValueError("quantize_model expects the fused projections: call "
                             "fuse_projections() first.")
        def convert(name: str, linear: nn.Linear, number: int = number) -> nn.Module:
            if quantized is not None:
                return quantized(f"model.layers.{number}.{name}", linear)
            return LINEARS[quantization].from_linear(linear)

        attn.qkv_proj = convert("self_attn.qkv_proj", attn.qkv_proj)
        attn.q_proj, attn.k_proj, attn.v_proj = _views(attn.qkv_proj,
                                                       [attn.q_proj, attn.k_proj, attn.v_proj])
        mlp.gate_up_proj = convert("mlp.gate_up_proj", mlp.gate_up_proj)
        mlp.gate_proj, mlp.up_proj = _views(mlp.gate_up_proj, [mlp.gate_proj, mlp.up_proj])
        attn.o_proj = convert("self_attn.o_proj", attn.o_proj)
        mlp.down_proj = convert("mlp.down_proj", mlp.down_proj)
    return model

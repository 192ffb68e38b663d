"""Weight-only int4 in groups of 32: an eighth of float32's bytes per weight, half of int8's.

``quantization="int4"`` stores each decoder matrix as 4-bit codes q in 0..15, 32 consecutive
values of a row (a *group*) sharing a float32 scale and offset: the weight is ``q * scale +
offset``. The quantizer is asymmetric (min/max): ``offset = min(group)``, ``scale = (max(group)
- min(group)) / 15``, ``q = round((w - offset) / scale)``, so the group's smallest and largest
values are represented exactly and all 16 codes span the group's own range. A symmetric int4
scheme centres a range of +-max|w| on zero: a group whose values all lean one way leaves half its
16 codes unused, which four bits cannot afford. This is the arithmetic of torchao's
``Int4WeightOnlyConfig`` (its "tinygemm" choice of parameters, a zero point in the float domain:
``(q - 8) * scale + zero`` with ``zero = offset + 8 * scale``), and of torch's
``_weight_int4pack_mm_for_cpu``. A symmetric checkpoint (compressed-tensors' W4A16) is the same
form with ``offset = -8 * scale`` (minicb/model/compressed.py).

Layout (kernels/cpu_simd.h): a row of k values is k / 2 bytes, 16 bytes a group; byte b of a
group holds value b in its low nibble and value b + 16 in its high nibble, so the C kernel widens
one load of bytes into two vectors of consecutive values. The (scale, offset) pairs are one
float32 tensor [n, k / 32, 2], so a fused projection's parts are row slices of it.

The dequantize happens inside the product: the C kernel (kernels/cpu_linear.c, also inside the
fused decode layer) dequantizes each loaded vector in registers with one FMA. Without a C
compiler, torch's ``_weight_int4pack_mm_for_cpu`` does the same in its own loop, on its own
packing of the codes, made once on the first call (that fallback then holds both packings).
"""

from __future__ import annotations

import torch
from torch import nn

from minicb.kernels.cpu import I4_GROUP


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [n, k] in 0..15, (scale, offset) float32 [n, k / 32, 2]) of a weight [n, k],
    asymmetric per group of 32 values along a row."""
    n, k = weight.shape
    if k % I4_GROUP:
        raise ValueError(f"int4 quantizes rows in groups of {I4_GROUP} values; a row of {k} "
                         f"is no multiple of {I4_GROUP}. Use quantization='int8'.")
    w = weight.detach().float().reshape(n, k // I4_GROUP, I4_GROUP)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).eps)
    q = torch.clamp(torch.round((w - low[..., None]) / scale[..., None]), 0, 15)
    return q.to(torch.uint8).reshape(n, k), torch.stack([scale, low], dim=-1)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes uint8 [n, k] (0..15) as the kernels' bytes [n, k / 2]: per group of 32, byte b =
    value b | value b + 16 << 4."""
    n, k = q.shape
    halves = q.to(torch.uint8).reshape(n, k // I4_GROUP, 2, I4_GROUP // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The codes uint8 [n, k] of packed bytes [n, k / 2] (pack_int4's inverse)."""
    n, half = packed.shape
    groups = packed.reshape(n, half // (I4_GROUP // 2), 1, I4_GROUP // 2)
    return torch.cat([groups & 15, groups >> 4], dim=2).reshape(n, 2 * half)


def dequantize_int4(packed: torch.Tensor, scale_offset: torch.Tensor) -> torch.Tensor:
    """The float32 weight [n, k] that packed codes and their (scale, offset) pairs stand for."""
    q = unpack_int4(packed).float()
    n, k = q.shape
    pairs = scale_offset.repeat_interleave(I4_GROUP, dim=1)   # [n, k, 2]
    return q * pairs[..., 0] + pairs[..., 1]


class Int4Linear(nn.Module):
    """A Linear whose weight is int4 in groups of 32 (uint8 [n, k / 2], two codes a byte) with a
    float32 (scale, offset) per group. Its tensors are buffers named ``weight``, ``scale`` (the
    pairs [n, k / 32, 2]) and ``bias``, as Int8Linear's, so the fused decode layer reads either
    by the same names and a fused projection's parts can be views of it."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape[0], 2 * weight.shape[1]
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self._torch_packed: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear:
        q, scale = quantize_int4(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().float()
        return cls(pack_int4(q), scale, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from minicb.model import quant

        if x.is_cuda:   # the Triton kernel (kernels/quant_matmul.py): nibbles widened inside
            from minicb import kernels

            out = kernels.int4_matmul(x.reshape(-1, self.in_features).contiguous(), self.weight,
                                      self.scale, self.bias)
            return out.reshape(*x.shape[:-1], self.out_features)
        rows = x.reshape(-1, self.in_features).float().contiguous()
        if quant._c_kernel():
            from minicb.kernels.cpu import linear_cpu

            out = linear_cpu(rows, self.weight, self.bias, self.scale)
        else:   # torch's int4 product, on its own packing (made once, on the first call)
            packed, pairs = self._torch_weights()
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, I4_GROUP, pairs)
            out = out[:, :self.out_features]
            if self.bias is not None:
                out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def _torch_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The codes packed as torch's int4 product reads them (its rows padded to a multiple of
        16, which it requires), and its [k / 32, n, 2] pairs in its form: (scale, zero) with the
        weight (q - 8) * scale + zero."""
        if self._torch_packed is None:
            pad = -self.out_features % 16
            codes = nn.functional.pad(unpack_int4(self.weight).int(), (0, 0, 0, pad))
            pairs = nn.functional.pad(self.scale, (0, 0, 0, 0, 0, pad))
            zero = pairs[..., 1] + 8 * pairs[..., 0]
            self._torch_packed = (
                torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1),
                torch.stack([pairs[..., 0], zero], dim=-1).transpose(0, 1).contiguous())
        return self._torch_packed

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int4 "
                f"groups of {I4_GROUP}")

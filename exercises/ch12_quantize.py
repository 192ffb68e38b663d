# Generated from solutions/ch12_quantize.py by scripts/make_exercises.py. Replace each
# NotImplementedError with your code, then run `make grade CH=12`.
"""Chapter 12 exercise: fewer bytes per token. An int8 quantizer, a product that dequantizes
inside, and an int8 KV row with its scale.

A decode step reads every weight once for a handful of rows, so its speed is the bytes it reads.
Weight-only int8 stores each weight in one byte and each output channel's scale in four:

    W [n, k] float32  ──►  q [n, k] int8,  scale [n] float32,  W ≈ q * scale[:, None]

The rule is torchao's Int8WeightOnlyConfig (symmetric, per output channel): scale_j =
max|W_j| / 127.5, floored at float32's eps (an all-zero channel must not divide by zero), and
q = clamp(round(W * (1 / scale)), -128, 127). minicb quantizes exactly so, and the tests compare
your q and scale with minicb.model.quant.quantize_int8 bit for bit.

The product must not turn q back into a float matrix on every call (that copy costs more than
the bytes it saves): the scale is a property of an output channel, so it can wait until a
channel's sum is finished. x (q * s)^T = (x q^T) * s, one multiply per output instead of one
per weight.

The KV cache gets the same treatment per (token, KV head): a row of head_dim values becomes
head_dim int8 values followed by the 4 bytes of its float32 scale, max|x| / 127 (1 for an
all-zero row), so a block holds its own scales and copying a block copies them. The tests compare
your rows with minicb.model.quant.pack_kv_int8 byte for byte, and run minicb's C attention kernel
on a cache your function wrote.

Grade it: make grade CH=12
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4   # a float32 scale, stored after its row's int8 values


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [n, k], scale float32 [n]) of a weight [n, k], one scale per output channel (row),
    as torchao's Int8WeightOnlyConfig computes them.

    >>> q, scale = quantize_per_channel(torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]]))
    >>> q.tolist(), [round(s, 6) for s in scale.tolist()]
    ([[64, -127, 32], [0, 0, 0]], [0.007843, 0.0])

    (-1.0 * (1 / scale) is -127.49999 in float32, so it rounds to -127.)
    """
    raise NotImplementedError(
        "quantize_per_channel: scale = max|row| / 127.5 floored at eps; q = clamp(round(w * "
        "(1/scale)))")


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, k] float32 times the int8 weight (q, scale) transposed, plus bias [n] if given:
    [rows, n] float32, equal to x @ (q * scale[:, None]).T + bias within float32 rounding.

    Multiply x by q (as float32) and apply each channel's scale once to its finished sums:
    never build the float matrix q * scale.

    >>> q, scale = torch.tensor([[2, -1], [0, 4]], dtype=torch.int8), torch.tensor([0.5, 0.25])
    >>> int8_linear(torch.tensor([[1.0, 2.0]]), q, scale).tolist()
    [[0.0, 2.0]]
    """
    raise NotImplementedError(
        "int8_linear: (x q^T) * scale, then the bias")


def pack_kv_row(x: torch.Tensor) -> torch.Tensor:
    """Keys or values x [..., head_dim] as int8 cache rows [..., head_dim + 4]: each row's scale
    max|x| / 127 (1.0 for an all-zero row), its values round(x * (1 / scale)) clamped to
    [-127, 127], then the scale's 4 bytes (a float32 viewed as int8).

    >>> row = pack_kv_row(torch.tensor([[1.27, -0.635, 0.0]]))
    >>> row.shape, row[..., :3].tolist()
    (torch.Size([1, 7]), [[127, -64, 0]])
    """
    raise NotImplementedError(
        "pack_kv_row: per-row scale, round, then the scale's bytes after the values")


def unpack_kv_row(rows: torch.Tensor) -> torch.Tensor:
    """float32 [..., head_dim] of int8 cache rows [..., head_dim + 4] (pack_kv_row): each value
    times its row's scale.

    >>> unpack_kv_row(pack_kv_row(torch.tensor([[1.27, -0.635, 0.0]]))).tolist()
    [[1.2699999809265137, -0.6399999856948853, 0.0]]
    """
    raise NotImplementedError(
        "unpack_kv_row: the last 4 bytes are the scale; the rest, times it")

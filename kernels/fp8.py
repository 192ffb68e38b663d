"""FP8 e4m3 KV rows (``kv_cache_dtype="fp8"``), in plain torch: the layout, and the oracle the
Triton kernels are held to.

A row holds one (token, KV head): its head_dim values as FP8 e4m3 bytes, then its float32 scale's
4 bytes, as the int8 cache's rows do (``minicb.model.quant.pack_kv_int8``), so a block carries
its own scales and copy-on-write, prefix caching and preemption move them with it::

    [ e4m3 x head_dim ............................ | scale (float32, 4 bytes) ]

    scale = max|x| / 448 (1 for an all-zero head)     448: e4m3's largest finite value
    byte  = e4m3(x / scale), rounded to nearest even  value = e4m3 value of byte * scale

e4m3 keeps 3 mantissa bits over 16 binades, so each value is within 1/16 of itself (relative),
where int8's error is within 1/254 of the head's largest value: fp8 is kinder to small values
beside an outlier, int8 to the values near the largest. The cache tensor's dtype is
``torch.float8_e4m3fn`` (each element one byte; the scale's 4 bytes are read through a byte
view). Importing this module never imports Triton.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0          # torch.finfo(torch.float8_e4m3fn).max
SCALE_BYTES = 4          # the float32 scale after each row, as an int8 row's (kernels/cpu.py)
KV_CACHE_DTYPE_NAMES = ("fp8", "fp8_e4m3")   # vLLM's names for this cache


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8


def pack_kv_fp8(x: torch.Tensor) -> torch.Tensor:
    """Keys or values x [..., head_dim] as FP8 cache rows [..., head_dim + 4], in bytes (uint8):
    the e4m3 bytes of x / scale, then the scale's 4 bytes. The Triton KV write
    (kernels/kv_write.py) computes the same bytes."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    # one rounded division, as the Triton write's; a hair past 448 would be NaN in e4m3fn: clamp
    y = (x / scale).clamp(-FP8_MAX, FP8_MAX)
    return torch.cat([y.to(FP8).view(torch.uint8), scale.view(torch.uint8)], dim=-1)


def unpack_kv_fp8(rows: torch.Tensor) -> torch.Tensor:
    """float32 [..., head_dim] of FP8 cache rows [..., head_dim + 4] (a float8_e4m3fn or uint8
    tensor, as pack_kv_fp8 writes them)."""
    raw = rows.view(torch.uint8)
    # the scale's 4 bytes copied out (a view of them may sit at an offset float32 cannot use)
    scale = raw[..., -SCALE_BYTES:].clone(memory_format=torch.contiguous_format)
    return raw[..., :-SCALE_BYTES].view(FP8).float() * scale.view(torch.float32)

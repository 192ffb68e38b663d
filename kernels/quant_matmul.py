"""Weight-only int8 on a GPU: ``x @ (q * scale)^T + bias`` with the dequantize inside the product.

The weight stays int8 in GPU memory (one byte a value, a quarter of float32's, half of
bfloat16's) and is never converted as a whole: each program loads int8 tiles of it, widens them
in registers to the activations' dtype and accumulates in float32. int8 values (-128..127) are
exact in float16 and bfloat16, so the widening loses nothing; the per-output-channel scale
(``minicb.model.quant.quantize_int8``) is the same for every term of a column's sum, so it
multiplies the finished sums, once per output, instead of every weight::

    out[m, n] = scale[n] * sum_k x[m, k] * q[n, k]  (+ bias[n])

    x [M, K]          q [N, K] int8              out [M, N]
    ┌──────────┐     ┌───────────┐               ┌────────┐
    │ BLOCK_M  │  ·  │ BLOCK_N   │ᵀ  BLOCK_K at  │ tile   │ × scale[n] (+ bias[n])
    │ × BLOCK_K│     │ × BLOCK_K │   a time      │ fp32   │
    └──────────┘     └───────────┘               └────────┘

One program computes one [BLOCK_M, BLOCK_N] tile of the output. A decode step has a handful of
rows (at least 16 pad ``tl.dot``'s smallest tile), and its time is the weight's bytes: narrower
column tiles give it more programs to read them with.

int4 in groups of 32 (``quantization="int4"``, minicb/model/int4.py: codes q in 0..15, a row's 32
consecutive values sharing a float32 scale and offset, byte b of a group holding value b in its
low nibble and value b + 16 in its high one) runs one group per step of K: the two nibbles of the
group's 16 bytes are two [16, BLOCK_N] code tiles, each multiplied by its half of the activations,
and the group's scale and offset apply to that group's sums::

    sum over the group of x * (q * scale + offset) = scale * (x · q) + offset * sum(x)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .targets import DoesNotFit, GpuLimits, limits_for_device

__all__ = ["int4_matmul", "int8_matmul", "matmul_launch"]

MIN_DOT_ROWS = 16
GROUP = 32               # int4 values sharing a scale and offset (minicb/model/int4.py)
# What the compiled kernel keeps in shared memory beyond the tiles (barriers, the epilogue's
# scratch); the compile check (python -m minicb bench gpu-compile) holds the estimate below to
# what Triton allocates, on seven GPUs.
SHARED_SLACK = 1024


@triton.jit
def _int8_matmul_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_x_row, stride_w_row, stride_o_row,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x_row + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        # the weight tile transposed as it is read: [BLOCK_K, BLOCK_N] int8, widened in registers
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * stride_w_row + ks[:, None],
                    mask=k_ok[:, None] & col_ok[None, :], other=0)
        acc = tl.dot(x, w.to(x.dtype), acc=acc, input_precision=DOT_PRECISION)
    out = acc * tl.load(scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_o_row + cols[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _int4_matmul_kernel(
    x_ptr, w_ptr, pairs_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_x_row, stride_w_row, stride_p_row, stride_o_row,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    half = tl.arange(0, 16)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x_row
    w_cols = w_ptr + cols[None, :].to(tl.int64) * stride_w_row
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for group in range(0, K // 32):   # K is a multiple of 32 (quantize_int4 refuses others)
        x_mask = row_ok[:, None]
        x_low = tl.load(x_rows + group * 32 + half[None, :], mask=x_mask, other=0.0)
        x_high = tl.load(x_rows + group * 32 + 16 + half[None, :], mask=x_mask, other=0.0)
        # the group's 16 bytes of each column, transposed as read: [16, BLOCK_N]
        codes = tl.load(w_cols + group * 16 + half[:, None], mask=col_ok[None, :], other=0)
        low = (codes & 15).to(x_low.dtype)
        high = (codes >> 4).to(x_low.dtype)
        sums = tl.dot(x_low, low, input_precision=DOT_PRECISION)
        sums = tl.dot(x_high, high, acc=sums, input_precision=DOT_PRECISION)
        x_sum = tl.sum(x_low.to(tl.float32), 1) + tl.sum(x_high.to(tl.float32), 1)
        pair = pairs_ptr + cols.to(tl.int64) * stride_p_row + group * 2
        scale = tl.load(pair, mask=col_ok, other=0.0)
        offset = tl.load(pair + 1, mask=col_ok, other=0.0)
        acc += sums * scale[None, :] + x_sum[:, None] * offset[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_o_row + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def shared_estimate(block_m: int, block_n: int, block_k: int, itemsize: int, stages: int,
                    nvidia: bool = True) -> int:
    """Bytes of shared memory the kernel needs, at most: ``tl.dot`` stages its operands there,
    the activation tile and the weight tile (counted at the activations' width, as widened for
    the product), one of each per pipeline stage; with 2-byte inputs on NVIDIA the compiler may
    also pass the float32 accumulator through shared memory to change its layout."""
    tiles = stages * itemsize * (block_m * block_k + block_k * block_n)
    accumulator = 4 * block_m * block_n if nvidia and itemsize <= 2 else 0
    return max(tiles, accumulator) + SHARED_SLACK


def matmul_launch(dtype: torch.dtype, rows: int, limits: GpuLimits | None,
                  bits: int = 8) -> dict:
    """The kernel's tiles and launch options for ``rows`` rows of activations on one device
    (``limits`` None: the interpreter, no limit). Row tiles of 16, 32 or 64 as the batch needs;
    a decode batch (16 rows or fewer) gets 32 columns per program, so the weight is read by
    twice the programs; 64 keys of K per step in 2-byte dtypes (32 in float32), three pipeline
    stages (two in float32), fewer where the device's shared memory is short. Returns the
    constexprs with ``num_warps``, ``num_stages`` and ``shared_estimate``; the runtime and the
    compile check both call this. ``bits=4``: the int4 kernel, whose K step is one group (32)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    block_m = min(64, max(MIN_DOT_ROWS, triton.next_power_of_2(max(rows, 1))))
    block_n = 32 if rows <= MIN_DOT_ROWS else 64
    block_k = 32 if bits == 4 or itemsize > 2 else 64
    hip = limits is not None and limits.backend == "hip"
    # float32 multiplies exactly ("ieee"), as the attention kernel does; for 2-byte inputs the
    # setting changes nothing but must be one the target accepts (gfx90a refuses "tf32")
    dot_precision = "ieee" if dtype == torch.float32 or hip else "tf32"
    budget = limits.shared_per_block if limits is not None else None
    for stages in range(3 if itemsize <= 2 else 2, 0, -1):
        need = shared_estimate(block_m, block_n, block_k, itemsize, stages, nvidia=not hip)
        if budget is None or need <= budget:
            tiles = dict(BLOCK_M=block_m, BLOCK_N=block_n) | (
                {} if bits == 4 else {"BLOCK_K": block_k})
            return dict(**tiles, DOT_PRECISION=dot_precision, num_warps=4, num_stages=stages,
                        shared_estimate=need)
    raise DoesNotFit(f"the int{bits} product in {dtype} needs {need:,} bytes of shared memory per "
                     f"block; the {limits.label} allows {limits.shared_per_block:,}.")


def _check_args(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None, bits: int = 8) -> None:
    per_byte = 8 // bits
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != per_byte * weight.shape[1]:
        raise ValueError(f"x must be [rows, in_features] and the weight [out_features, "
                         f"in_features{' / 2' if bits == 4 else ''}]; got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}")
    want = torch.int8 if bits == 8 else torch.uint8
    if weight.dtype != want:
        raise ValueError(f"the int{bits} weight must be {want} (minicb.model."
                         f"{'quant.quantize_int8' if bits == 8 else 'int4.pack_int4'}); got "
                         f"{weight.dtype}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be float16, bfloat16 or float32; got {x.dtype}")
    out_features = weight.shape[0]
    scales = (out_features,) if bits == 8 else (out_features, x.shape[1] // GROUP, 2)
    if x.shape[1] % (GROUP if bits == 4 else 1):
        raise ValueError(f"int4 groups are {GROUP} values; in_features {x.shape[1]} is no "
                         "multiple of them")
    if scale.shape != scales or scale.dtype != torch.float32:
        raise ValueError(f"scale must be float32 {list(scales)} ("
                         f"{'one per output channel' if bits == 8 else 'scale, offset per group'}"
                         f"); got {scale.dtype} {tuple(scale.shape)}")
    if bias is not None and bias.shape != (out_features,):
        raise ValueError(f"bias must be [{out_features}]; got {tuple(bias.shape)}")
    tensors = [x, weight, scale] + ([bias] if bias is not None else [])
    if len({t.device for t in tensors}) != 1:
        raise ValueError("x, the weight, scale and bias must be on one device; got "
                         f"{sorted({str(t.device) for t in tensors})}")
    for name, t in (("x", x), ("weight", weight), ("scale", scale), ("bias", bias)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension; call "
                             ".contiguous()")
    if bits == 4 and scale.stride(1) != 2:
        raise ValueError("the int4 (scale, offset) pairs must be contiguous per row; call "
                         ".contiguous()")


def int8_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None, limits: GpuLimits | None = None
                ) -> torch.Tensor:
    """``x [rows, k] @ (weight * scale[:, None])^T + bias`` in x's dtype, accumulated in float32,
    with ``weight`` int8 ``[n, k]`` and ``scale`` float32 ``[n]`` (one per output channel).
    ``limits`` picks the tiles for that device (default: the live GPU's; none under the
    interpreter)."""
    _check_args(x, weight, scale, bias)
    rows, out_features = x.shape[0], weight.shape[0]
    out = torch.empty((rows, out_features), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    if limits is None and x.is_cuda:
        limits = limits_for_device(x.device)
    launch = matmul_launch(x.dtype, rows, limits)
    launch.pop("shared_estimate")
    grid = (triton.cdiv(rows, launch["BLOCK_M"]), triton.cdiv(out_features, launch["BLOCK_N"]))
    _int8_matmul_kernel[grid](
        x, weight, scale, bias if bias is not None else scale, out,
        rows, out_features, x.shape[1],
        x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, **launch)
    return out


def int4_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None, limits: GpuLimits | None = None
                ) -> torch.Tensor:
    """``x [rows, k] @ w^T + bias`` in x's dtype, accumulated in float32, with ``w`` int4 in
    groups of 32: ``weight`` uint8 ``[n, k / 2]`` (minicb.model.int4.pack_int4's bytes) and
    ``scale`` float32 ``[n, k / 32, 2]`` (each group's scale and offset)."""
    _check_args(x, weight, scale, bias, bits=4)
    rows, out_features = x.shape[0], weight.shape[0]
    out = torch.empty((rows, out_features), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    if limits is None and x.is_cuda:
        limits = limits_for_device(x.device)
    launch = matmul_launch(x.dtype, rows, limits, bits=4)
    launch.pop("shared_estimate")
    grid = (triton.cdiv(rows, launch["BLOCK_M"]), triton.cdiv(out_features, launch["BLOCK_N"]))
    _int4_matmul_kernel[grid](
        x, weight, scale, bias if bias is not None else scale, out,
        rows, out_features, x.shape[1],
        x.stride(0), weight.stride(0), scale.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, **launch)
    return out


"""The Triton int8 and int4 products (weight-only quantization="int8" and "int4" on a GPU)
against dequantize-then-matmul: through the interpreter on a CPU (float32), compiled on a GPU
(float16, bfloat16, and the engine's tokens against the CPU's quantized engine)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from minicb.kernels.quant_matmul import int4_matmul, int8_matmul, matmul_launch  # noqa: E402

from minicb.model.int4 import dequantize_int4, pack_int4, quantize_int4  # noqa: E402
from minicb.model.quant import quantize_int8  # noqa: E402


def int8_matmul_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize, then multiply, in float32: the oracle for int8_matmul."""
    out = x.float() @ (weight.float() * scale[:, None]).T
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype)


def int4_matmul_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize (minicb.model.int4's own unpacking), then multiply, in float32: the oracle for
    int4_matmul."""
    out = x.float() @ dequantize_int4(weight, scale).T
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype)


INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETING or not torch.cuda.is_available() else "cuda"
gpu = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETING,
                         reason="needs CUDA and compiled kernels (run without TRITON_INTERPRET)")


def operands(rows: int, n: int, k: int, seed: int, dtype=torch.float32, bias: bool = True):
    gen = torch.Generator().manual_seed(seed)
    # columns of very different sizes: a wrong channel's scale shows
    w = torch.randn(n, k, generator=gen) * torch.logspace(-2, 1, n)[:, None]
    q, scale = quantize_int8(w)
    x = torch.randn(rows, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    return [t.to(DEVICE) if t is not None else None for t in (x.to(dtype), q, scale, b)]


# a decode row; a decode batch past one 16-row tile with K not a multiple of the K tile; a
# prefill tile of 64 rows and a ragged second one, N not a multiple of the column tile
@pytest.mark.parametrize("rows, n, k, bias", [(1, 48, 64, True), (17, 40, 100, False),
                                              (70, 72, 48, True)])
def test_int8_matmul_equals_dequantize_then_matmul(rows, n, k, bias):
    x, q, scale, b = operands(rows, n, k, seed=rows, bias=bias)
    got = int8_matmul(x, q, scale, b)
    want = int8_matmul_reference(x, q, scale, b)
    assert got.dtype == x.dtype and got.shape == (rows, n)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # the scale multiplies its own column: scaling one channel changes that column alone
    scale2 = scale.clone()
    scale2[3] *= 2
    again = int8_matmul(x, q, scale2, b)
    torch.testing.assert_close(again[:, 3] - (b[3] if b is not None else 0),
                               2 * (got[:, 3] - (b[3] if b is not None else 0)),
                               atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.cat([again[:, :3], again[:, 4:]], 1),
                       torch.cat([got[:, :3], got[:, 4:]], 1))


def int4_operands(rows: int, n: int, k: int, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    # groups that lean one way and groups of very different ranges: a wrong group's scale or
    # offset, or a nibble taken from the wrong half, shows
    w = torch.randn(n, k, generator=gen) * torch.logspace(-2, 1, k // 32).repeat_interleave(32)
    w += torch.linspace(-1, 1, n)[:, None]
    q, pairs = quantize_int4(w)
    x = torch.randn(rows, k, generator=gen)
    return [t.to(DEVICE) for t in (x.to(dtype), pack_int4(q), pairs, torch.randn(n, generator=gen))]


@pytest.mark.parametrize("rows, n, k", [(1, 48, 64), (20, 40, 96)])
def test_int4_matmul_equals_dequantize_then_matmul(rows, n, k):
    x, packed, pairs, b = int4_operands(rows, n, k, seed=rows)
    torch.testing.assert_close(int4_matmul(x, packed, pairs, b),
                               int4_matmul_reference(x, packed, pairs, b), atol=1e-4, rtol=1e-4)
    # a fused projection's part: a row slice of the codes and of the pairs
    part = slice(8, 30)
    torch.testing.assert_close(int4_matmul(x, packed[part], pairs[part], None),
                               int4_matmul_reference(x, packed, pairs, None)[:, part],
                               atol=1e-4, rtol=1e-4)


def test_int8_matmul_reads_a_view_of_a_fused_weight_and_takes_no_rows():
    """A fused projection's part is a row slice of the fused int8 weight (quant._views)."""
    x, q, scale, b = operands(3, 64, 32, seed=1)
    part = slice(16, 40)
    got = int8_matmul(x, q[part], scale[part], b[part])
    torch.testing.assert_close(got, int8_matmul_reference(x, q, scale, b)[:, part],
                               atol=1e-4, rtol=1e-4)
    assert int8_matmul(x[:0], q, scale, b).shape == (0, 64)


def test_bad_operands_are_named():
    x, q, scale, b = operands(2, 8, 16, seed=2)
    with pytest.raises(ValueError, match="the int8 weight must be torch.int8"):
        int8_matmul(x, q.float(), scale)
    with pytest.raises(ValueError, match="scale must be float32 \\[8\\]"):
        int8_matmul(x, q, scale[:4])
    with pytest.raises(ValueError, match="x must be \\[rows, in_features\\]"):
        int8_matmul(x[:, :8], q, scale)
    x4, packed, pairs, _ = int4_operands(2, 8, 64, seed=2)
    with pytest.raises(ValueError, match="the int4 weight must be torch.uint8"):
        int4_matmul(x4, packed.to(torch.int8), pairs)
    with pytest.raises(ValueError, match="scale, offset per group"):
        int4_matmul(x4, packed, pairs[:, :1])


def test_tiles_follow_the_rows_and_fit_every_target():
    from minicb.kernels.targets import TARGETS

    decode = matmul_launch(torch.bfloat16, 1, None)
    prefill = matmul_launch(torch.bfloat16, 512, None)
    assert (decode["BLOCK_M"], decode["BLOCK_N"]) == (16, 32)   # more programs read the weight
    assert (prefill["BLOCK_M"], prefill["BLOCK_N"]) == (64, 64)
    for limits in TARGETS.values():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            launch = matmul_launch(dtype, 512, limits)
            assert launch["shared_estimate"] <= limits.shared_per_block, (limits.key, dtype)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 16, 300])
def test_int8_matmul_half_precision_on_gpu(dtype, rows):
    x, q, scale, b = operands(rows, 2816, 1024, seed=rows, dtype=dtype)
    got = int8_matmul(x, q, scale, b).float()
    want = int8_matmul_reference(x.float(), q, scale, b)
    # inputs in 2 bytes, sums in float32: the output's own rounding dominates
    torch.testing.assert_close(got, want, atol=2e-2 * want.abs().max().item(), rtol=1e-2)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_int4_matmul_half_precision_on_gpu(dtype):
    x, packed, pairs, b = int4_operands(16, 2816, 1024, seed=4, dtype=dtype)
    got = int4_matmul(x, packed, pairs, b).float()
    want = int4_matmul_reference(x.float(), packed, pairs, b).float()
    torch.testing.assert_close(got, want, atol=2e-2 * want.abs().max().item(), rtol=1e-2)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_the_engine_on_a_gpu_gives_the_cpu_quantized_engines_tokens(tiny_llama, quantization):
    """quantization="int8" or "int4" on CUDA runs every decoder matrix through the Triton
    product: the same greedy tokens as the CPU engine on the same weights (float32 both), a
    choice allowed to differ only at a near-tie of the CPU engine's logprobs
    (tests/reference.py)."""
    from reference import Reference, check_all, greedy

    from minicb import LLM
    from minicb.model.int4 import Int4Linear
    from minicb.model.quant import Int8Linear

    prompts = [[3 + (5 * i + j) % 400 for j in range(4 + 7 * i)] for i in range(4)]
    params = greedy(12)
    cpu = LLM(tiny_llama, quantization=quantization, max_num_seqs=4).generate(
        prompts, params, use_tqdm=False)
    llm = LLM(tiny_llama, quantization=quantization, device="cuda", attention="triton",
              max_num_seqs=4)
    layer = llm.llm_engine.model.model.layers[0].mlp.down_proj
    assert isinstance(layer, Int8Linear if quantization == "int8" else Int4Linear)
    got = llm.generate(prompts, params, use_tqdm=False)
    references = [Reference(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in cpu]
    verdicts = check_all(references, got)
    assert verdicts.count("equal") >= len(prompts) - 1, verdicts

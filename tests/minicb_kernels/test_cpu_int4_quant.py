"""int4 weights in the CPU kernels, each instruction-set build this machine runs forced in turn:
the small-batch product and the fused decode layer equal a dequantize-then-compute torch
reference within float32 rounding, and every build gives the same greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from minicb.kernels import cpu, isa
from reference import greedy
from test_cpu_decode import decode_step
from test_cpu_isa import BUILDS

from minicb import LLM
from minicb.model.fused_cpu import FusedCpuDecoder, use_small_batch_linear
from minicb.model.int4 import dequantize_int4, pack_int4, quantize_int4
from minicb.model.loader import load_model


@pytest.mark.parametrize("fmt", ["int4", "grouped int8"])
@pytest.mark.parametrize("rows, n, k", [(1, 36, 64), (5, 64, 96), (7, 30, 1024)])
def test_grouped_linear_equals_dequantize_then_matmul(build, fmt, rows, n, k):
    """Every tile shape: 1-3 input rows, a partial tile of weight rows (30), one group to many.
    Grouped int8 (a compressed-tensors W8A16 checkpoint's) shares int4's pairs and tile."""
    gen = torch.Generator().manual_seed(rows * 1000 + n)
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    q, pairs = quantize_int4(torch.randn(n, k, generator=gen))
    weight, dense = pack_int4(q), dequantize_int4(pack_int4(q), pairs)
    if fmt == "grouped int8":
        weight = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
        pairs[..., 0] /= 16
        dense = weight.float() * pairs[..., 0].repeat_interleave(32, 1) + \
            pairs[..., 1].repeat_interleave(32, 1)
    expected = x.double() @ dense.double().T + bias.double()
    got = cpu.linear_cpu(x, weight, bias, pairs)
    torch.testing.assert_close(got.double(), expected, atol=2e-5 * k ** 0.5, rtol=1e-5)


def test_int4_weights_are_checked_before_the_kernel_reads_them():
    q, pairs = quantize_int4(torch.randn(8, 64))
    packed, x = pack_int4(q), torch.randn(2, 64)
    with pytest.raises(ValueError, match="per-group"):
        cpu.linear_cpu(x, packed)
    with pytest.raises(ValueError, match=r"scale \(8, 2\) must be \[8, 2, 2\]"):
        cpu.linear_cpu(x, packed, scale=pairs[..., 0].contiguous())
    with pytest.raises(ValueError, match="do not multiply"):
        cpu.linear_cpu(torch.randn(2, 32), packed, scale=pairs)
    with pytest.raises(ValueError, match="no multiple of 32"):
        cpu.linear_cpu(torch.randn(2, 48), torch.zeros(8, 24, dtype=torch.uint8),
                       scale=torch.ones(8, 1, 2))
    cache = torch.zeros(2, 16, 1, 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="a KV cache is float32, bfloat16 or int8"):
        cpu.cache_format(cache, cache)


@pytest.fixture(scope="module")
def int4_and_dequantized(tiny_qwen3):
    """tiny_qwen3 (q/k norms, head_dim x heads != hidden) with int4 weights, and the float32
    model holding the weights they stand for."""
    model = load_model(Path(tiny_qwen3), attention="cpu", quantization="int4")
    reference = load_model(Path(tiny_qwen3), attention="cpu")
    for (name, module), ref in zip(model.named_modules(), reference.modules()):
        if name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            ref.weight.data = dequantize_int4(module.weight, module.scale)
    use_small_batch_linear(reference, False)
    return model, reference


@pytest.mark.parametrize("seq_lens", [[1], [5, 16, 33, 1, 64, 2]], ids=["first-token", "mixed"])
def test_the_fused_layer_with_int4_weights_equals_the_dequantized_modules(int4_and_dequantized,
                                                                          build, seq_lens):
    model, reference = int4_and_dequantized
    ids, positions, caches, meta = decode_step(model, seq_lens)
    reference_caches = [(k.clone(), v.clone()) for k, v in caches]
    every_row = torch.arange(len(seq_lens))
    fused = FusedCpuDecoder(model)(ids, positions, caches, meta(), every_row)
    expected = reference(ids, positions, reference_caches, meta(), every_row)
    torch.testing.assert_close(fused, expected, atol=1e-4, rtol=1e-4)
    for (k, v), (k_ref, v_ref) in zip(caches, reference_caches):
        torch.testing.assert_close(k, k_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v_ref, atol=1e-5, rtol=1e-5)


def test_every_build_gives_the_same_int4_greedy_tokens(tiny_llama, monkeypatch,
                                                       reload_cpu_kernel):
    """The builds differ only in the order of float32 sums: no greedy choice here is that close."""
    prompts = [[3 + (7 * i + j) % 500 for j in range(4 + 9 * i)] for i in range(4)]
    results = {}
    for name in BUILDS:
        monkeypatch.setenv(isa.ENV, name)
        cpu._library.cache_clear()
        llm = LLM(tiny_llama, attention="cpu", max_num_seqs=4, quantization="int4")
        outputs = llm.generate(prompts, greedy(24), use_tqdm=False)
        results[name] = [out.outputs[0].token_ids for out in outputs]
    assert all(tokens == results[BUILDS[0]] for tokens in results.values()), results

"""Chapter 12: the int8 quantizer, the product that dequantizes inside, the int8 KV row with its
scale: bit for bit against minicb.model.quant (itself equal to torchao's Int8WeightOnlyConfig,
tests/model/test_quant.py), through minicb's C attention kernel, and in the real engine."""

from __future__ import annotations

import pytest
import torch
from adapter import chapter, run_docstring_examples
from minicb.kernels import cpu, paged_attention_reference
from torch.utils._python_dispatch import TorchDispatchMode

from minicb import LLM
from minicb.model import quant
from minicb.model.default import default_model_path

ch12 = chapter("12")


def _weight(n: int = 48, k: int = 80, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 1, n)[:, None]
    w[3] = 0.0                                  # an all-zero channel
    return w


def test_ch12_worked_examples():
    run_docstring_examples(ch12)


@pytest.mark.parametrize("seed", range(3))
def test_ch12_quantizer_matches_minicb(seed):
    w = _weight(seed=seed)
    q, scale = ch12.quantize_per_channel(w)
    want_q, want_scale = quant.quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert torch.equal(scale, want_scale), "scale_j = max|W_j| / 127.5, floored at float32's eps"
    assert torch.equal(q, want_q), "q = clamp(round(W * (1 / scale)), -128, 127)"


class _Multiplies(TorchDispatchMode):
    """Records the shapes of every elementwise product a function computes."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mul, torch.ops.aten.div):
            self.shapes.append(tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows", [1, 7])
def test_ch12_int8_linear_scales_sums_not_weights(rows):
    """Equal to dequantize-then-matmul within float32 rounding, with the scale applied to the
    [rows, n] sums: no product of a whole [n, k] matrix by the scales."""
    w = _weight()
    q, scale = quant.quantize_int8(w)
    x, bias = torch.randn(rows, w.shape[1]), torch.randn(w.shape[0])
    with _Multiplies() as seen:
        got = ch12.int8_linear(x, q, scale, bias)
    want = x.double() @ (q.double() * scale.double()[:, None]).T + bias.double()
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ch12.int8_linear(x, q, scale), got - bias, atol=1e-5, rtol=1e-5)
    whole = [s for s in seen.shapes if any(shape in (tuple(q.shape), tuple(q.T.shape))
                                           for shape in s)]
    assert not whole, f"the scales multiplied a whole weight matrix: {whole}"


@pytest.mark.parametrize("head_dim", [64, 32])
def test_ch12_kv_rows_match_minicb_byte_for_byte(head_dim):
    x = torch.randn(5, 16, 2, head_dim) * torch.logspace(-2, 1, 5)[:, None, None, None]
    x[0, 0, 1] = 0.0                            # an all-zero row: scale 1
    rows = ch12.pack_kv_row(x)
    want = quant.pack_kv_int8(x)
    assert rows.dtype == torch.int8 and rows.shape == want.shape
    assert torch.equal(rows, want), "head_dim int8 values, then the 4 bytes of max|x| / 127"
    assert torch.equal(ch12.unpack_kv_row(want), quant.unpack_kv_int8(want))


def test_ch12_kv_rows_feed_minicbs_attention_kernel():
    """A cache your function wrote, read by minicb's C kernel, equals attention over your
    dequantized rows."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 64, generator=gen)
    k, v = (torch.randn(6, 16, 2, 64, generator=gen) for _ in range(2))
    k_cache, v_cache = ch12.pack_kv_row(k), ch12.pack_kv_row(v)
    cu, lens = torch.tensor([0, 1, 2, 3], dtype=torch.int32), torch.tensor([40, 7, 16],
                                                                          dtype=torch.int32)
    tables = torch.tensor([[5, 0, 3], [1, 0, 0], [2, 0, 0]], dtype=torch.int32)
    got = cpu.paged_attention_cpu(q, k_cache, v_cache, cu, lens, tables, 0.125)
    want = paged_attention_reference(q, ch12.unpack_kv_row(k_cache), ch12.unpack_kv_row(v_cache),
                                     cu, lens, tables, 0.125, 1, 40)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_ch12_real_engine_on_your_quantizer(monkeypatch):
    """The shipped model quantized at load by your quantizer gives minicb's int8 engine's
    tokens."""
    prompts = [[5 + (13 * i + j) % 3000 for j in range(12 + 5 * i)] for i in range(3)]
    from minicb import SamplingParams

    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    model = str(default_model_path())
    want = LLM(model, quantization="int8", max_num_seqs=3).generate(prompts, params,
                                                                    use_tqdm=False)
    monkeypatch.setattr(quant, "quantize_int8", ch12.quantize_per_channel)
    got = LLM(model, quantization="int8", max_num_seqs=3).generate(prompts, params,
                                                                   use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]

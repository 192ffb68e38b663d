"""The CPU kernels built per instruction set (kernels/isa.py) and in every storage format: each
build this machine runs is forced in turn and must compute what a dequantize-then-compute torch
reference computes, within float32 rounding, and give the engine the same greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from minicb.kernels import cpu, isa, paged_attention_reference
from reference import greedy
from test_cpu_decode import decode_step
from test_kernels import make_batch

from minicb import LLM
from minicb.model.fused_cpu import FusedCpuDecoder, use_small_batch_linear
from minicb.model.loader import load_model
from minicb.model.quant import pack_kv_int8, quantize_int8, unpack_kv_int8

BUILDS = isa.supported()




def test_the_widest_build_the_cpu_runs_is_chosen(monkeypatch):
    monkeypatch.delenv(isa.ENV, raising=False)
    assert isa.chosen() == BUILDS[0]
    if isa.is_x86():
        assert BUILDS[-1] == "generic"
        flags = isa.cpu_flags()
        assert ("avx512_bf16" in BUILDS) == ({"avx512_bf16", "avx512f"} <= flags)
        assert ("avx2" in BUILDS) == ({"avx2", "fma"} <= flags)


def test_a_build_the_cpu_lacks_is_refused_by_name(monkeypatch, reload_cpu_kernel):
    monkeypatch.setenv(isa.ENV, "sse9")
    ok, why = cpu.available()
    assert not ok and "MINICB_CPU_ISA='sse9'" in why and BUILDS[0] in why


def _weights(fmt: str, n: int, k: int, gen: torch.Generator):
    """(weight as stored, its scale or None, the float32 weight the reference multiplies)."""
    w = torch.randn(n, k, generator=gen)
    if fmt == "bfloat16":
        return w.bfloat16(), None, w.bfloat16().float()
    if fmt == "int8":
        q, scale = quantize_int8(w)
        return q, scale, q.float() * scale[:, None]
    return w, None, w


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("rows, n, k", [(1, 36, 64), (5, 64, 100), (7, 30, 1027)])
def test_linear_equals_dequantize_then_matmul(build, fmt, rows, n, k):
    """Every tile shape (1-3 rows, a partial tile of weight rows, a k that is no multiple of any
    vector width). bfloat16 weights multiply x rounded to bfloat16: the reference does too."""
    gen = torch.Generator().manual_seed(rows * 1000 + n)
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    w, scale, dense = _weights(fmt, n, k, gen)
    x_ref = x.bfloat16().float() if fmt == "bfloat16" else x
    expected = x_ref.double() @ dense.double().T + bias.double()
    got = cpu.linear_cpu(x, w, bias, scale)
    torch.testing.assert_close(got.double(), expected, atol=2e-5 * k ** 0.5, rtol=1e-5)


def test_int8_weights_need_their_scales_and_nothing_else_takes_one():
    q, scale = quantize_int8(torch.randn(8, 16))
    with pytest.raises(ValueError, match="need their per-channel scale"):
        cpu.linear_cpu(torch.randn(2, 16), q)
    with pytest.raises(ValueError, match="need their per-channel scale"):
        cpu.linear_cpu(torch.randn(2, 16), q.float(), scale=scale)
    with pytest.raises(ValueError, match="float32, bfloat16 or int8"):
        cpu.linear_cpu(torch.randn(2, 16), q.half())


def test_bfloat16_products_go_to_onednn_from_its_crossover(monkeypatch):
    """A bfloat16 weight's products of more than bfloat16_kernel_rows rows go to torch's bfloat16
    product, fewer to the C kernel; a float32 weight keeps its own limit."""
    from minicb.model.fused_cpu import SmallBatchLinear

    calls = []
    real = cpu.linear_cpu
    monkeypatch.setattr(cpu, "linear_cpu", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    layer = SmallBatchLinear(16, 4).to(torch.bfloat16)
    limit = SmallBatchLinear.bfloat16_kernel_rows
    with torch.inference_mode():
        outs = [layer(torch.randn(rows, 16).bfloat16()) for rows in (1, limit, limit + 1)]
        SmallBatchLinear(16, 4)(torch.randn(limit + 1, 16))
    assert calls == [1, limit, limit + 1]
    assert all(out.dtype == torch.bfloat16 for out in outs)


def _caches(fmt: str, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """(k, v) stored as fmt, and the float32 caches they stand for."""
    if fmt == "bfloat16":
        k, v = k_cache.bfloat16(), v_cache.bfloat16()
        return (k, v), (k.float(), v.float())
    if fmt == "int8":
        k, v = pack_kv_int8(k_cache), pack_kv_int8(v_cache)
        return (k, v), (unpack_kv_int8(k), unpack_kv_int8(v))
    return (k_cache, v_cache), (k_cache, v_cache)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("head_dim, group", [(64, 2), (32, 1)])
def test_attention_equals_dequantize_then_attend(build, fmt, head_dim, group):
    batch = make_batch([1, 1, 5, 1], [17, 40, 9, 3], head_dim, 16, group, 2, seed=head_dim,
                       device="cpu")
    (k, v), (k_ref, v_ref) = _caches(fmt, batch.k_cache, batch.v_cache)
    got = cpu.paged_attention_cpu(batch.q, k, v, batch.cu_seqlens_q, batch.seq_lens,
                                  batch.block_tables, head_dim ** -0.5)
    args = list(batch.args())
    args[1:3] = k_ref, v_ref
    torch.testing.assert_close(got, paged_attention_reference(*args), atol=1e-5, rtol=1e-5)


def test_an_int8_cache_row_holds_its_scale():
    """Each (token, KV head) row is head_dim values and 4 bytes of scale: a cache without room
    for the scales is read as a smaller head, and refused."""
    batch = make_batch([1], [5], 32, 16, 1, 2, seed=0, device="cpu")
    (k, v), (k_ref, _) = _caches("int8", batch.k_cache, batch.v_cache)
    assert k.shape[-1] == 32 + 4
    scales = k[..., 32:].contiguous().view(torch.float32)[..., 0]
    torch.testing.assert_close(scales * 127, batch.k_cache.abs().amax(-1))
    torch.testing.assert_close(k_ref, batch.k_cache, atol=batch.k_cache.abs().max() / 254,
                               rtol=0)
    with pytest.raises(ValueError, match="q has head_dim 32, the cache 28"):
        cpu.paged_attention_cpu(batch.q, k[..., :32].contiguous(), v[..., :32].contiguous(),
                                batch.cu_seqlens_q, batch.seq_lens, batch.block_tables, 0.1)


@pytest.mark.parametrize("seq_lens", [[1], [5, 16, 33, 1, 64, 2]], ids=["first-token", "mixed"])
def test_the_fused_layer_on_an_int8_cache_equals_the_modules(any_tiny_model, seq_lens):
    """The C write (minicb_store_kv) and the torch write (pack_kv_int8) quantize the same k and v
    (equal to ~1e-6) into the same rows, a value at most one int8 step apart where a rounding
    falls on the boundary; the hidden states agree as in float32."""
    model = load_model(Path(any_tiny_model), attention="cpu")
    decoder = FusedCpuDecoder(model)
    ids, positions, caches, meta = decode_step(model, seq_lens)
    caches = [(pack_kv_int8(k), pack_kv_int8(v)) for k, v in caches]
    modules_caches = [(k.clone(), v.clone()) for k, v in caches]
    every_row = torch.arange(len(seq_lens))
    fused = decoder(ids, positions, caches, meta(), every_row)
    use_small_batch_linear(model, False)
    reference = model(ids, positions, modules_caches, meta(), every_row)
    torch.testing.assert_close(fused, reference, atol=1e-4, rtol=1e-4)
    for (k, v), (k_ref, v_ref) in zip(caches, modules_caches):
        for got, want in ((k, k_ref), (v, v_ref)):
            step = want[..., -4:].contiguous().view(torch.float32)
            assert (unpack_kv_int8(got) - unpack_kv_int8(want)).abs().le(step * 1.01).all()
            assert (got[..., :-4] != want[..., :-4]).float().mean() < 0.01


PROMPTS = [[3 + (7 * i + j) % 500 for j in range(4 + 9 * i)] for i in range(4)]


def _tokens(model: str, **knobs) -> list[list[int]]:
    llm = LLM(model, attention="cpu", max_num_seqs=4, **knobs)
    outputs = llm.generate(PROMPTS, greedy(24), use_tqdm=False)
    return [out.outputs[0].token_ids for out in outputs]


@pytest.mark.parametrize("knobs", [{}, {"dtype": "bfloat16"}, {"quantization": "int8"}],
                         ids=["float32", "bfloat16", "int8"])
def test_every_build_gives_the_same_greedy_tokens(tiny_llama, knobs, monkeypatch,
                                                  reload_cpu_kernel):
    """The builds differ only in the order of float32 sums (vector widths; vdpbf16ps adds its
    pairs in its own order), about 1e-6 relative: on these requests no greedy choice is that
    close, so every build must pick the same tokens."""
    results = {}
    for name in BUILDS:
        monkeypatch.setenv(isa.ENV, name)
        cpu._library.cache_clear()
        results[name] = _tokens(tiny_llama, **knobs)
    assert all(tokens == results[BUILDS[0]] for tokens in results.values()), results

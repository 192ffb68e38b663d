"""The FP8 e4m3 KV cache (kv_cache_dtype="fp8"): the Triton write rounds exactly as torch's
float8_e4m3fn does, the paged kernel equals dequantize-then-attend, the pool holds the tokens
its bytes allow, bad settings name the choices, and the engine gives the same tokens through the
Triton kernels (the interpreter here) as through the torch backend, with every block back."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from minicb.kernels import (  # noqa: E402
    paged_attention,
    paged_attention_reference,
    write_kv,
    write_kv_reference,
)
from minicb.kernels.fp8 import FP8, FP8_MAX, unpack_kv_fp8  # noqa: E402

from minicb.config import EngineConfig  # noqa: E402
from minicb.model.quant import kv_cache_layout  # noqa: E402

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETING or not torch.cuda.is_available() else "cuda"


def fp8_cache(num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
              device: str = DEVICE) -> torch.Tensor:
    shape, dtype = kv_cache_layout(kv_heads, head_dim, torch.float32, "fp8")
    return torch.zeros(num_blocks, block_size, *shape, dtype=dtype, device=device)


def test_the_write_rounds_every_e4m3_value_and_tie_as_torch_does():
    """Rows whose largest magnitude is 448 have scale 1, so their bytes are e4m3(x) itself: every
    finite e4m3 value, every midpoint between neighbours (ties go to the even code), subnormals
    and values past the smallest subnormal, against torch's own rounding."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    finite = codes[codes.isfinite()].unique()
    midpoints = (finite[1:] + finite[:-1]) / 2
    tiny = torch.tensor([2.0**-10, 3 * 2.0**-11, 2.0**-12, 1e-30])
    values = torch.cat([finite, midpoints, tiny, -tiny])
    head_dim = 63          # one slot per row holds 448; rows padded with it
    rows = -(-len(values) // head_dim)
    body = torch.cat([values, torch.full((rows * head_dim - len(values),), 1.0)])
    k = torch.cat([body.view(rows, 1, head_dim), torch.full((rows, 1, 1), FP8_MAX)], dim=2)
    k_cache, v_cache = fp8_cache(1, rows, 1, head_dim + 1), fp8_cache(1, rows, 1, head_dim + 1)
    write_kv(k.to(DEVICE), k.to(DEVICE), k_cache, v_cache, torch.arange(rows, device=DEVICE))
    got = k_cache.view(torch.uint8)[0, :, 0, :head_dim].reshape(-1)[:len(values)].cpu()
    want = values.to(FP8).view(torch.uint8)
    assert torch.equal(got, want), (values[got != want], got[got != want], want[got != want])
    assert torch.equal(unpack_kv_fp8(k_cache.cpu())[0, :, 0, head_dim], torch.full((rows,), 448.0))


@pytest.mark.parametrize("kv_heads, head_dim", [(3, 12), (2, 64)])
def test_write_kv_fp8_equals_the_torch_packing_and_skips_padding(kv_heads, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    tokens, block_size, blocks = 7, 4, 3
    # heads of very different sizes, and one all zero (its scale is 1)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen) * torch.logspace(-5, 3, tokens)[
        :, None, None]
    k[3, 1] = 0
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    slots = torch.tensor([0, 5, -1, 3, 11, 9, 6])
    caches = [fp8_cache(blocks, block_size, kv_heads, head_dim, device)
              for device in (DEVICE, DEVICE, "cpu", "cpu")]
    write_kv(k.to(DEVICE), v.to(DEVICE), caches[0], caches[1], slots.to(DEVICE))
    write_kv_reference(k, v, caches[2], caches[3], slots)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got.view(torch.uint8).cpu(), want.view(torch.uint8).cpu())
    written = caches[0].view(torch.uint8).view(-1, kv_heads, head_dim + 4).cpu()
    assert written[1].abs().sum() == 0     # slot 1: never written (token 2 is padding)
    # the rows hold the values to within e4m3's half step (1/16 relative) of the head's scale
    back = unpack_kv_fp8(written[slots[slots >= 0]])
    exact = k[slots >= 0]
    assert ((back - exact).abs() <= exact.abs() / 16 + exact.abs().amax(-1, keepdim=True) * 2**-17
            ).all()
    assert torch.equal(written[3, 1, -4:], torch.tensor([1.0]).view(torch.uint8))  # a zero head


def test_paged_attention_on_fp8_equals_dequantize_then_attend():
    """Prefill chunks beside decodes, GQA 2, a block table scattered over the pool, one run in
    key splits: the kernel dequantizes inside its loop; the reference dequantizes, then attends.
    The two differ only by summation order."""
    gen = torch.Generator().manual_seed(3)
    head_dim, kv_heads, group, block_size = 16, 2, 2, 4
    q_lens, seq_lens = [6, 1, 1], [9, 14, 3]
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + 2
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots = [], []
    for n, blocks in zip(seq_lens, need):
        mine, pool = pool[:blocks], pool[blocks:]
        tables.append(mine + [0] * (max(need) - blocks))
        slots += [mine[p // block_size] * block_size + p % block_size for p in range(n)]
    k_cache = fp8_cache(num_blocks, block_size, kv_heads, head_dim, "cpu")
    v_cache = fp8_cache(num_blocks, block_size, kv_heads, head_dim, "cpu")
    k = torch.randn(len(slots), kv_heads, head_dim, generator=gen) * 4
    v = torch.randn(len(slots), kv_heads, head_dim, generator=gen)
    write_kv_reference(k, v, k_cache, v_cache, torch.tensor(slots))
    q = torch.randn(sum(q_lens), kv_heads * group, head_dim, generator=gen)
    args = [q, k_cache, v_cache, torch.tensor([0, 6, 7, 8]), torch.tensor(seq_lens),
            torch.tensor(tables)]
    args = [a.to(DEVICE).int() if a.dtype == torch.int64 else a.to(DEVICE) for a in args]
    args += [head_dim**-0.5, max(q_lens), max(seq_lens)]
    want = paged_attention_reference(*args)
    for num_splits in (1, 3):
        got = paged_attention(*args, num_splits=num_splits)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # and the dequantized cache is what it attended: attention over the float keys differs
    float_caches = [torch.zeros(num_blocks, block_size, kv_heads, head_dim) for _ in range(2)]
    write_kv_reference(k, v, *float_caches, torch.tensor(slots))
    plain = paged_attention_reference(args[0], *[c.to(DEVICE) for c in float_caches], *args[3:])
    assert (plain - want).abs().max() > 1e-4


def test_the_block_count_follows_the_bytes_per_token(tiny_llama, monkeypatch):
    """An FP8 row is head_dim + 4 bytes: at head_dim 64, 3.76x float32's tokens and 1.88x
    bfloat16's for the same memory, and the pool check counts those bytes."""
    for head_dim in (64, 128):
        (heads, row), dtype = kv_cache_layout(2, head_dim, torch.float32, "fp8_e4m3")
        assert dtype == FP8 and row == head_dim + 4
        assert 4 * head_dim / (row * dtype.itemsize) >= 3.7
        assert 2 * head_dim / (row * dtype.itemsize) >= 1.85
    from pathlib import Path

    from minicb.model.loader import load_model
    from minicb.runner import model_runner

    args = load_model(Path(tiny_llama)).args
    float32_block = 2 * args.num_layers * 16 * args.num_kv_heads * args.head_dim * 4
    monkeypatch.setattr(model_runner, "free_memory", lambda device: 500 * float32_block)
    knobs = {"model": tiny_llama, "num_kv_blocks": 1000, "attention": "torch"}
    with pytest.raises(ValueError, match="the KV cache would need"):
        model_runner.check_kv_fits(EngineConfig(**knobs).resolve(512), args)
    model_runner.check_kv_fits(EngineConfig(**knobs, kv_cache_dtype="fp8").resolve(512), args)


@pytest.mark.parametrize("knobs, message", [
    ({"kv_cache_dtype": "fp16"},
     r"kv_cache_dtype='fp16' is not one of \('auto', 'int8', 'fp8', 'fp8_e4m3'\)"),
    ({"kv_cache_dtype": "fp8", "attention": "cpu"},
     r"read by the Triton kernels .* and the torch backend .* not by the C kernel"),
    ({"kv_cache_dtype": "fp8", "tensor_parallel_size": 2}, "run in one process"),
])
def test_a_bad_kv_cache_dtype_names_the_choices(knobs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**knobs)


@pytest.mark.skipif(not torch.cuda.is_available() and not INTERPRETING,
                    reason="without CUDA, Triton runs only with TRITON_INTERPRET=1")
def test_the_engine_on_fp8_gives_the_torch_backends_tokens_through_triton(tiny_llama):
    """attention="triton" writes and reads the FP8 cache in its kernels, attention="torch" packs
    with torch and dequantizes what it gathers: the same tokens, with prefix caching and a pool
    small enough to preempt, and every block back. On a CPU, "auto" picks the torch backend (the
    C kernel reads float and int8 caches)."""
    from reference import greedy

    from minicb import LLM
    from minicb.model.attention import resolve_backend

    prompts = [[3 + (7 * i + j) % 500 for j in range(5 + 9 * i)] for i in range(3)]
    prompts.append(prompts[2])     # a repeated prompt: its blocks come from the prefix cache
    params = [greedy(n) for n in (6, 4, 10, 4)]
    knobs = dict(kv_cache_dtype="fp8", max_num_seqs=3, max_model_len=64, num_kv_blocks=4,
                 enable_prefix_caching=True, device=DEVICE)
    assert resolve_backend("auto", "cpu", "float32", "fp8") == "torch"
    expected = LLM(tiny_llama, attention="torch", **knobs).generate(prompts, params,
                                                                   use_tqdm=False)
    llm = LLM(tiny_llama, attention="triton", **knobs)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    engine = llm.llm_engine
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to preempt"
    assert engine.kv.prefix_stats().hit_tokens > 0
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked"

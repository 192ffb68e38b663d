"""The Triton kernels against their torch references.

Without CUDA the kernels run in Triton's interpreter on CPU tensors (float32), which Triton
decides when the kernels are defined, hence the environment variable before any import.
The interpreter is slow, so the grid below is a chosen set of combinations rather than a full
product: every head_dim, block_size and GQA ratio appears, and every batch shape runs once per
combination. GPU tests (float16 / bfloat16 against a float64 reference) need real kernels:
run them without TRITON_INTERPRET, e.g. ``pytest tests/minicb_kernels/test_kernels.py -m gpu``.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math  # noqa: E402
import zlib  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from minicb.kernels import (  # noqa: E402
    choose_num_splits,
    paged_attention,
    paged_attention_reference,
    write_kv,
    write_kv_reference,
)
from minicb.kernels.split_kv import MAX_SPLITS, MIN_KEYS_PER_SPLIT  # noqa: E402

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
_needs_compiled_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or INTERPRETING,
    reason="needs CUDA and compiled kernels (run without TRITON_INTERPRET)",
)


def gpu(test):
    """Marks a test `gpu` (so ``-m gpu`` selects it) and skips it without CUDA or under the
    interpreter."""
    return pytest.mark.gpu(_needs_compiled_cuda(test))


DEVICE = "cpu" if INTERPRETING or not torch.cuda.is_available() else "cuda"

# (head_dim, block_size, gqa group, num_kv_heads): every head_dim x block_size pair, and every
# GQA ratio twice.
CONFIGS = [
    (64, 16, 1, 2), (128, 32, 2, 1), (64, 32, 4, 2), (128, 16, 8, 1),
    (64, 32, 8, 1), (128, 16, 1, 2), (64, 16, 2, 2), (128, 32, 4, 1),
]
LONG = 300


def lengths_for(block_size: int) -> list[int]:
    """The context lengths that sit on and around block boundaries, plus a long one."""
    return [1, block_size - 1, block_size, block_size + 1, LONG]


def seed_of(*params) -> int:
    return zlib.crc32(repr(params).encode())


@dataclass
class Batch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    def args(self) -> tuple:
        head_dim = self.q.shape[-1]
        return (self.q, self.k_cache, self.v_cache, self.cu_seqlens_q, self.seq_lens,
                self.block_tables, head_dim**-0.5, self.max_seqlen_q, self.max_seqlen_k)


def make_batch(q_lens, seq_lens, head_dim, block_size, group, num_kv_heads, seed,
               dtype=torch.float32, device=DEVICE) -> Batch:
    """Random queries and a random cache; each request's blocks are scattered over the pool."""
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(max(n, 1) / block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3  # spare blocks hold values no request may read
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(needed), dtype=torch.int32)
    for i, n in enumerate(needed):
        tables[i, :n] = torch.tensor(pool[:n], dtype=torch.int32)
        pool = pool[n:]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return Batch(
        q=torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen).to(device, dtype),
        k_cache=torch.randn(shape, generator=gen).to(device, dtype),
        v_cache=torch.randn(shape, generator=gen).to(device, dtype),
        cu_seqlens_q=cu.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        max_seqlen_q=max(q_lens),
        max_seqlen_k=max(seq_lens),
    )


def batch_shapes(block_size: int) -> dict[str, tuple[list[int], list[int]]]:
    """(q_lens, seq_lens) per kind of step."""
    bs = block_size
    return {
        # every decode length around the block edges
        "decode": ([1] * 5, lengths_for(bs)),
        # fresh prompts: a long one spans several query tiles, causal inside itself
        "prefill": ([LONG, bs + 1, 1], [LONG, bs + 1, bs]),
        # chunk on top of a long cached context, a fresh prefill, a chunk crossing a block, decodes
        "mixed": ([20, bs + 1, bs - 1, 1, 1], [LONG, bs + 1, 2 * bs - 1, bs, 1]),
        # static batching: prompts left-padded to one length; padding rows have no keys of their own
        "left_padded": ([bs + 1] * 3, [3, bs - 1, bs + 1]),
    }


def wide_table_meta(batch: Batch, extra: int):
    """The batch as AttentionMetadata, its block tables `extra` entries wider than the keys need (as
    the contiguous KV manager makes them), the extra entries naming a spare block no row may
    read."""
    from minicb.model.attention import AttentionMetadata

    spare = batch.k_cache.shape[0] - 1
    tables = batch.block_tables.cpu()
    wide = torch.cat([tables, torch.full((len(tables), extra), spare, dtype=torch.int32)], dim=1)
    return AttentionMetadata(slot_mapping=torch.full((len(batch.q),), -1),
                             cu_seqlens_q=batch.cu_seqlens_q, seq_lens=batch.seq_lens,
                             block_tables=wide, max_seqlen_q=batch.max_seqlen_q,
                             max_seqlen_k=batch.max_seqlen_k)


def run_and_check(batch: Batch, num_splits, atol=1e-4, rtol=1e-4) -> None:
    out = torch.full_like(batch.q, float("nan"))  # an element the kernel skips stays NaN
    result = paged_attention(*batch.args(), out=out, num_splits=num_splits)
    assert result is out
    expected = paged_attention_reference(*batch.args())
    assert torch.isfinite(result).all(), "some output elements were never written"
    torch.testing.assert_close(result, expected, atol=atol, rtol=rtol)


CASES = [
    pytest.param(config, kind, splits,
                 id=f"d{config[0]}-bs{config[1]}-g{config[2]}-{kind}-split{splits}")
    for config in CONFIGS
    for kind, splits in [("decode", 1), ("decode", 3), ("prefill", 1), ("mixed", 1),
                         ("left_padded", 1)]
] + [
    # forcing splits also works on prefill chunks (the automatic choice only splits decodes)
    pytest.param(CONFIGS[1], "mixed", 2, id="d128-bs32-g2-mixed-split2"),
    pytest.param(CONFIGS[3], "decode", 8, id="d128-bs16-g8-decode-split8"),
    # a GQA ratio and head_dim that are not powers of two (padded and masked inside the kernel)
    pytest.param((96, 16, 3, 1), "mixed", 1, id="d96-bs16-g3-mixed-split1"),
    pytest.param((96, 16, 3, 1), "decode", 3, id="d96-bs16-g3-decode-split3"),
]


@pytest.mark.parametrize("config, kind, num_splits", CASES)
def test_paged_attention_matches_reference(config, kind, num_splits):
    head_dim, block_size, group, num_kv_heads = config
    q_lens, seq_lens = batch_shapes(block_size)[kind]
    batch = make_batch(q_lens, seq_lens, head_dim, block_size, group, num_kv_heads,
                       seed=seed_of(config, kind, num_splits))
    run_and_check(batch, num_splits)


def test_automatic_splits_and_fresh_output():
    batch = make_batch([1, 1], [LONG, 5], 64, 16, 2, 1, seed=seed_of("auto"))
    result = paged_attention(*batch.args())  # out=None allocates, num_splits=None chooses
    torch.testing.assert_close(result, paged_attention_reference(*batch.args()), atol=1e-4,
                               rtol=1e-4)


def test_write_then_attend_matches_dense_causal_attention():
    """Two requests through chunked prefill and decodes, as the engine drives the kernels:
    write_kv through slot_mapping, then attention; checked against dense causal attention."""
    head_dim, block_size, group, num_kv_heads = 64, 16, 2, 2
    gen = torch.Generator().manual_seed(seed_of("engine"))
    total = [40, 23]  # final lengths
    steps = [[24, 17], [14, 1], [1, 4], [1, 1]]  # tokens per request per step (sums to `total`)
    k_all = [torch.randn(n, num_kv_heads, head_dim, generator=gen) for n in total]
    v_all = [torch.randn(n, num_kv_heads, head_dim, generator=gen) for n in total]
    q_all = [torch.randn(n, num_kv_heads * group, head_dim, generator=gen) for n in total]
    num_blocks = 8
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"),
                         device=DEVICE)
    v_cache = k_cache.clone()
    tables = torch.tensor([[5, 0, 6], [2, 7, 0]], dtype=torch.int32)  # request 1 uses 2 blocks
    done = [0, 0]
    for step in steps:
        rows = [range(done[i], done[i] + n) for i, n in enumerate(step)]
        slots = [int(tables[i, p // block_size]) * block_size + p % block_size
                 for i, r in enumerate(rows) for p in r]
        k, v, q = (torch.cat([xs[i][r.start : r.stop] for i, r in enumerate(rows)])
                   for xs in (k_all, v_all, q_all))
        k, v, q = k.to(DEVICE), v.to(DEVICE), q.to(DEVICE)
        write_kv(k, v, k_cache, v_cache, torch.tensor(slots, device=DEVICE))
        done = [d + n for d, n in zip(done, step)]
        cu = torch.tensor([0, step[0], sum(step)], dtype=torch.int32)
        out = paged_attention(q, k_cache, v_cache, cu.to(DEVICE),
                              torch.tensor(done, dtype=torch.int32, device=DEVICE),
                              tables.to(DEVICE), head_dim**-0.5, max(step), max(done)).cpu()
        for i, r in enumerate(rows):
            # Dense attention over everything up to this step, keeping this step's query rows.
            qi = q_all[i][: r.stop].transpose(0, 1)
            ki = k_all[i][: r.stop].repeat_interleave(group, 1).transpose(0, 1)
            vi = v_all[i][: r.stop].repeat_interleave(group, 1).transpose(0, 1)
            dense = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=True)
            got = out[cu[i] : cu[i + 1]]
            torch.testing.assert_close(got, dense.transpose(0, 1)[r.start : r.stop], atol=1e-4,
                                       rtol=1e-4)


@pytest.mark.parametrize("config", CONFIGS[:4], ids=lambda c: f"d{c[0]}-bs{c[1]}-g{c[2]}")
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed", "left_padded"])
def test_torch_backend_matches_reference(config, kind):
    """The torch backend (whole-block gather, index tensors built once per step) on the same
    batches,
    with block tables wider than the keys need (as the contiguous KV manager makes them), called as
    every layer calls it: twice on one metadata object."""
    from minicb.model.attention import paged_attention_torch

    head_dim, block_size, group, num_kv_heads = config
    q_lens, seq_lens = batch_shapes(block_size)[kind]
    batch = make_batch(q_lens, seq_lens, head_dim, block_size, group, num_kv_heads,
                       seed=seed_of("torch", config, kind), device="cpu")
    meta = wide_table_meta(batch, extra=2)
    expected = paged_attention_reference(*batch.args())
    scale = head_dim**-0.5
    first = paged_attention_torch(batch.q, batch.k_cache, batch.v_cache, meta, scale)
    again = paged_attention_torch(batch.q, batch.k_cache, batch.v_cache, meta, scale)
    torch.testing.assert_close(first, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, first, atol=0, rtol=0)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"d{c[0]}-bs{c[1]}-kv{c[3]}")
def test_write_kv_matches_reference_and_skips_padding(config):
    head_dim, block_size, _, num_kv_heads = config
    gen = torch.Generator().manual_seed(seed_of("write", config))
    num_blocks = 6
    num_slots = num_blocks * block_size
    num_tokens = block_size + 3  # crosses a block boundary
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[[0, 1, 5]] = -1  # left padding and a padding token in the middle
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    poisoned = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    k_cache, v_cache = poisoned.clone().to(DEVICE), poisoned.clone().to(DEVICE)
    k_want, v_want = poisoned.clone(), poisoned.clone()

    write_kv(k.to(DEVICE), v.to(DEVICE), k_cache, v_cache, slots.to(DEVICE))
    write_kv_reference(k, v, k_want, v_want, slots)
    k_cache, v_cache = k_cache.cpu(), v_cache.cpu()

    torch.testing.assert_close(k_cache, k_want, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_want, atol=0, rtol=0, equal_nan=True)
    written = torch.zeros(num_slots, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    flat_k = k_cache.view(num_slots, -1)
    assert torch.isfinite(flat_k[written]).all()
    assert torch.isnan(flat_k[~written]).all(), "a slot outside slot_mapping was written"
    torch.testing.assert_close(flat_k[slots[2]], k[2].flatten(), atol=0, rtol=0)


def test_write_kv_rejects_bad_arguments():
    k = torch.randn(3, 1, 64)
    cache = torch.zeros(2, 16, 1, 64)
    with pytest.raises(ValueError, match="int64"):
        write_kv(k, k, cache, cache.clone(), torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="num_kv_heads"):
        write_kv(torch.randn(3, 2, 64), torch.randn(3, 2, 64), cache, cache.clone(),
                 torch.arange(3))


def test_paged_attention_rejects_bad_arguments():
    batch = make_batch([1], [5], 64, 16, 2, 1, seed=0)
    with pytest.raises(ValueError, match="int32"):
        paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                        batch.seq_lens.long(), batch.block_tables, 0.125, 1, 5)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention(torch.randn(1, 3, 64), batch.k_cache.expand(-1, -1, 2, -1).contiguous(),
                        batch.v_cache.expand(-1, -1, 2, -1).contiguous(), batch.cu_seqlens_q,
                        batch.seq_lens, batch.block_tables, 0.125, 1, 5)
    with pytest.raises(ValueError, match="num_splits"):
        paged_attention(*batch.args(), num_splits=0)


def test_choose_num_splits_examples():
    assert choose_num_splits(1, 8, 32768, 132) == 33  # one long request: fill the GPU
    assert choose_num_splits(256, 8, 32768, 132) == 1  # a big batch already fills it
    assert choose_num_splits(1, 8, 300, 132) == 2  # short contexts: no split under 256 keys
    assert choose_num_splits(1, 1, 1, 132) == 1


@given(
    num_seqs=st.integers(1, 512),
    num_kv_heads=st.integers(1, 16),
    max_seqlen_k=st.integers(0, 200_000),
    num_sms=st.integers(1, 200),
)
def test_choose_num_splits_bounds(num_seqs, num_kv_heads, max_seqlen_k, num_sms):
    splits = choose_num_splits(num_seqs, num_kv_heads, max_seqlen_k, num_sms)
    assert 1 <= splits <= MAX_SPLITS
    assert splits <= max(1, math.ceil(max_seqlen_k / MIN_KEYS_PER_SPLIT))
    if num_seqs * num_kv_heads >= 2 * num_sms:
        assert splits == 1


# ---------------------------------------------------------------- GPU: real kernels, half types

HALF_TOLERANCES = {torch.float16: dict(atol=4e-3, rtol=4e-3),
                   torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def as_float64(batch: Batch) -> Batch:
    return Batch(**{**batch.__dict__, "q": batch.q.double(), "k_cache": batch.k_cache.double(),
                    "v_cache": batch.v_cache.double()})


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"d{c[0]}-bs{c[1]}-g{c[2]}")
@pytest.mark.parametrize("kind, num_splits", [("decode", 1), ("decode", 4), ("decode", None),
                                              ("mixed", 1), ("mixed", None), ("left_padded", 1)])
def test_paged_attention_half_precision_on_gpu(dtype, config, kind, num_splits):
    head_dim, block_size, group, num_kv_heads = config
    q_lens, seq_lens = batch_shapes(block_size)[kind]
    batch = make_batch(q_lens, seq_lens, head_dim, block_size, group, num_kv_heads,
                       seed=seed_of(config, kind, dtype), dtype=dtype, device="cuda")
    out = torch.full_like(batch.q, float("nan"))
    paged_attention(*batch.args(), out=out, num_splits=num_splits)
    expected = paged_attention_reference(*as_float64(batch).args())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, **HALF_TOLERANCES[dtype])


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_long_decode_batch_on_gpu(dtype):
    """Llama-3-8B-shaped heads (32 query / 8 KV, head_dim 128), long mixed-length contexts."""
    seq_lens = [4096, 1, 3000, 17, 8191]
    batch = make_batch([1] * 5, seq_lens, 128, 16, 4, 8, seed=seed_of("long", dtype), dtype=dtype,
                       device="cuda")
    expected = paged_attention_reference(*as_float64(batch).args())
    for num_splits in (1, None, 16):
        out = paged_attention(*batch.args(), num_splits=num_splits)
        torch.testing.assert_close(out.double(), expected, **HALF_TOLERANCES[dtype])


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_write_kv_half_precision_on_gpu(dtype):
    k = torch.randn(100, 8, 128, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    slots = torch.randperm(64 * 16, device="cuda")[:100]
    slots[:7] = -1
    caches = [torch.zeros(64, 16, 8, 128, device="cuda", dtype=dtype) for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots)
    write_kv_reference(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])

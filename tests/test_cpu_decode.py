"""The CPU kernels for small decode steps: the small-batch matrix product (kernels/cpu_linear.c)
against torch's, and the fused decoder layer (kernels/cpu_decode_layer.c) against the model's own
torch modules on the same weights, caches and batch; then the engine, which takes the fused path
on decode steps, against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from minicb.kernels import cpu
from reference import compare, hf_greedy

from minicb import LLM, SamplingParams
from minicb.model.attention import AttentionMetadata
from minicb.model.llama import Linear
from minicb.model.loader import load_model


# --- the small-batch matrix product ---------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 33, 70])
@pytest.mark.parametrize("out_features,in_features", [(256, 256), (13, 9), (1, 1), (6, 704),
                                                      (1408, 24)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_torch(rows, out_features, in_features, bias):
    """Every tile shape: 1-3 rows per tile and a remainder, weight rows not a multiple of 4 (the
    tile's width), inputs not a multiple of 8 (the vector's), with and without a bias."""
    gen = torch.Generator().manual_seed(rows * 1000 + out_features + in_features)
    x = torch.randn(rows, in_features, generator=gen)
    weight = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if bias else None
    torch.testing.assert_close(cpu.linear_cpu(x, weight, b), F.linear(x, weight, b),
                               atol=1e-4, rtol=1e-4)


def test_linear_of_no_rows_is_empty():
    assert cpu.linear_cpu(torch.empty(0, 8), torch.randn(5, 8)).shape == (0, 5)


def test_linear_rejects_what_it_cannot_multiply():
    weight = torch.randn(4, 8)
    with pytest.raises(ValueError, match="float32.*use torch.nn.functional.linear"):
        cpu.linear_cpu(torch.randn(2, 8, dtype=torch.float64), weight)
    with pytest.raises(ValueError, match="do not multiply"):
        cpu.linear_cpu(torch.randn(2, 7), weight)
    with pytest.raises(ValueError, match="contiguous"):
        cpu.linear_cpu(torch.randn(8, 2).t(), weight)
    with pytest.raises(ValueError, match=r"bias \(3,\) must be \[4\]"):
        cpu.linear_cpu(torch.randn(2, 8), weight, torch.randn(3))


def test_the_module_sends_small_batches_to_the_kernel_and_big_ones_to_torch(monkeypatch):
    calls = []
    layer = Linear(8, 4)
    layer.kernel = lambda x, w, b: calls.append(x.shape[0]) or F.linear(x, w, b)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    small, big = Linear.rows_per_thread * 2, Linear.rows_per_thread * 2 + 1
    with torch.inference_mode():
        layer(torch.randn(1, 8)), layer(torch.randn(small, 8)), layer(torch.randn(big, 8))
    assert calls == [1, small]


# --- the fused decoder layer ---------------------------------------------------------------------
def decode_step(model, seq_lens, block_size=16, seed=0, unwritten_row=None):
    """A step of decodes: one new token per request at position seq_len - 1, each request's blocks
    scattered over a pool of random keys and values; returns the forward's arguments."""
    args = model.args
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 2
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(needed) + 1, dtype=torch.int32)
    slots = []
    for i, (n, blocks) in enumerate(zip(seq_lens, needed)):
        tables[i, :blocks] = torch.tensor(pool[:blocks], dtype=torch.int32)
        pool = pool[blocks:]
        slots.append(int(tables[i, (n - 1) // block_size]) * block_size + (n - 1) % block_size)
    if unwritten_row is not None:
        slots[unwritten_row] = -1          # a padding row: its k and v are not written
    shape = (num_blocks, block_size, args.num_kv_heads, args.head_dim)
    caches = [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
              for _ in range(args.num_layers)]
    rows = len(seq_lens)

    def meta():
        return AttentionMetadata(slot_mapping=torch.tensor(slots),
                                 cu_seqlens_q=torch.arange(rows + 1, dtype=torch.int32),
                                 seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                                 block_tables=tables, max_seqlen_q=1, max_seqlen_k=max(seq_lens))

    ids = torch.randint(3, args.vocab_size, (rows,), generator=gen)
    positions = torch.tensor(seq_lens) - 1
    return ids, positions, caches, meta


@pytest.mark.parametrize("seq_lens", [[1], [17], [5, 16, 33, 1, 64, 2], list(range(1, 40, 3))],
                         ids=["first-token", "one-row", "block-edges", "thirteen-rows"])
def test_fused_layer_equals_the_torch_modules(tiny_model, seq_lens, monkeypatch):
    """Hidden states and the KV written: grouped-query attention with 2 and 4 query heads per KV
    head, q/k/v biases (Qwen2), head_dim 16 (the kernel's generic loop)."""
    model = load_model(Path(tiny_model), attention="cpu")
    assert model.model.fused_decode is not None
    ids, positions, caches, meta = decode_step(model, seq_lens, unwritten_row=len(seq_lens) // 2)
    modules_caches = [(k.clone(), v.clone()) for k, v in caches]
    calls = []
    real = cpu.decode_layer_cpu
    monkeypatch.setattr(cpu, "decode_layer_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.inference_mode():
        fused = model.model(ids, positions, caches, meta())
        model.use_cpu_kernels(False)
        reference = model.model(ids, positions, modules_caches, meta())
    assert len(calls) == model.args.num_layers, "the step did not take the fused path"
    torch.testing.assert_close(fused, reference, atol=1e-4, rtol=1e-4)
    for (k, v), (k_ref, v_ref) in zip(caches, modules_caches):
        torch.testing.assert_close(k, k_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v_ref, atol=1e-5, rtol=1e-5)


def test_steps_with_a_prompt_or_many_rows_take_the_modules(tiny_llama, monkeypatch):
    model = load_model(Path(tiny_llama), attention="cpu")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    x = torch.zeros(3, model.args.hidden_size)
    meta = AttentionMetadata(slot_mapping=torch.arange(3), cu_seqlens_q=torch.tensor(
        [0, 2, 3], dtype=torch.int32), seq_lens=torch.tensor([2, 1], dtype=torch.int32),
        block_tables=torch.zeros(2, 1, dtype=torch.int32), max_seqlen_q=2, max_seqlen_k=2)
    assert not model.model.decodes_only(x, meta)        # a two-token prompt in the step
    many = Linear.rows_per_thread + 1
    meta = AttentionMetadata(slot_mapping=torch.arange(many),
                             cu_seqlens_q=torch.arange(many + 1, dtype=torch.int32),
                             seq_lens=torch.ones(many, dtype=torch.int32),
                             block_tables=torch.zeros(many, 1, dtype=torch.int32),
                             max_seqlen_q=1, max_seqlen_k=1)
    assert not model.model.decodes_only(torch.zeros(many, model.args.hidden_size), meta)
    fits = AttentionMetadata(slot_mapping=torch.arange(many - 1),
                             cu_seqlens_q=torch.arange(many, dtype=torch.int32),
                             seq_lens=torch.ones(many - 1, dtype=torch.int32),
                             block_tables=torch.zeros(many - 1, 1, dtype=torch.int32),
                             max_seqlen_q=1, max_seqlen_k=1)
    assert model.model.decodes_only(torch.zeros(many - 1, model.args.hidden_size), fits)


def test_the_fused_layer_refuses_weights_it_cannot_read(tiny_llama):
    model = load_model(Path(tiny_llama), attention="cpu")
    layer = model.model.layers[0]
    layer.mlp.down_proj.weight = torch.nn.Parameter(layer.mlp.down_proj.weight.double(),
                                                    requires_grad=False)
    with pytest.raises(ValueError, match="contiguous float32 weights.*down is torch.float64"):
        model.use_cpu_kernels()
    layer.self_attn.qkv_proj = None
    with pytest.raises(ValueError, match="fuse_projections"):
        layer.cpu_weights()


def test_a_table_outside_the_pool_is_an_error_not_a_wild_read(tiny_llama):
    model = load_model(Path(tiny_llama), attention="cpu")
    ids, positions, caches, meta = decode_step(model, [20, 3])
    bad = meta()
    bad.block_tables[0, 1] = caches[0][0].shape[0] + 5
    with torch.inference_mode(), pytest.raises(ValueError, match="outside the KV pool"):
        model.model(ids, positions, caches, bad)


def test_engine_on_the_fused_path_equals_transformers(tiny_model, monkeypatch):
    """Whole requests through the engine (prompts through the modules, decode steps fused) give
    transformers' greedy tokens."""
    prompts = [[3 + (7 * i + j) % 500 for j in range(5 + 9 * i)] for i in range(6)]
    max_tokens = [40, 3, 25, 40, 12, 33]
    references = hf_greedy(tiny_model, prompts, max_tokens)
    calls = []
    real = cpu.decode_layer_cpu
    monkeypatch.setattr(cpu, "decode_layer_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    llm = LLM(tiny_model, scheduler="continuous", kv_cache="paged", attention="cpu",
              max_num_seqs=4, block_size=16)
    outputs = llm.generate(prompts, [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                                     for n in max_tokens], use_tqdm=False)
    assert calls, "no decode step took the fused layer"
    verdicts = [compare(ref, out.outputs[0].token_ids, out.outputs[0].logprobs, f"request {i}")
                for i, (ref, out) in enumerate(zip(references, outputs))]
    assert verdicts.count("equal") >= len(prompts) - 1, verdicts

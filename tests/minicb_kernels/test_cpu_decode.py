"""The CPU kernels for small decode steps: the small-batch matrix product (kernels/cpu_linear.c)
against torch's, and the fused decoder layer (kernels/cpu_decode_layer.c, run by
minicb.model.fused_cpu) against the model's own torch modules on the same weights, caches and
batch; then the engine, whose runner takes the fused path on decode steps, against transformers;
and the teaching model, which holds none of this."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from minicb.kernels import cpu
from reference import check_all, hf_greedy

from minicb import LLM, SamplingParams
from minicb.model.attention import AttentionMetadata
from minicb.model.fused_cpu import (
    FusedCpuDecoder,
    SmallBatchLinear,
    layer_weights,
    use_small_batch_linear,
)
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


@pytest.mark.parametrize("threads", [1, 2, 16])
def test_the_module_sends_small_batches_to_the_kernel_and_big_ones_to_torch(threads, monkeypatch):
    """Which product runs depends on the rows alone: the thread policy changes the thread count
    with the machine's load, and that must never change the arithmetic."""
    calls = []
    layer = SmallBatchLinear(8, 4)
    monkeypatch.setattr(cpu, "linear_cpu",
                        lambda x, w, b: calls.append(x.shape[0]) or F.linear(x, w, b))
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    small, big = SmallBatchLinear.kernel_rows, SmallBatchLinear.kernel_rows + 1
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
                                 block_tables=tables, max_seqlen_q=1, max_seqlen_k=max(seq_lens),
                                 num_decode_rows=rows)

    ids = torch.randint(3, args.vocab_size, (rows,), generator=gen)
    positions = torch.tensor(seq_lens) - 1
    return ids, positions, caches, meta


@pytest.mark.parametrize("seq_lens", [[1], [17], [5, 16, 33, 1, 64, 2], list(range(1, 40, 3))],
                         ids=["first-token", "one-row", "block-edges", "thirteen-rows"])
def test_fused_layer_equals_the_torch_modules(any_tiny_model, seq_lens, monkeypatch):
    """Hidden states and the KV written: grouped-query attention with 2 and 4 query heads per KV
    head, q/k/v biases (Qwen2), q/k/v/o and MLP biases (Llama's attention_bias and mlp_bias),
    per-head q/k norms and head_dim 32 (Qwen3), head_dim 16 (the kernel's generic loop)."""
    model = load_model(Path(any_tiny_model), attention="cpu")
    decoder = FusedCpuDecoder(model)
    ids, positions, caches, meta = decode_step(model, seq_lens, unwritten_row=len(seq_lens) // 2)
    modules_caches = [(k.clone(), v.clone()) for k, v in caches]
    every_row = torch.arange(len(seq_lens))
    calls = []
    real = cpu.decode_layer_cpu
    monkeypatch.setattr(cpu, "decode_layer_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert decoder.takes(len(seq_lens), meta())
    fused = decoder(ids, positions, caches, meta(), every_row)
    use_small_batch_linear(model, False)
    reference = model(ids, positions, modules_caches, meta(), every_row)
    assert len(calls) == model.args.num_layers, "the step did not take the fused path"
    torch.testing.assert_close(fused, reference, atol=1e-4, rtol=1e-4)
    for (k, v), (k_ref, v_ref) in zip(caches, modules_caches):
        torch.testing.assert_close(k, k_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v_ref, atol=1e-5, rtol=1e-5)


def _decode_meta(rows: int, num_decode_rows: int) -> AttentionMetadata:
    return AttentionMetadata(slot_mapping=torch.arange(rows),
                             cu_seqlens_q=torch.arange(rows + 1, dtype=torch.int32),
                             seq_lens=torch.ones(rows, dtype=torch.int32),
                             block_tables=torch.zeros(rows, 1, dtype=torch.int32),
                             max_seqlen_q=1, max_seqlen_k=1, num_decode_rows=num_decode_rows)


@pytest.mark.parametrize("threads", [1, 2, 16])
def test_the_plan_and_the_row_count_choose_the_path_never_the_threads(tiny_llama, threads,
                                                                      monkeypatch):
    decoder = FusedCpuDecoder(load_model(Path(tiny_llama), attention="cpu"))
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    prompt = AttentionMetadata(slot_mapping=torch.arange(3), cu_seqlens_q=torch.tensor(
        [0, 2, 3], dtype=torch.int32), seq_lens=torch.tensor([2, 1], dtype=torch.int32),
        block_tables=torch.zeros(2, 1, dtype=torch.int32), max_seqlen_q=2, max_seqlen_k=2,
        num_decode_rows=1)
    assert not decoder.takes(3, prompt)   # a two-token prompt
    most = SmallBatchLinear.kernel_rows
    assert decoder.takes(most, _decode_meta(most, most))
    assert not decoder.takes(most + 1, _decode_meta(most + 1, most + 1))
    # one query per row, but the plan counts one row as no decode (a prefill's last token): the
    # plan decides, not the shape
    assert not decoder.takes(4, _decode_meta(4, 3))
    # the engine's own limit, fixed when it starts; 0 never fuses
    assert not FusedCpuDecoder(decoder.model, max_rows=3).takes(4, _decode_meta(4, 4))
    assert not FusedCpuDecoder(decoder.model, max_rows=0).takes(1, _decode_meta(1, 1))


def test_a_plan_of_decodes_with_more_tokens_than_rows_is_an_error(tiny_llama):
    decoder = FusedCpuDecoder(load_model(Path(tiny_llama), attention="cpu"))
    meta = AttentionMetadata(slot_mapping=torch.arange(3), cu_seqlens_q=torch.tensor(
        [0, 2, 3], dtype=torch.int32), seq_lens=torch.tensor([2, 1], dtype=torch.int32),
        block_tables=torch.zeros(2, 1, dtype=torch.int32), max_seqlen_q=2, max_seqlen_k=2,
        num_decode_rows=2)
    with pytest.raises(ValueError, match="marks all 2 rows as decodes, but the step has 3 tokens"):
        decoder.takes(3, meta)


def test_the_fused_layer_refuses_weights_it_cannot_read(tiny_llama):
    model = load_model(Path(tiny_llama), attention="cpu")
    layer = model.model.layers[0]
    layer.mlp.down_proj.weight = torch.nn.Parameter(layer.mlp.down_proj.weight.double(),
                                                    requires_grad=False)
    with pytest.raises(ValueError, match="matrices share one format.*torch.float64"):
        FusedCpuDecoder(model)
    layer.self_attn.qkv_proj = None
    with pytest.raises(ValueError, match="fuse_projections"):
        layer_weights(layer)


@pytest.mark.parametrize("where", ["self_attn", "mlp", "layer"])
def test_the_fused_layer_refuses_a_tensor_it_has_no_slot_for(tiny_llama, where):
    """A part the fused layer does not know (here a made-up scale) is refused by name, never
    skipped: the layer would compute without it."""
    model = load_model(Path(tiny_llama), attention="cpu")
    layer = model.model.layers[1]
    owner = layer if where == "layer" else getattr(layer, where)
    owner.register_parameter("extra_scale", torch.nn.Parameter(torch.ones(4)))
    name = "extra_scale" if where == "layer" else f"{where}.extra_scale"
    with pytest.raises(ValueError, match=f"no slot for the layer's {name}"):
        FusedCpuDecoder(model)


def test_a_separate_projection_that_is_no_view_of_the_fused_one_is_refused(tiny_llama):
    model = load_model(Path(tiny_llama), attention="cpu")
    attn = model.model.layers[0].self_attn
    attn.k_proj.weight = torch.nn.Parameter(attn.k_proj.weight.clone(), requires_grad=False)
    with pytest.raises(ValueError, match="k_proj.weight is no longer a view of"):
        FusedCpuDecoder(model)


def test_a_table_outside_the_pool_is_an_error_not_a_wild_read(tiny_llama):
    model = load_model(Path(tiny_llama), attention="cpu")
    ids, positions, caches, meta = decode_step(model, [20, 3])
    bad = meta()
    bad.block_tables[0, 1] = caches[0][0].shape[0] + 5
    with pytest.raises(ValueError, match="outside the KV pool"):
        FusedCpuDecoder(model)(ids, positions, caches, bad, torch.arange(2))


def test_engine_on_the_fused_path_equals_transformers(any_tiny_model, monkeypatch):
    """Whole requests through the engine (prompts through the modules, decode steps fused) give
    transformers' greedy tokens."""
    prompts = [[3 + (7 * i + j) % 500 for j in range(5 + 9 * i)] for i in range(6)]
    max_tokens = [40, 3, 25, 40, 12, 33]
    references = hf_greedy(any_tiny_model, prompts, max_tokens)
    calls = []
    real = cpu.decode_layer_cpu
    monkeypatch.setattr(cpu, "decode_layer_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    llm = LLM(any_tiny_model, scheduler="continuous", kv_cache="paged", attention="cpu",
              max_num_seqs=4, block_size=16)
    outputs = llm.generate(prompts, [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                                     for n in max_tokens], use_tqdm=False)
    assert calls, "no decode step took the fused layer"
    verdicts = check_all(references, outputs)
    assert verdicts.count("equal") >= len(prompts) - 1, verdicts


def test_the_teaching_model_holds_no_c_kernel_code():
    """minicb/model/llama.py is the model a reader learns from: torch alone. The CPU fast path
    (ctypes, the C kernels, their weight slots) lives in minicb/model/fused_cpu.py, and the runner
    chooses it."""
    import ast

    import minicb.model.llama as llama

    source = Path(llama.__file__).read_text()
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    # the mixture-of-experts block is torch too (its fused path's reference, no C)
    assert imported <= {"__future__", "dataclasses", "torch", "torch.nn.functional", "torch.nn",
                        "minicb.model.attention", "minicb.model.moe"}, imported
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {node.name for node in ast.walk(tree)
              if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    kernel_names = {n for n in names if any(w in n.lower() for w in ("cpu", "kernel", "ctypes",
                                                                      "fused_decode"))}
    assert not kernel_names, f"the teaching model names C-kernel code: {kernel_names}"
    assert "ctypes" not in source and "minicb.kernels" not in source

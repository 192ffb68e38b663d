"""CUDA graphs for decode steps (minicb/model/cuda_graphs.py): the ladder, the padding, the static
buffers and the memory estimate on every machine through the path replayed without capture;
captured graphs against eager steps on a GPU (make test-gpu)."""

from __future__ import annotations

import os
import random
from dataclasses import fields

import pytest
import torch

from minicb import LLM, SamplingParams
from minicb.config import EngineConfig
from minicb.model.attention import AttentionMetadata
from minicb.model.cuda_graphs import (
    DecodeGraphs,
    capture_sizes,
    graph_memory_bytes,
    padded_size,
    uses_cuda_graphs,
)
from minicb.runner.model_runner import check_kv_fits

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
GREEDY = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (9, 4, 12, 7, 10)]


def prompts_for(vocab: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in (1, 6, 17, 33, 5)]


def tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("max_num_seqs, ladder", [
    (1, [1]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (20, [1, 2, 4, 8, 16, 20]),
    (64, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]),
    (100, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]),
])
def test_the_ladder_ends_at_max_num_seqs(max_num_seqs, ladder):
    assert capture_sizes(max_num_seqs) == ladder


def test_each_batch_gets_the_smallest_size_that_holds_it():
    sizes = capture_sizes(256)
    assert sizes[-1] == 256 and sizes == sorted(set(sizes))
    for rows, size in [(1, 1), (3, 4), (5, 8), (9, 16), (63, 64), (65, 80), (250, 256)]:
        assert padded_size(sizes, rows) == size, rows
    assert padded_size(sizes, 257) is None     # beyond the ladder: the step runs eagerly
    with pytest.raises(ValueError, match="max_num_seqs"):
        capture_sizes(0)


def replaying(path: str, **knobs) -> LLM:
    """An engine whose decode steps go through the graph runner replayed without capture."""
    llm = LLM(path, **knobs)
    llm.llm_engine.runner.use_cuda_graphs(capture=False)
    return llm


def test_padding_rows_write_nothing_into_the_kv_cache(tiny_llama):
    """Three rows padded to four: exactly the three rows' slots change in every layer's K and V,
    and their logits equal an eager step's on the same cache (to float32 rounding)."""
    llm = replaying(tiny_llama, attention="torch", max_num_seqs=8, max_model_len=64)
    runner = llm.llm_engine.runner
    for k, v in runner.kv_caches:                  # cached keys to read, as after earlier steps
        k.normal_(), v.normal_()
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    block_tables = torch.tensor([[3, 1], [5, 0], [2, 6]], dtype=torch.int32)
    seq_lens, slots = [20, 3, 17], [1 * 16 + 3, 5 * 16 + 2, 6 * 16 + 0]
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots),
                             cu_seqlens_q=torch.arange(4, dtype=torch.int32),
                             seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                             block_tables=block_tables, max_seqlen_q=1, max_seqlen_k=20)
    input_ids, positions = torch.tensor([7, 8, 9]), torch.tensor([s - 1 for s in seq_lens])
    logits = runner.graphs.run(input_ids, positions, meta)
    assert runner.graphs.slot_mapping[3].item() == -1 and runner.graphs.seq_lens[3].item() == 1
    for (k, v), (k0, v0) in zip(runner.kv_caches, before):
        for new, old in ((k, k0), (v, v0)):
            changed = (new != old).flatten(2).any(-1).flatten().nonzero().flatten().tolist()
            assert changed == sorted(slots)
    after = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    for (k, v), (k0, v0) in zip(runner.kv_caches, before):
        k.copy_(k0), v.copy_(v0)
    eager = llm.llm_engine.model(input_ids, positions, runner.kv_caches, meta, torch.arange(3))
    # a batch of four rows may round differently from one of three (another BLAS blocking)
    torch.testing.assert_close(logits, eager, rtol=1e-5, atol=1e-5)
    for (k, v), (k1, v1) in zip(runner.kv_caches, after):     # the same K/V written
        torch.testing.assert_close(k, k1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, v1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ["torch", "auto"])
def test_replayed_steps_give_the_eager_tokens_on_the_shipped_model(attention):
    """'auto' is the C kernels on a CPU: the fused decode layer reads the padded buffers too."""
    eager = LLM(attention=attention, max_num_seqs=4, max_model_len=128)
    prompts = prompts_for(eager.llm_engine.vocab_size)
    expected = tokens(eager, prompts)
    llm = replaying(None, attention=attention, max_num_seqs=4, max_model_len=128)
    assert tokens(llm, prompts) == expected
    assert llm.llm_engine.runner.graphs.replays > 0


def test_replayed_steps_give_the_eager_tokens_on_random_configs(tiny_variant):
    knobs = dict(attention="torch", max_num_seqs=3, max_model_len=96)
    prompts = prompts_for(512, seed=11)
    llm = replaying(tiny_variant, **knobs)
    assert tokens(llm, prompts) == tokens(LLM(tiny_variant, **knobs), prompts)
    assert llm.llm_engine.runner.graphs.replays > 0


def test_prefill_and_mixed_steps_stay_eager(tiny_qwen2):
    """Only decode-only steps reach the graph runner: a step with a prompt chunk never does."""
    llm = replaying(tiny_qwen2, attention="torch", max_num_seqs=2, max_model_len=64)
    runner, seen = llm.llm_engine.runner, []
    run = runner.graphs.run
    runner.graphs.run = lambda ids, pos, meta: seen.append(meta.decodes_only) or run(ids, pos,
                                                                                       meta)
    tokens(llm, prompts_for(512)[:2], GREEDY[:2])
    assert seen and all(seen)


@pytest.mark.skipif(not torch.cuda.is_available() and not INTERPRETING,
                    reason="without CUDA, Triton runs only with TRITON_INTERPRET=1 (make test "
                           "sets it)")
def test_replayed_triton_steps_with_frozen_splits_give_the_eager_tokens(tiny_qwen2):
    """The Triton backend through the static buffers, its split count frozen per size as a
    capture freezes it (more than one split here), against eager Triton steps."""
    device = "cpu" if INTERPRETING else "cuda"
    knobs = dict(attention="triton", device=device, max_num_seqs=4, max_model_len=512,
                 enforce_eager=True)
    prompts = prompts_for(512, seed=5)[:4]
    params = GREEDY[:4]
    llm = replaying(tiny_qwen2, **knobs)
    assert max(llm.llm_engine.runner.graphs.num_splits.values()) > 1
    assert tokens(llm, prompts, params) == tokens(LLM(tiny_qwen2, **knobs), prompts, params)
    assert llm.llm_engine.runner.graphs.replays > 0


@pytest.mark.skipif("async_scheduling" not in {f.name for f in fields(EngineConfig)},
                    reason="overlapped scheduling (EngineConfig.async_scheduling) is not in this "
                           "build")
@pytest.mark.parametrize("attention", ["torch", "auto"])
def test_replayed_steps_with_overlapped_scheduling_give_the_synchronous_tokens(attention):
    """Overlapped scheduling fills a decode row's input id on the device from the step before;
    through the static buffers the tokens stay the synchronous eager engine's."""
    knobs = dict(attention=attention, max_num_seqs=4, max_model_len=128)
    eager = LLM(**knobs)
    prompts = prompts_for(eager.llm_engine.vocab_size, seed=17)
    llm = replaying(None, async_scheduling=True, **knobs)
    assert tokens(llm, prompts) == tokens(eager, prompts)
    assert llm.llm_engine.runner.graphs.replays > 0


class RecordedStep:
    """Stands in for a CUDA graph where there is none: capture runs the size's forward once with
    the metadata built at capture, and every replay runs it again with that same frozen metadata,
    writing into the tensor capture returned, as a graph replays its recorded launches on the
    same addresses. Only what the kernels read from tensors can change between replays."""

    def __init__(self, graphs: DecodeGraphs, size: int, meta: AttentionMetadata):
        self.forward = lambda: graphs._forward(size, meta)
        self.meta, self.output = meta, self.forward()

    def replay(self) -> None:
        with torch.inference_mode():
            self.output.copy_(self.forward())


@pytest.mark.skipif(not INTERPRETING, reason="the recorded stand-in runs Triton's interpreter "
                    "(on CUDA the real capture is tested below)")
def test_the_captured_path_with_frozen_metadata_gives_the_eager_tokens(tiny_llama, monkeypatch):
    """The capture path end to end without a GPU: capture over an all-padding batch leaves the
    KV cache untouched, each size's metadata is frozen at max_model_len with its split count, and
    replays driven only through the static buffers give the eager Triton engine's tokens."""
    def record(self, size, meta):
        step = RecordedStep(self, size, meta)
        return step, step.output

    monkeypatch.setattr(DecodeGraphs, "_capture", record)
    knobs = dict(attention="triton", device="cpu", max_num_seqs=4, max_model_len=512,
                 enforce_eager=True)
    prompts, params = prompts_for(512, seed=21)[:4], GREEDY[:4]
    llm = LLM(tiny_llama, **knobs)
    runner = llm.llm_engine.runner
    for k, v in runner.kv_caches:
        k.normal_(), v.normal_()
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    runner.use_cuda_graphs(capture=True)
    graphs = runner.graphs
    assert all(torch.equal(k, k0) and torch.equal(v, v0)
               for (k, v), (k0, v0) in zip(runner.kv_caches, before))
    assert sorted(graphs.graphs) == graphs.sizes == [1, 2, 4]
    for size, step in graphs.graphs.items():
        assert step.meta.max_seqlen_k == 512 and step.meta.num_splits == graphs.num_splits[size]
    assert tokens(llm, prompts, params) == tokens(LLM(tiny_llama, **knobs), prompts, params)
    assert graphs.replays > 0


def test_enforce_eager_turns_graphs_off_and_is_a_flag():
    cuda = EngineConfig(device="cuda", attention="triton", max_model_len=256).resolve(2048)
    assert uses_cuda_graphs(cuda)
    assert not uses_cuda_graphs(EngineConfig(device="cuda", attention="triton", max_model_len=256,
                                             enforce_eager=True).resolve(2048))
    assert not uses_cuda_graphs(EngineConfig(device="cuda", attention="torch").resolve(2048))
    assert not uses_cuda_graphs(EngineConfig().resolve(2048))     # a CPU: never captured
    assert LLM(max_model_len=64).llm_engine.runner.graphs is None
    import argparse

    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    assert parser.parse_args(["--enforce-eager"]).enforce_eager is True
    assert parser.parse_args([]).enforce_eager is False
    assert "enforce_eager" in {f.name for f in fields(EngineConfig)}
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(enforce_eager="yes")


def test_the_graphs_memory_is_counted_before_the_kv_pool(monkeypatch):
    """A pool that fits on its own is refused once the graphs' estimate is counted beside it,
    and the message names enforce_eager; the same pool with enforce_eager=True passes."""
    from minicb.model.llama import ModelArgs

    args = ModelArgs(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                     num_heads=14, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6,
                     rope_theta=1e6, max_position_embeddings=32768, tie_word_embeddings=True,
                     qkv_bias=True, mlp_bias=False)
    knobs = dict(device="cuda", attention="triton", dtype="bfloat16", max_num_seqs=256,
                 max_model_len=1024)
    graphs = EngineConfig(**knobs).resolve(32768)
    eager = EngineConfig(**knobs, enforce_eager=True).resolve(32768)
    estimate = graph_memory_bytes(args, graphs)
    assert graph_memory_bytes(args, eager) == 0
    # at least the largest size's logits in float32: a floor any honest estimate clears
    assert estimate > 256 * args.vocab_size * 4
    kv = 2 * args.num_layers * args.num_kv_heads * args.head_dim * 2 * graphs.num_kv_blocks * 16
    monkeypatch.setattr("minicb.runner.model_runner.free_memory",
                        lambda device: int(kv / 0.9) + estimate // 2)
    check_kv_fits(eager, args)
    with pytest.raises(ValueError, match="CUDA graphs.*enforce_eager=True"):
        check_kv_fits(graphs, args)


# --- on a GPU (make test-gpu) ---------------------------------------------------------------

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or INTERPRETING,
    reason="needs CUDA with compiled Triton (run: pytest -m gpu without TRITON_INTERPRET)")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("model", ["shipped", "tiny_llama"])
def test_captured_graphs_equal_eager_in_float32(model, request):
    path = None if model == "shipped" else request.getfixturevalue(model)
    knobs = dict(device="cuda", dtype="float32", attention="triton", max_num_seqs=16,
                 max_model_len=512)
    eager = LLM(path, enforce_eager=True, **knobs)
    prompts = prompts_for(eager.llm_engine.vocab_size, seed=9) * 3
    params = GREEDY * 3
    expected = tokens(eager, prompts, params)
    del eager
    llm = LLM(path, **knobs)
    graphs = llm.llm_engine.runner.graphs
    assert graphs is not None and graphs.capture and set(graphs.graphs) == set(graphs.sizes)
    assert tokens(llm, prompts, params) == expected
    assert graphs.replays > 0


@pytest.mark.gpu
@needs_cuda
def test_capture_stays_within_its_memory_estimate():
    """Captured by hand on an eager engine, so the free memory is read just around the capture
    (the Qwen2-0.5B shape, 256 rows: the benchmark's largest graphs)."""
    import tempfile
    from dataclasses import replace

    from minicb.bench.common import build_random_model

    path = build_random_model("qwen2-0.5b", tempfile.mkdtemp(prefix="minicb-graphs-"))
    llm = LLM(path, device="cuda", dtype="bfloat16", attention="triton", max_num_seqs=256,
              max_model_len=1024, enforce_eager=True)
    runner = llm.llm_engine.runner
    estimate = graph_memory_bytes(llm.llm_engine.model.args,
                                  replace(llm.llm_engine.config, enforce_eager=False))
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    runner.use_cuda_graphs(capture=True)
    torch.cuda.synchronize()
    used = free_before - torch.cuda.mem_get_info()[0]
    assert 0 < used <= estimate, f"capture took {used / 2**20:.0f} MiB, estimated " \
                                 f"{estimate / 2**20:.0f} MiB"


@pytest.mark.gpu
@needs_cuda
def test_graphs_with_overlapped_scheduling_equal_synchronous_steps(tiny_llama):
    if "async_scheduling" not in {f.name for f in fields(EngineConfig)}:
        pytest.skip("overlapped scheduling (EngineConfig.async_scheduling) is not in this build")
    knobs = dict(device="cuda", dtype="float32", attention="triton", max_num_seqs=8,
                 max_model_len=256)
    prompts = prompts_for(512, seed=13)
    expected = tokens(LLM(tiny_llama, enforce_eager=True, **knobs), prompts)
    llm = LLM(tiny_llama, async_scheduling=True, **knobs)
    assert tokens(llm, prompts) == expected
    assert llm.llm_engine.runner.graphs.replays > 0

"""The int8 paged KV cache (kv_cache_dtype="int8"): each (token, KV head) row holds head_dim int8
values and its float32 scale, inside its block. The engine's tokens equal the dequantize-then-
attend torch backend's and stay with transformers', and prefix caching, copy-on-write,
preemption, speculative rollback and overlapped steps keep working with no block lost."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference import check_all, greedy, hf_greedy

from minicb import LLM, SamplingParams
from minicb.config import EngineConfig
from minicb.model.loader import load_model
from minicb.model.quant import kv_cache_layout

PROMPTS = [[3 + (7 * i + j) % 500 for j in range(5 + 9 * i)] for i in range(5)]
MAX_TOKENS = [30, 4, 22, 30, 12]


def test_an_int8_block_holds_at_least_3_7_times_float32s_tokens_per_byte():
    for head_dim in (64, 128):
        row32, dtype32 = kv_cache_layout(2, head_dim, torch.float32, "auto")
        row8, dtype8 = kv_cache_layout(2, head_dim, torch.float32, "int8")
        bytes32 = row32[0] * row32[1] * dtype32.itemsize
        bytes8 = row8[0] * row8[1] * dtype8.itemsize
        assert bytes32 / bytes8 >= 3.7, (head_dim, bytes32, bytes8)


def test_the_pool_check_counts_int8_bytes(tiny_llama, monkeypatch):
    """A pool twice the free memory in float32 fits as int8 (about half of it): the engine sizes
    KV memory by the bytes it stores."""
    from minicb.runner import model_runner

    model = load_model(Path(tiny_llama))
    args = model.args
    float32_block = 2 * args.num_layers * 16 * args.num_kv_heads * args.head_dim * 4
    monkeypatch.setattr(model_runner, "free_memory", lambda device: 500 * float32_block)
    knobs = {"model": tiny_llama, "num_kv_blocks": 1000}
    with pytest.raises(ValueError, match="the KV cache would need"):
        model_runner.check_kv_fits(EngineConfig(**knobs).resolve(512), args)
    model_runner.check_kv_fits(EngineConfig(**knobs, kv_cache_dtype="int8").resolve(512), args)


def _run(model: str, **knobs):
    llm = LLM(model, max_num_seqs=3, **knobs)
    return llm, llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS], use_tqdm=False)


def test_the_c_kernels_equal_dequantize_then_attend(any_tiny_model):
    """attention='torch' gathers the int8 rows, dequantizes them and runs SDPA; attention='cpu'
    dequantizes inside the kernel: the same tokens."""
    _, reference = _run(any_tiny_model, kv_cache_dtype="int8", attention="torch")
    _, outputs = _run(any_tiny_model, kv_cache_dtype="int8", attention="cpu")
    for ref, out in zip(reference, outputs):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids


def test_int8_kv_stays_with_transformers(tiny_llama):
    """Rounding each key and value to 1/254 of its head's largest moves the logits by about
    1e-3: against float32 transformers, a choice may flip only at a near-tie."""
    references = hf_greedy(tiny_llama, PROMPTS, MAX_TOKENS)
    _, outputs = _run(tiny_llama, kv_cache_dtype="int8")
    verdicts = check_all(references, outputs, near_tie=2e-2)
    assert verdicts.count("equal") >= len(PROMPTS) - 1, verdicts


@pytest.mark.parametrize("knobs", [
    {"enable_prefix_caching": True, "num_kv_blocks": 8},        # cached prefixes, preemption
    {"speculative_method": "ngram", "num_speculative_tokens": 3},  # rollback of rejected tokens
    {"async_scheduling": True},                                   # overlapped steps
], ids=["prefix-caching-preemption", "speculative-rollback", "overlap"])
def test_the_engine_keeps_working_on_an_int8_cache(tiny_llama, knobs):
    """Each feature with an int8 cache gives the plain int8 engine's tokens (a repeated prompt
    hits the prefix cache; samples of n=2 share their prompt's blocks and copy the partly filled
    one on write), and every block comes back."""
    prompts = PROMPTS + [PROMPTS[3], PROMPTS[3] + [7, 8, 9]]
    params = [greedy(n) for n in MAX_TOKENS] + [greedy(20), SamplingParams(
        n=2, max_tokens=20, temperature=0, ignore_eos=True, logprobs=5)]
    plain = LLM(tiny_llama, max_num_seqs=3, kv_cache_dtype="int8")
    expected = plain.generate(prompts, params, use_tqdm=False)
    llm = LLM(tiny_llama, max_num_seqs=3, kv_cache_dtype="int8", max_model_len=128, **knobs)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for want, got in zip(expected, outputs):
        for a, b in zip(want.outputs, got.outputs):
            assert a.token_ids == b.token_ids
    engine = llm.llm_engine
    if "num_kv_blocks" in knobs:
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to preempt"
        assert engine.kv.prefix_stats().hit_tokens > 0
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked"


@pytest.mark.parametrize("knobs, message", [
    ({"kv_cache_dtype": "fp4"}, r"kv_cache_dtype='fp4' is not one of \('auto', 'int8', 'fp8'"),
    ({"kv_cache_dtype": "int8", "device": "cuda"}, "runs on the CPU"),
    ({"kv_cache_dtype": "int8", "attention": "triton"}, "runs on the CPU"),
    ({"kv_cache_dtype": "int8", "tensor_parallel_size": 2}, "run in one process"),
    ({"quantization": "int8", "tensor_parallel_size": 2}, "run in one process"),
])
def test_a_bad_kv_cache_dtype_names_the_choices(knobs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**knobs)

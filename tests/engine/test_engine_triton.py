"""The engine with attention="triton" equals attention="torch": through Triton's interpreter on a
CPU (make test), with compiled kernels on a GPU (make test-gpu)."""

from __future__ import annotations

import os
import random

import pytest
import torch

from minicb import LLM, SamplingParams

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="without CUDA, Triton runs only with TRITON_INTERPRET=1 (make test sets it)")
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETING else "cuda"   # compiled kernels read only GPU memory


@pytest.mark.parametrize("scheduler", ["static", "continuous"])
def test_triton_attention_gives_the_same_greedy_tokens(tiny_qwen2, scheduler):
    rng = random.Random(5)
    # mixed lengths: decodes beside prefill chunks (budget 40), left padding (static), a 1-token
    # prompt
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 15, 16, 17, 70)]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (6, 3, 8, 5, 4)]
    knobs = dict(scheduler=scheduler, max_num_seqs=4, max_num_batched_tokens=40, max_model_len=128,
                 device=DEVICE)
    expected = LLM(tiny_qwen2, attention="torch", **knobs).generate(prompts, params, use_tqdm=False)
    got = LLM(tiny_qwen2, attention="triton", **knobs).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]


def test_compiled_triton_on_a_cpu_device_is_refused_with_the_way_out(tiny_qwen2, monkeypatch):
    """Compiled kernels cannot read CPU tensors: the engine says so before loading anything."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="device='cuda'.*TRITON_INTERPRET=1"):
        LLM(tiny_qwen2, attention="triton", device="cpu")


def test_triton_attention_on_qwen3_and_biased_llama(tiny_variant):
    """The Triton kernels under Qwen3's per-head q/k norms and Llama's attention and MLP biases:
    the same greedy tokens and logprobs as the torch backend, itself held to transformers
    (test_engine_parity.py)."""
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 9, 33, 50)]
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=1)
    knobs = dict(max_num_seqs=4, max_num_batched_tokens=40, max_model_len=128, device=DEVICE)
    expected = LLM(tiny_variant, attention="torch", **knobs).generate(prompts, params,
                                                                     use_tqdm=False)
    got = LLM(tiny_variant, attention="triton", **knobs).generate(prompts, params, use_tqdm=False)
    for have, want in zip(got, expected):
        assert have.outputs[0].token_ids == want.outputs[0].token_ids
        for top_have, top_want in zip(have.outputs[0].logprobs, want.outputs[0].logprobs):
            assert top_have.keys() == top_want.keys()
            assert max(abs(top_have[t] - top_want[t]) for t in top_have) < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or INTERPRETING,
    reason="needs CUDA with compiled Triton (run: pytest -m gpu without TRITON_INTERPRET)")
@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_cuda_engine_equals_transformers_on_the_parity_workload(tiny_llama, attention):
    from reference import check_all, hf_greedy, run_with_arrivals
    from test_engine_parity import make_workload

    prompts, max_tokens, arrival_steps = make_workload()
    references = hf_greedy(tiny_llama, prompts, max_tokens)
    llm = LLM(tiny_llama, device="cuda", dtype="float32", attention=attention, max_num_seqs=8,
              max_num_batched_tokens=256, max_model_len=320)
    outputs = run_with_arrivals(llm, prompts, max_tokens, arrival_steps)
    verdicts = check_all(references, outputs)
    assert verdicts.count("equal") >= len(prompts) - 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_backend_on_a_gpu_leaves_cudnn_attention_out(tiny_llama):
    """cuDNN's SDPA plans every new shape (about a millisecond of CPU a call in bfloat16), and a
    serving step's shapes change every step: the torch backend must not reach it."""
    from torch.profiler import ProfilerActivity, profile

    llm = LLM(tiny_llama, device="cuda", dtype="bfloat16", attention="torch", max_num_seqs=4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate([[5] * 20, [7] * 9], SamplingParams(max_tokens=4, temperature=0),
                     use_tqdm=False)
    names = {event.key for event in prof.key_averages()}
    assert "aten::scaled_dot_product_attention" in names      # the backend did run SDPA
    assert not [name for name in names if "cudnn_attention" in name], sorted(names)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or INTERPRETING,
    reason="needs CUDA with compiled Triton (run: pytest -m gpu without TRITON_INTERPRET)")
@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_overlapped_steps_on_cuda_give_the_synchronous_engines_outputs(attention):
    """async_scheduling on a GPU: the sampled tokens stay on the device and fill the next step's
    placeholders there; the outputs (EOS, stops, max_tokens, seeded sampling, logprobs) are the
    synchronous engine's, and every block is free at the end."""
    from test_async_scheduling import (
        PROMPTS,
        assert_all_blocks_free,
        generate_both,
        logprob_values,
        mixed_params,
        summary,
    )

    (sync, _), (overlapped, engine) = generate_both(PROMPTS, mixed_params(), device="cuda",
                                                    attention=attention, max_num_seqs=4)
    assert engine.core.overlap
    assert summary(overlapped) == summary(sync)
    assert logprob_values(overlapped) == pytest.approx(logprob_values(sync), abs=1e-4)
    assert_all_blocks_free(engine)

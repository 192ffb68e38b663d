"""Outputs never depend on the machine's load: the thread policy changes how many threads run a
step (minicb/runner/threads.py), never which arithmetic runs it. The same greedy workload, once on a
fixed thread count and once with the count changing between steps as a busy neighbour would
make it, takes the same path at every step and gives the same tokens."""

from __future__ import annotations

import random

import pytest
import torch
from minicb.kernels import cpu

from minicb import LLM, SamplingParams


def run(pattern: list[int], monkeypatch) -> tuple[dict, list[int]]:
    """Drive the engine step by step, setting torch's thread count from `pattern` before each
    step; return every request's tokens and logprobs, and the fused layer calls of each step."""
    rng = random.Random(0)
    llm = LLM(attention="cpu", max_num_seqs=48, max_num_batched_tokens=512, cpu_threads=1)
    engine = llm.llm_engine
    for i in range(48):
        prompt = [rng.randrange(3, engine.vocab_size) for _ in range(rng.randint(2, 12))]
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=rng.randint(4, 10),
                                                          temperature=0, ignore_eos=True,
                                                          logprobs=1))
    calls, fused = [], []
    real = cpu.decode_layer_cpu
    monkeypatch.setattr(cpu, "decode_layer_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    results, step = {}, 0
    try:
        while engine.has_unfinished_requests():
            torch.set_num_threads(pattern[step % len(pattern)])
            before = len(calls)
            for output in engine.step():
                if output.finished:
                    results[output.request_id] = (output.outputs[0].token_ids,
                                                  output.outputs[0].logprobs)
            fused.append(len(calls) - before)
            step += 1
    finally:
        torch.set_num_threads(1)
    return results, fused


@pytest.mark.slow
@pytest.mark.skipif(not cpu.available()[0], reason="needs the CPU kernels (a C compiler)")
def test_a_changing_thread_count_changes_neither_the_path_nor_the_tokens(monkeypatch):
    quiet, quiet_path = run([1], monkeypatch)
    busy, busy_path = run([2, 1, 1, 2, 2, 1], monkeypatch)
    assert quiet_path == busy_path, "a step took another path under another thread count"
    assert max(quiet_path) > 0, "no step took the fused decode layer"
    assert {k: v[0] for k, v in quiet.items()} == {k: v[0] for k, v in busy.items()}

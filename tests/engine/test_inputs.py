"""One front door: a request is checked once, in minicb/engine/inputs.py, whoever sends it; an abort
reaches the engine core as an event, applied and reported by the next step."""

from __future__ import annotations

import asyncio
import threading

import pytest

from minicb import LLM, EngineConfig, LLMEngine, SamplingParams
from minicb.serving.async_engine import AsyncLLMEngine

GREEDY = dict(temperature=0, ignore_eos=True)


def count_checks(engine: LLMEngine) -> list[str]:
    """Record the thread of every front-door check the engine's processor makes."""
    processor, threads = engine.processor, []
    process = processor.process

    def counted(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return process(*args, **kwargs)

    processor.process = counted
    return threads


def test_generate_checks_each_prompt_once(tiny_llama):
    llm = LLM(tiny_llama, max_num_seqs=4)
    checks = count_checks(llm.llm_engine)
    outputs = llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=3, **GREEDY),
                           use_tqdm=False)
    assert len(checks) == 2 and [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]


def test_the_async_engine_checks_once_on_its_own_thread(tiny_llama):
    engine = LLMEngine(EngineConfig(model=tiny_llama, max_model_len=64))
    checks = count_checks(engine)
    front = AsyncLLMEngine(engine)

    async def scenario():
        deltas = [d async for d in front.generate([5, 6, 7], SamplingParams(max_tokens=2,
                                                                             **GREEDY))]
        with pytest.raises(ValueError, match="exceeds max_model_len=64"):
            await front.add_request([5] * 40, SamplingParams(max_tokens=40), require_fit=True)
        await front.shutdown()
        return deltas

    deltas = asyncio.run(scenario())
    assert deltas[-1].finish_reason == "length"
    assert len(checks) == 2 and threading.main_thread().name not in checks


def test_a_processed_prompt_keeps_the_params_it_was_checked_with(tiny_llama):
    engine = LLM(tiny_llama).llm_engine
    params = SamplingParams(max_tokens=2, **GREEDY)
    processed = engine.processor.process([5, 6], params)
    with pytest.raises(ValueError, match="carries the params it was checked with"):
        engine.add_request("r", processed, SamplingParams(max_tokens=9))
    engine.add_request("r", processed)
    assert engine.requests["r"].params is params
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("bad", [10**9], params)       # a raw prompt is checked at the door


def test_an_abort_is_applied_and_reported_by_the_next_step(tiny_llama):
    engine = LLM(tiny_llama, max_num_seqs=4).llm_engine
    params = SamplingParams(max_tokens=20, **GREEDY)
    engine.add_request("kept", [5, 6, 7], params)
    engine.add_request("gone", [8, 9], SamplingParams(n=2, max_tokens=20, seed=1))
    engine.step()
    used = engine.kv.num_used_blocks()
    engine.abort("gone")
    assert engine.kv.num_used_blocks() == used and engine.has_unfinished_requests()
    outputs = engine.step()
    assert sorted((o.request_id, o.outputs[0].index, o.outputs[0].finish_reason)
                  for o in outputs) == [("gone", 0, "abort"), ("gone", 1, "abort"),
                                        ("kept", 0, None)]
    assert not engine.has_request("gone")
    assert engine.kv.num_used_blocks() == len(engine.kv.block_table(engine.requests["kept"]))

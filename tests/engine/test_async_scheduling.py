"""Overlapped scheduling (async_scheduling=True) gives the synchronous engine's outputs: the same
tokens, texts, finish reasons and logprobs for every scheduler x KV layout, with EOS, stop
strings, stop token ids, max_tokens, aborts mid-run, preemption, prefix caching, n > 1 and seeded
sampling, and every KV block free at the end. The token a step computes past a stop is never
reported."""

from __future__ import annotations

import logging

import pytest
import torch
from reference import run_with_arrivals

from minicb import LLM, SamplingParams

PROMPTS = ["Once upon a time", "The capital of France is", "def fib(n):", "Hello, my name is",
           "import numpy as np\n", "class Stack:", "The weather today", "1, 2, 3, 4,"]
LAYOUTS = [("naive", "paged"), ("static", "paged"), ("static", "contiguous"),
           ("continuous", "contiguous"), ("continuous", "paged")]


def mixed_params() -> list[SamplingParams]:
    """Greedy and seeded sampling, top-k / top-p, logprobs, stop strings and stop ids, lengths
    from 1 token up, and requests that run into EOS."""
    kinds = [dict(temperature=0, max_tokens=40),
             dict(temperature=0.8, seed=7, max_tokens=24, logprobs=3),
             dict(temperature=0, max_tokens=48, stop=["\n\n"]),
             dict(temperature=1.0, top_k=20, top_p=0.9, seed=3, max_tokens=1),
             dict(temperature=0, max_tokens=30, logprobs=0, stop_token_ids=[198]),
             dict(temperature=0.7, seed=11, max_tokens=33, stop=[" the"]),
             dict(temperature=0, max_tokens=2),
             dict(temperature=1.2, seed=5, max_tokens=40, ignore_eos=True)]
    return [SamplingParams(**kind) for kind in kinds]


def summary(outputs) -> list[tuple]:
    return [(c.index, c.token_ids, c.text, c.finish_reason, c.stop_reason,
             None if c.logprobs is None else [sorted(top) for top in c.logprobs])
            for o in outputs for c in o.outputs]


def logprob_values(outputs) -> list[float]:
    return [v for o in outputs for c in o.outputs for top in (c.logprobs or [])
            for v in top.values()]


def generate_both(prompts, params, **knobs):
    """The same requests on a synchronous and an overlapped engine: (outputs, engine) each."""
    runs = []
    for overlap in (False, True):
        llm = LLM(async_scheduling=overlap, **knobs)
        runs.append((llm.generate(prompts, params, use_tqdm=False), llm.llm_engine))
    return runs


def assert_all_blocks_free(engine) -> None:
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked"
    assert not engine.requests and not engine.core.has_unfinished()


@pytest.mark.parametrize("scheduler,kv_cache", LAYOUTS)
def test_overlapped_equals_synchronous(scheduler, kv_cache):
    params = mixed_params()
    (sync, _), (overlapped, engine) = generate_both(PROMPTS, params, scheduler=scheduler,
                                                    kv_cache=kv_cache, max_num_seqs=4)
    assert engine.core.overlap
    assert summary(overlapped) == summary(sync)
    assert logprob_values(overlapped) == pytest.approx(logprob_values(sync), abs=1e-4)
    reasons = {c.finish_reason for o in sync for c in o.outputs}
    assert reasons == {"stop", "length"}, reasons      # both kinds of end were exercised
    assert any(isinstance(c.stop_reason, str) for o in sync for c in o.outputs)
    assert_all_blocks_free(engine)


def test_preemption_prefix_caching_and_parallel_samples():
    """A pool too small for the batch (preemption), shared prompt prefixes (prefix caching) and
    n = 3 samples forking their first sample's blocks."""
    header = "You are a helpful assistant. Answer briefly and clearly. " * 3
    prompts = [header + p for p in PROMPTS]
    params = [SamplingParams(n=3 if i % 3 == 0 else 1, temperature=0.9, seed=i, max_tokens=40,
                             ignore_eos=i % 2 == 0) for i in range(len(prompts))]
    (sync, sync_engine), (overlapped, engine) = generate_both(
        prompts, params, max_num_seqs=8, num_kv_blocks=24, enable_prefix_caching=True,
        max_model_len=256)
    assert sync_engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    assert engine.scheduler.num_preemptions > 0
    assert engine.kv.prefix_stats().hit_tokens > 0
    assert summary(overlapped) == summary(sync)
    assert_all_blocks_free(engine)


@pytest.mark.parametrize("scheduler,kv_cache", [("continuous", "paged"), ("static", "contiguous")])
def test_aborts_mid_run(tiny_llama, scheduler, kv_cache):
    """Requests aborted while their steps are in flight end as aborted, report only tokens the
    synchronous engine also made, and free their blocks; everyone else is unchanged."""
    prompts = [[5 + i] * (3 + 4 * i) for i in range(8)]
    max_tokens, arrivals = [30] * 8, [0, 0, 1, 2, 3, 5, 8, 9]
    aborts = {1: 4, 4: 6, 6: 10, 7: 9}
    runs = []
    for overlap in (False, True):
        llm = LLM(tiny_llama, scheduler=scheduler, kv_cache=kv_cache, max_num_seqs=4,
                  max_model_len=128, async_scheduling=overlap)
        runs.append(run_with_arrivals(llm, prompts, max_tokens, arrivals, aborts))
        assert_all_blocks_free(llm.llm_engine)
    for index, (sync, overlapped) in enumerate(zip(*runs)):
        ours, theirs = overlapped.outputs[0], sync.outputs[0]
        if index in aborts:
            assert ours.finish_reason == "abort"
            assert ours.token_ids == theirs.token_ids[:len(ours.token_ids)]
        else:
            assert (ours.token_ids, ours.finish_reason) == (theirs.token_ids, theirs.finish_reason)


def test_the_token_past_a_stop_is_computed_but_never_reported():
    """A request that stops at step n on a token (a stop token id here) had a row in step n + 1,
    planned before the token was known: that row ran, and its token went nowhere."""
    greedy = LLM().generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=8),
                            use_tqdm=False)[0].outputs[0].token_ids
    at = next(i for i in range(1, 8) if greedy[i] not in greedy[:i])
    llm = LLM(async_scheduling=True)
    engine = llm.llm_engine
    ran = []
    run = engine.runner.run

    def recording(plan, packed, previous=None):
        ran.append({s.request.request_id for s in plan.seqs})
        return run(plan, packed, previous)

    engine.runner.run = recording
    engine.add_request("stops", "def fib(n):", SamplingParams(
        temperature=0, max_tokens=8, stop_token_ids=[greedy[at]]))
    engine.add_request("runs", "Once upon a time", SamplingParams(temperature=0, max_tokens=12))
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
    assert outputs["stops"] == greedy[:at + 1] and len(outputs["runs"]) == 12
    # the prefill and `at` decodes made its tokens; one more row ran past the stop
    assert sum("stops" in ids for ids in ran) == at + 2
    assert_all_blocks_free(engine)


def test_placeholders_are_filled_from_the_sampled_tensor():
    """Overlapped steps feed tokens the host has not seen yet: plans carry placeholders, and the
    runner fills them from the previous step's sampled tensor."""
    llm = LLM(async_scheduling=True)
    engine = llm.llm_engine
    holes = []
    run = engine.runner.run

    def recording(plan, packed, previous=None):
        holes.append(int((packed[0] < 0).sum()))
        return run(plan, packed, previous)

    engine.runner.run = recording
    llm.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)
    assert holes[0] == 0 and max(holes) == 3
    assert_all_blocks_free(engine)


def test_seeded_sampling_is_the_same_alone_and_overlapped():
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=20, ignore_eos=True)
    alone = LLM().generate(["The weather today"], params, use_tqdm=False)
    (_, _), (overlapped, _) = generate_both(PROMPTS, [params] * len(PROMPTS), max_num_seqs=8)
    assert overlapped[6].outputs[0].token_ids == alone[0].outputs[0].token_ids


def test_speculative_decoding_falls_back_to_synchronous_steps_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="minicb.engine.llm_engine"):
        llm = LLM(async_scheduling=True, speculative_method="ngram")
    assert not llm.llm_engine.core.overlap
    warnings = [r.getMessage() for r in caplog.records if "async_scheduling" in r.getMessage()]
    assert len(warnings) == 1 and "speculative" in warnings[0]
    outputs = llm.generate(["1, 2, 3, 4, 1, 2, 3, 4,"], SamplingParams(temperature=0,
                                                                         max_tokens=8),
                           use_tqdm=False)
    assert len(outputs[0].outputs[0].token_ids) == 8


def test_the_knob_is_a_flag_and_is_checked():
    import argparse

    from minicb.config import EngineConfig

    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    assert parser.parse_args(["--async-scheduling"]).async_scheduling is True
    assert parser.parse_args([]).async_scheduling is False
    with pytest.raises(ValueError, match="async_scheduling must be true or false"):
        EngineConfig(async_scheduling="yes")


def test_only_an_overlapping_engine_keeps_overlaps_books(monkeypatch):
    """The synchronous engine's scheduler has no overlap bookkeeping at all (no commit, no
    placeholder); the overlapped engine's is its scheduler class with OverlapScheduler mixed in
    first, and the core refuses to overlap steps without one."""
    from minicb.engine.core import EngineCore
    from minicb.scheduler.continuous import ContinuousScheduler
    from minicb.scheduler.overlap import OverlapScheduler

    llm = LLM()
    engine = llm.llm_engine
    assert type(engine.scheduler) is ContinuousScheduler and not hasattr(engine.scheduler,
                                                                         "commit")
    monkeypatch.setattr(OverlapScheduler, "commit", lambda self, plan: pytest.fail("committed"))
    outputs = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=5), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 5 for o in outputs)
    assert torch.is_tensor(engine.runner.sampled)
    monkeypatch.undo()
    overlapped = LLM(async_scheduling=True, scheduler="static").llm_engine.scheduler
    assert type(overlapped).__mro__[1:3] == (OverlapScheduler, type(LLM(scheduler="static")
                                                                   .llm_engine.scheduler))
    with pytest.raises(ValueError, match="overlap=True"):
        EngineCore(engine.scheduler, engine.core.executor, overlap=True)


def test_a_step_copies_to_the_host_once_for_tokens_and_once_for_logprobs(monkeypatch):
    """The host reads a step's tokens (and, when asked, their logprobs) in one copy each,
    whatever the number of rows. (Counted on synchronous steps, where the step runs inside
    engine.step(); overlapped steps run the same runner code in their thread.)"""
    copies_per_rows = {}
    for rows in (2, 6):
        engine = LLM(max_num_seqs=8).llm_engine
        for i in range(rows):
            engine.add_request(str(i), PROMPTS[i], SamplingParams(temperature=0.5, seed=i,
                                                                  max_tokens=4, logprobs=2))
        engine.step()                                        # the prompts
        copies: list[int] = []
        tolist = torch.Tensor.tolist
        monkeypatch.setattr(torch.Tensor, "tolist",
                            lambda self, copies=copies, tolist=tolist: copies.append(1)
                            or tolist(self))
        engine.step()                                        # a decode step
        monkeypatch.undo()
        copies_per_rows[rows] = len(copies)
    assert copies_per_rows[2] == copies_per_rows[6] == 2, copies_per_rows


def test_requests_with_host_state_run_synchronous_steps_and_say_so(caplog):
    """Penalties and min_tokens read every token a request produced, on the host: while such a
    request is live the overlapped engine runs synchronous steps (said once), then overlaps
    again; the outputs are the synchronous engine's."""
    params = [SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=12, min_tokens=10),
              SamplingParams(temperature=0.8, seed=2, max_tokens=30, ignore_eos=True)]
    with caplog.at_level(logging.WARNING, logger="minicb.engine.llm_engine"):
        (sync, _), (overlapped, engine) = generate_both(PROMPTS[:3], params, max_num_seqs=4)
    assert summary(overlapped) == summary(sync)
    warnings = [r.getMessage() for r in caplog.records if "synchronous steps while" in
                r.getMessage()]
    assert len(warnings) == 1
    assert engine.scheduler.num_host_state_requests == 0
    assert_all_blocks_free(engine)
    # with them gone, steps overlap again: the next plan is committed
    engine.add_request("later", "Hello", SamplingParams(temperature=0, max_tokens=4))
    engine.step()
    assert engine.core._in_flight is not None and engine.core._in_flight.plan.committed
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_blocks_free(engine)


def test_a_packed_step_carries_what_it_read_of_the_persistent_batch():
    """Overlapped scheduling packs step n + 1 (rewriting persistent-batch rows) before step n
    runs: step n must still sample with what it packed, as the synchronous engine does."""
    import dataclasses

    engines = [LLM(max_num_seqs=4).llm_engine for _ in range(2)]
    for engine in engines:
        for i in range(2):
            engine.add_request(str(i), PROMPTS[i], SamplingParams(temperature=1.5, seed=i,
                                                                  max_tokens=4, logprobs=1))
        engine.step()                                           # the prompts
    plans = [engine.scheduler.schedule() for engine in engines]
    assert plans[0].num_decode_rows == len(plans[0].seqs) == 2
    want = engines[1].runner.execute(plans[1])
    runner = engines[0].runner
    packed = runner.prepare(plans[0])
    assert packed.decode is not None and packed.decode.any_logprobs
    # the next step's packing: one row left, now greedy without logprobs, on another block
    seq = plans[0].seqs[0]
    rewritten = dataclasses.replace(seq, params=SamplingParams(temperature=0),
                                    block_table=seq.block_table[:-1] + [0])
    runner.prepare(dataclasses.replace(plans[0], seqs=[rewritten]))
    have = runner.run(plans[0], packed)
    assert have.sampled_token_ids == want.sampled_token_ids
    assert have.logprobs == want.logprobs and all(want.logprobs)

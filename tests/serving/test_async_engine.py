"""AsyncLLMEngine: background steps, per-request streams, parallel samples (n > 1), aborts, bad
input, overload; and the incremental detokeniser behind the streamed text."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest
from serving_common import run, text_checkpoint, train_tokenizer

from minicb import LLM, EngineConfig, LLMEngine, SamplingParams
from minicb.engine.detokenizer import IncrementalDetokenizer
from minicb.serving.async_engine import AsyncLLMEngine, QueueFullError

GREEDY = dict(temperature=0, ignore_eos=True)


def make_engine(model: str, max_queue_len: int | None = None, **knobs) -> AsyncLLMEngine:
    return AsyncLLMEngine(LLMEngine(EngineConfig(model=model, max_model_len=256, **knobs)),
                          max_queue_len)


async def drain(engine: AsyncLLMEngine, prompt, params: SamplingParams):
    return [delta async for delta in engine.generate(prompt, params)]


def assert_idle(engine: AsyncLLMEngine) -> None:
    """Nothing left anywhere: no request in the engine, no KV block held."""
    assert engine.engine.requests == {}
    assert not engine.engine.has_unfinished_requests()
    assert engine.engine.kv.num_used_blocks() == 0


def test_concurrent_streams_match_offline_generate(tiny_llama):
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17]]
    lengths = [12, 5, 9, 7]
    expected = LLM(tiny_llama, max_model_len=256).generate(
        prompts, [SamplingParams(max_tokens=n, **GREEDY) for n in lengths], use_tqdm=False)
    engine = make_engine(tiny_llama)

    async def scenario():
        async def staggered(index: int):
            await asyncio.sleep(0.02 * index)     # later requests join while earlier ones decode
            return await drain(engine, prompts[index],
                               SamplingParams(max_tokens=lengths[index], **GREEDY))
        results = await asyncio.gather(*(staggered(i) for i in range(len(prompts))))
        await engine.shutdown()
        return results

    for deltas, offline, n in zip(run(scenario()), expected, lengths):
        assert [t for d in deltas for t in d.token_ids] == offline.outputs[0].token_ids
        assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
        last = deltas[-1]
        assert (last.finish_reason, last.num_output_tokens) == ("length", n)
        assert last.metrics.ttft is not None and last.metrics.e2e >= last.metrics.ttft
    assert_idle(engine)


def test_a_request_arriving_mid_decode_joins_the_running_batch(tiny_llama):
    engine = make_engine(tiny_llama, scheduler="continuous")
    finished_order = []

    async def scenario():
        async def long_one():
            count = 0
            async for delta in engine.generate([5, 6, 7], SamplingParams(max_tokens=40, **GREEDY)):  # noqa: B007
                count += 1
                if count == 5:   # the long request is decoding: now the short one arrives
                    short_task.set_result(asyncio.create_task(short_one()))
            finished_order.append("long")
            return delta

        async def short_one():
            deltas = await drain(engine, [8, 9], SamplingParams(max_tokens=3, **GREEDY))
            finished_order.append("short")
            return deltas[-1]

        short_task = asyncio.get_running_loop().create_future()
        long_last = await long_one()
        short_last = await (await short_task)
        await engine.shutdown()
        return long_last, short_last

    long_last, short_last = run(scenario())
    assert finished_order == ["short", "long"]
    # admitted while the long request was mid-decode, not after it
    assert long_last.metrics.first_token_step < short_last.metrics.first_scheduled_step
    assert short_last.metrics.finished_step < long_last.metrics.finished_step
    assert_idle(engine)


def test_abort_frees_blocks_running_queued_and_on_early_exit(tiny_llama):
    engine = make_engine(tiny_llama, max_num_seqs=1)

    async def scenario():
        running = await engine.add_request([5, 6, 7], SamplingParams(max_tokens=200, **GREEDY))
        queued = await engine.add_request([8, 9], SamplingParams(max_tokens=200, **GREEDY))
        deltas = []
        async for delta in running:
            deltas.append(delta)
            if len(deltas) == 3:
                assert engine.engine.kv.num_used_blocks() > 0
                engine.abort(running.request_id)
                engine.abort(queued.request_id)
        queued_deltas = [d async for d in queued]
        # leaving a generate() loop early aborts that request too
        async with aclosing(engine.generate([10, 11],
                                            SamplingParams(max_tokens=200, **GREEDY))) as stream:
            async for _ in stream:
                break
        while engine.engine.has_unfinished_requests() or engine.engine.requests:
            await asyncio.sleep(0.01)
        await engine.shutdown()
        return deltas, queued_deltas

    deltas, queued_deltas = run(scenario())
    assert deltas[-1].finish_reason == "abort" and deltas[-1].num_output_tokens < 200
    assert queued_deltas[-1].finish_reason == "abort"
    assert sum(len(d.token_ids) for d in queued_deltas) == 0
    assert engine.stats.finished["abort"] == 3
    assert_idle(engine)


def by_sample(deltas) -> dict[int, list]:
    samples: dict[int, list] = {}
    for delta in deltas:
        samples.setdefault(delta.index, []).append(delta)
    return samples


def test_parallel_samples_share_one_stream_and_equal_each_seed_run_alone(tiny_llama):
    # 20 tokens: more than one block, the last one partly filled
    prompt = list(range(5, 25))
    sampled = dict(temperature=1.0, ignore_eos=True, max_tokens=10)
    reference = LLM(tiny_llama, max_model_len=256)
    alone = [reference.generate(prompt, SamplingParams(seed=40 + i, **sampled), use_tqdm=False)[0]
             for i in range(3)]
    engine = make_engine(tiny_llama, block_size=8)

    async def scenario():
        deltas = await drain(engine, prompt, SamplingParams(n=3, seed=40, **sampled))
        await engine.shutdown()
        return deltas

    deltas = run(scenario())
    samples = by_sample(deltas)
    assert sorted(samples) == [0, 1, 2]
    assert {d.request_id for d in deltas} == {deltas[0].request_id}     # one request, one stream
    outputs = []
    for index, sample in samples.items():
        assert [d.finished for d in sample] == [False] * (len(sample) - 1) + [True]
        tokens = [t for d in sample for t in d.token_ids]
        assert tokens == alone[index].outputs[0].token_ids, (f"sample {index} differs from seed "
                                                             f"{40 + index} alone")
        last = sample[-1]
        assert (last.finish_reason, last.num_output_tokens, last.num_prompt_tokens) == (
            "length", 10, 20)
        # the samples after the first forked it: all but its last prompt token came from shared
        # blocks
        assert last.metrics.num_cached_tokens == (0 if index == 0 else len(prompt) - 1)
        outputs.append(tokens)
    assert len({tuple(t) for t in outputs}) == 3, "the seeds should give three different samples"
    assert engine.stats.finished["length"] == 3
    assert engine.stats.prompt_tokens == len(prompt)        # counted once for the request
    assert engine.stats.generation_tokens == 30
    assert_idle(engine)


def test_aborting_a_parallel_request_aborts_every_sample(tiny_llama):
    engine = make_engine(tiny_llama, max_num_seqs=2)        # the third sample has to wait

    async def scenario():
        stream = await engine.add_request([5, 6, 7], SamplingParams(n=3, max_tokens=200, **GREEDY),
                                          request_id="group")
        # a sample's engine id is taken while it runs: a request may not reuse it
        with pytest.raises(ValueError, match="already in use"):
            await engine.add_request([8, 9], SamplingParams(max_tokens=2), request_id="group-1")
        deltas = []
        async for delta in stream:
            deltas.append(delta)
            if len(deltas) == 4:
                assert engine.engine.kv.num_used_blocks() > 0
                engine.abort(stream.request_id)
        # and on shutdown, every open sample of every request ends with "abort"
        open_stream = await engine.add_request([9, 10],
                                               SamplingParams(n=2, max_tokens=200, **GREEDY))
        await open_stream.__anext__()
        await engine.shutdown()
        return deltas, [d async for d in open_stream]

    deltas, shut = run(scenario())
    finals = [d for d in deltas if d.finished]
    assert sorted(d.index for d in finals) == [0, 1, 2]
    assert {d.finish_reason for d in finals} == {"abort"}
    assert all(d.num_output_tokens < 200 for d in finals)
    assert engine.stats.finished["abort"] == 3
    assert sorted(d.index for d in shut if d.finished) == [0, 1]
    assert {d.finish_reason for d in shut if d.finished} == {"abort"}
    assert_idle(engine)


def test_bad_input_raises_and_the_engine_keeps_serving(tiny_llama):
    engine = make_engine(tiny_llama)

    async def scenario():
        errors = []
        for prompt, params, kwargs in [
            ([], SamplingParams(), {}), ([99999], SamplingParams(), {}),
            ([5] * 300, SamplingParams(), {}),
            ([5, 6], SamplingParams(max_tokens=255), {"require_fit": True})]:
            with pytest.raises(ValueError) as error:
                await engine.add_request(prompt, params, **kwargs)
            errors.append(str(error.value))
        good = await drain(engine, [5, 6], SamplingParams(max_tokens=4, **GREEDY))
        await engine.shutdown()
        return errors, good

    errors, good = run(scenario())
    assert "empty" in errors[0] and "vocabulary" in errors[1] and "max_model_len" in errors[2]
    assert "max_tokens=255" in errors[3]
    assert good[-1].num_output_tokens == 4
    assert_idle(engine)


def test_queue_beyond_max_queue_len_is_refused_at_once(tiny_llama):
    engine = make_engine(tiny_llama, max_queue_len=2)

    async def scenario():
        params = SamplingParams(max_tokens=2, **GREEDY)
        # the first two are queued before either await returns, so the third sees a full queue
        outcomes = await asyncio.gather(*(engine.add_request([5, 6], params) for _ in range(3)),
                                        return_exceptions=True)
        streams = [o for o in outcomes if not isinstance(o, Exception)]
        finals = []
        for stream in streams:
            finals.append([d async for d in stream][-1])
        later = await drain(engine, [5, 6], params)   # the queue drained: accepted again
        await engine.shutdown()
        return outcomes, finals, later

    outcomes, finals, later = run(scenario())
    assert isinstance(outcomes[2], QueueFullError) and outcomes[2].retry_after > 0
    assert [f.finish_reason for f in finals] == ["length", "length"]
    assert later[-1].finish_reason == "length"


@pytest.mark.parametrize("n", [1, 2])
def test_a_failing_step_ends_the_streams_in_flight_and_serving_goes_on(tiny_llama, monkeypatch, n):
    engine = make_engine(tiny_llama)
    real_step = engine.engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 1:   # the very step that admits the first request
            raise RuntimeError("simulated fault")
        return real_step()

    monkeypatch.setattr(engine.engine, "step", flaky_step)

    async def scenario():
        failed = await drain(engine, [5, 6], SamplingParams(n=n, max_tokens=20, **GREEDY))
        good = await drain(engine, [7, 8], SamplingParams(max_tokens=3, **GREEDY))
        await engine.shutdown()
        return failed, good

    failed, good = run(scenario())
    assert sorted(d.index for d in failed if d.finished) == list(range(n))
    assert all(d.finish_reason == "error" and "simulated fault" in d.error for d in failed
               if d.finished)
    assert good[-1].finish_reason == "length" and good[-1].num_output_tokens == 3
    assert_idle(engine)


def test_shutdown_ends_open_streams_with_abort(tiny_llama):
    engine = make_engine(tiny_llama)

    async def scenario():
        stream = await engine.add_request([5, 6], SamplingParams(max_tokens=200, **GREEDY))
        first = await stream.__anext__()
        await engine.shutdown()
        return first, [d async for d in stream]

    first, rest = run(scenario())
    assert not first.finished and rest[-1].finish_reason == "abort"
    assert_idle(engine)


# --- incremental detokenisation ------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.mark.parametrize("text",
                         ["héllo wörld 😀 中文 done", "def add(a, b):\n    return a + b  # café"])
def test_detokenizer_streams_exactly_the_decoded_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    # the test means something only if some character really is split across tokens
    assert "😀" not in text or any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.add([token]) for token in ids]
    pieces.append(detokenizer.finish(tokenizer.decode(ids, skip_special_tokens=True)))
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_detokenizer_keeps_special_tokens_only_when_asked(tokenizer):
    ids = tokenizer.encode("def add", add_special_tokens=False) + [tokenizer.eos_token_id]
    kept = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    dropped = IncrementalDetokenizer(tokenizer)
    assert "".join(kept.add([t]) for t in ids) == "def add" + tokenizer.eos_token
    assert "".join(dropped.add([t]) for t in ids) == "def add"


def test_detokenizer_never_sends_text_a_stop_string_will_cut(tokenizer):
    ids = tokenizer.encode("abc STOP def", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["STOP"])
    naive = IncrementalDetokenizer(tokenizer)
    sent = naive_sent = ""
    for end in range(1, len(ids) + 1):
        if "STOP" in tokenizer.decode(ids[:end]):
            break   # the engine finishes the request in the step whose token completes the stop
        sent += detokenizer.add([ids[end - 1]])
        naive_sent += naive.add([ids[end - 1]])
    final = "abc "      # what the engine reports: the text cut where the stop string begins
    assert not final.startswith(naive_sent)     # without the hold-back, "STOP" would have gone out
    assert final.startswith(sent)
    assert sent + detokenizer.finish(final) == final


def test_streamed_text_of_a_model_with_a_tokenizer_matches_its_final_text(tiny_llama, tmp_path):
    engine = make_engine(text_checkpoint(tiny_llama, tmp_path / "text"))

    async def scenario():
        params = [SamplingParams(max_tokens=24, seed=seed) for seed in range(3)]
        results = await asyncio.gather(*(drain(engine, "def add(a, b):", p) for p in params))
        await engine.shutdown()
        return results

    offline = LLM(str(tmp_path / "text"), max_model_len=256)
    for seed, deltas in enumerate(run(scenario())):
        params = SamplingParams(max_tokens=24, seed=seed)
        expected = offline.generate("def add(a, b):", params, use_tqdm=False)
        assert "".join(d.text for d in deltas) == expected[0].outputs[0].text
        assert [t for d in deltas for t in d.token_ids] == expected[0].outputs[0].token_ids


def test_deltas_carry_logprobs_and_prompt_logprobs(tiny_llama):
    """Each delta holds its own tokens' logprobs; the prompt's come on the first delta and the
    last; together they equal the offline output's."""
    prompt = [5, 6, 7, 8, 9]
    params = SamplingParams(max_tokens=6, logprobs=2, prompt_logprobs=1, **GREEDY)
    offline = LLM(tiny_llama, max_model_len=256).generate([prompt], params, use_tqdm=False)[0]
    engine = make_engine(tiny_llama)

    async def scenario():
        deltas = await drain(engine, prompt, params)
        await engine.shutdown()
        return deltas

    deltas = run(scenario())
    assert [lp for d in deltas for lp in d.logprobs] == offline.outputs[0].logprobs
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    assert deltas[0].prompt_logprobs == deltas[-1].prompt_logprobs == offline.prompt_logprobs
    assert all(d.prompt_logprobs is None for d in deltas[1:-1])
    assert_idle(engine)


def test_a_constraint_that_cannot_compile_is_refused_at_the_door():
    """On the validating thread, before the request queues; the engine serves the next one."""
    engine = make_engine(None)                    # the shipped model, with its tokenizer

    async def scenario():
        with pytest.raises(ValueError, match="structured_outputs.regex cannot be compiled"):
            await engine.add_request("x", SamplingParams(structured_outputs={"regex": "(a"}))
        deltas = await drain(engine, "x", SamplingParams(
            max_tokens=8, temperature=0, structured_outputs={"choice": ["ab", "cd"]}))
        await engine.shutdown()
        return deltas

    deltas = run(scenario())
    assert deltas[-1].finish_reason == "stop"
    assert_idle(engine)

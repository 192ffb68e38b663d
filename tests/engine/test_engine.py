"""Engine behaviour: sampling seeds, preemption, stopping, aborts and bad input."""

from __future__ import annotations

import json
import random

import pytest

from minicb import LLM, EngineConfig, SamplingParams


def random_prompts(n: int, seed: int = 0, low: int = 4, high: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randint(low, high))] for _ in range(n)]


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_seeded_sample_is_the_same_alone_and_in_a_busy_batch(tiny_llama):
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, top_k=50, seed=1234,
                            ignore_eos=True)
    prompt = random_prompts(1, seed=7)[0]
    alone = LLM(tiny_llama, max_num_seqs=8).generate([prompt], params, use_tqdm=False)
    others = random_prompts(12, seed=8)
    busy = SamplingParams(max_tokens=30, temperature=1.0, ignore_eos=True)
    busy_params = [busy] * 6 + [params] + \
                  [SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)] * 6
    busy = LLM(tiny_llama, max_num_seqs=8, max_num_batched_tokens=64).generate(
        others[:6] + [prompt] + others[6:], busy_params, use_tqdm=False)
    assert busy[6].outputs[0].token_ids == alone[0].outputs[0].token_ids
    # and sampling really samples: another seed gives another continuation
    other_seed = LLM(tiny_llama).generate([prompt], SamplingParams(
        max_tokens=24, temperature=0.9, top_p=0.9, top_k=50, seed=99, ignore_eos=True),
                                          use_tqdm=False)
    assert other_seed[0].outputs[0].token_ids != alone[0].outputs[0].token_ids


def test_top_k_one_is_greedy(tiny_llama):
    prompts = random_prompts(4, seed=2)
    llm = LLM(tiny_llama)
    greedy = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                          use_tqdm=False)
    top1 = llm.generate(
        prompts, SamplingParams(max_tokens=12, temperature=1.5, top_k=1, seed=3, ignore_eos=True),
        use_tqdm=False)
    assert token_ids(top1) == token_ids(greedy)


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_small_pool_preempts_and_outputs_do_not_change(tiny_llama, kv_cache):
    prompts = random_prompts(10, seed=4, low=20, high=60)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    roomy = LLM(tiny_llama, max_num_seqs=8, max_model_len=128).generate(
        prompts, params, use_tqdm=False)
    # paged: 14 blocks of 16 cannot hold 8 sequences of up to 100 tokens → preemption;
    # contiguous: room for 2 reservations → fewer requests run at once, none preempted
    tight = LLM(tiny_llama, max_num_seqs=8, max_model_len=128, kv_cache=kv_cache,
                num_kv_blocks=14 if kv_cache == "paged" else 16)
    outputs = tight.generate(prompts, params, use_tqdm=False)
    assert token_ids(outputs) == token_ids(roomy)
    engine = tight.llm_engine
    if kv_cache == "paged":
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
        assert sum(o.metrics.num_preemptions for o in outputs) == engine.scheduler.num_preemptions
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks


def test_stop_token_ids_and_max_tokens(tiny_llama):
    prompt = random_prompts(1, seed=5)[0]
    llm = LLM(tiny_llama)
    free = llm.generate([prompt], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True),
                        use_tqdm=False)
    tokens = free[0].outputs[0].token_ids
    assert len(tokens) == 20 and free[0].outputs[0].finish_reason == "length"
    stop_at = tokens[5]
    first = tokens.index(stop_at)
    stopped = llm.generate([prompt], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True,
                                                    stop_token_ids=[stop_at]), use_tqdm=False)
    out = stopped[0].outputs[0]
    assert out.token_ids == tokens[:first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_at)


def test_eos_stops_unless_ignored(tiny_llama):
    prompts = random_prompts(40, seed=6)
    llm = LLM(tiny_llama, max_num_seqs=16)
    # no per-request seed: each request draws from its own generator (one shared seed would give
    # all 40 the same uniforms, so they would meet EOS together or not at all)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=64, temperature=1.0), use_tqdm=False)
    eos = 2
    ended = [o for o in outputs if o.outputs[0].finish_reason == "stop"]
    assert ended, ("with 40 sampled requests of 64 tokens some should meet EOS (id 2) in a 512 "
                   "vocabulary")
    for o in ended:
        assert o.outputs[0].token_ids[-1] == eos and eos not in o.outputs[0].token_ids[:-1]


def test_abort_frees_blocks_and_others_finish(tiny_llama):
    llm = LLM(tiny_llama, max_num_seqs=4)
    engine = llm.llm_engine
    prompts = random_prompts(6, seed=9)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt,
                           SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort("1")       # running
    engine.abort("5")       # still waiting
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    assert {k: v.outputs[0].finish_reason for k, v in finished.items()} == \
        {"0": "length", "1": "abort", "2": "length", "3": "length", "4": "length", "5": "abort"}
    assert all(len(finished[k].outputs[0].token_ids) == 30 for k in "0234")
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks
    with pytest.raises(ValueError, match="no such request"):
        engine.abort("does-not-exist")


def test_a_bad_request_mid_run_is_rejected_alone(tiny_llama):
    llm = LLM(tiny_llama, max_num_seqs=4, max_model_len=128)
    engine = llm.llm_engine
    prompts = random_prompts(4, seed=10)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    expected = token_ids(LLM(tiny_llama).generate(prompts, params, use_tqdm=False))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    engine.step()
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("too-long", [5] * 200, params)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.add_request("bad-ids", [5, 100000], params)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    assert [done[str(i)] for i in range(4)] == expected
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks


@pytest.mark.parametrize("kwargs,field", [(dict(max_tokens=0), "max_tokens"),
                                          (dict(temperature=-0.1), "temperature"),
                                          (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
                                          (dict(top_k=0), "top_k"), (dict(n=0), "n"),])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    (dict(block_size=0), "block_size"),
    (dict(max_num_seqs=8, max_num_batched_tokens=4), "max_num_batched_tokens"),
    (dict(scheduler="magic"), "scheduler"), (dict(kv_cache="ring"), "kv_cache"),
    (dict(policy="lifo"), "policy"), (dict(max_num_seqs=0), "max_num_seqs"),])
def test_inconsistent_knobs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


def test_bad_prompts_name_the_problem(tiny_llama):
    llm = LLM(tiny_llama, max_model_len=64)
    params = SamplingParams(max_tokens=4)
    cases = [([], "empty"), ([1] * 64, "max_model_len"), ([3, 512], "vocabulary"),
             ([-1], "vocabulary"), ("text", "no tokenizer"), ([1.5], "token ids")]
    for prompt, message in cases:
        with pytest.raises(ValueError, match=message):
            llm.generate([[5, 6], prompt], params, use_tqdm=False)
    with pytest.raises(ValueError, match="already in use"):
        engine = llm.llm_engine
        engine.add_request("x", [5], params)
        engine.add_request("x", [6], params)


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                      "vocab_size": 10}))
    with pytest.raises(ValueError, match="LlamaForCausalLM, Qwen2ForCausalLM"):
        LLM(str(tmp_path))


def test_contiguous_reserves_max_model_len_and_paged_grows(tiny_llama):
    """Same requests, same pool: contiguous reserves whole max_model_len runs, paged one block at
    a time."""
    prompt = random_prompts(1, seed=11, low=10, high=10)[0]
    for kv_cache, expected_slots in (("contiguous", 256), ("paged", 16)):
        llm = LLM(tiny_llama, kv_cache=kv_cache, max_model_len=256, num_kv_blocks=64)
        engine = llm.llm_engine
        engine.add_request("a", prompt, SamplingParams(max_tokens=3, temperature=0))
        engine.step()
        assert engine.kv.num_reserved_slots() == expected_slots


@pytest.mark.parametrize("overlap", [False, True])
def test_a_one_token_prompt_chunk_beside_decodes_takes_no_sampled_token(overlap):
    """With a budget of one token a row, a prompt admitted beside three decodes runs one token a
    step: every row has one token, but that row samples nothing until its prompt's last token.
    The decode-only packing must not hand its row's token to a neighbour."""
    from reference import run_with_arrivals

    prompts = [[5, 6, 7], [20, 21], [30, 31], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
    max_tokens = [12, 12, 12, 6]
    expected = run_with_arrivals(LLM(max_num_batched_tokens=512, max_num_seqs=4), prompts,
                                 max_tokens, [0, 0, 0, 0])
    llm = LLM(max_num_batched_tokens=4, max_num_seqs=4, async_scheduling=overlap)
    steps, prepare = [], llm.llm_engine.runner.prepare

    def recording(output):
        steps.append([(s.num_tokens, s.needs_logits) for s in output.seqs])
        return prepare(output)

    llm.llm_engine.runner.prepare = recording
    got = run_with_arrivals(llm, prompts, max_tokens, [0, 0, 0, 2])
    assert any(all(n == 1 for n, _ in rows) and not all(logits for _, logits in rows)
               for rows in steps), "no step had a one-token prompt chunk beside decodes"
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]

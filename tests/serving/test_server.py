"""The OpenAI-compatible server over loopback, serving the shipped default model: the official
openai client (plain and streamed), parallel samples (n > 1), 64 concurrent streams, clients that
hang up, bad requests, overload, /metrics (prefix caching off and on), request priorities, the
command line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time

import httpx
import openai
import pytest
from serving_common import SIMPLE_CHAT_TEMPLATE, checkpoint_copy, run

import minicb.serving.server
from minicb import LLM, SamplingParams, default_model_path
from minicb.config import POLICY_KNOBS, EngineConfig
from minicb.serving.openai_protocol import HTTP_MAX_N
from minicb.serving.server import ServerThread, build_app, build_parser

MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> str:
    """The default model, its tokenizer given a simpler chat template than the one it ships with."""
    return checkpoint_copy(default_model_path(), tmp_path_factory.mktemp("chat-model"),
                           chat_template=SIMPLE_CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def server(chat_model):
    app = build_app(chat_model, served_model_name="tiny", max_model_len=MAX_MODEL_LEN,
                    max_num_seqs=16)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(chat_model) -> LLM:
    """The same model offline, to run each request alone."""
    return LLM(chat_model, max_model_len=MAX_MODEL_LEN)


def engine_of(server):
    return server.app.state.engine


@contextlib.contextmanager
def slow_steps(engine, seconds: float = 0.02):
    """Every model step takes at least `seconds`: a long request then really is long, however
    fast the engine computes the tiny model's tokens."""
    runner = engine.engine.runner
    execute = runner.execute

    def slow_execute(plan):
        time.sleep(seconds)
        return execute(plan)

    runner.execute = slow_execute
    try:
        yield
    finally:
        del runner.execute


def wait_until_idle(server, timeout: float = 60.0) -> None:
    engine, deadline = engine_of(server), time.monotonic() + timeout
    while engine.num_running or engine.num_waiting or engine.engine.requests:
        assert time.monotonic() < deadline, "the server did not go idle"
        time.sleep(0.02)


def wait_for_aborts(server, expected: int, timeout: float = 60.0) -> None:
    """Wait until `expected` requests in all ended aborted, then for the engine to be idle. On a
    busy machine a client can give up before its request reached the engine, so an idle engine
    alone does not mean the abort happened."""
    engine, deadline = engine_of(server), time.monotonic() + timeout
    while engine.stats.finished["abort"] < expected:
        assert time.monotonic() < deadline, "a request the client gave up on was not aborted"
        time.sleep(0.02)
    wait_until_idle(server, timeout)


def scrape(server) -> dict[str, float]:
    """GET /metrics as {sample name with labels: value}."""
    text = httpx.get(server.url + "/metrics").text
    return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, flags=re.M)}


def test_models_and_health(server):
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_greedy_completion_equals_llm_generate(client, chat_model):
    prompt = "def add(a, b):"
    reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"return_token_ids": True})
    expected = LLM(chat_model, max_model_len=MAX_MODEL_LEN).generate(
        prompt, SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)[0]
    assert reply.choices[0].text == expected.outputs[0].text
    assert reply.choices[0].token_ids == expected.outputs[0].token_ids
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert reply.usage.completion_tokens == len(expected.outputs[0].token_ids)


@pytest.mark.parametrize("prompt", ["for index in range(10):", "# café 中文 😀\n", [5, 6, 7, 8]])
def test_streamed_text_equals_non_streamed_for_the_same_seed(client, prompt):
    options = dict(model="tiny", prompt=prompt, max_tokens=24, temperature=0.9, top_p=0.95,
                   seed=1234)
    whole = client.completions.create(**options)
    chunks = list(client.completions.create(**options, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == whole.choices[0].text
    assert ([c.choices[0].finish_reason for c in chunks if c.choices][-1]
            == whole.choices[0].finish_reason)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_stop_string_cuts_streamed_and_plain_text_alike(client):
    options = dict(model="tiny", prompt="class Point:", max_tokens=30, temperature=0)
    full = client.completions.create(**options).choices[0].text
    clean = [i for i in range(4, len(full) - 2) if "\ufffd" not in full[i:i + 2]
             and full[i:i + 2].strip()]
    assert clean, f"no usable stop string in {full!r}"
    stop = full[clean[0]:clean[0] + 2]
    expected = full[:full.index(stop)]
    whole = client.completions.create(**options, stop=[stop])
    chunks = client.completions.create(**options, stop=[stop], stream=True)
    streamed = "".join(c.choices[0].text for c in chunks)
    assert whole.choices[0].text == streamed == expected
    assert whole.choices[0].finish_reason == "stop"


def test_chat_completion_uses_the_chat_template(client, chat_model):
    messages = [{"role": "user", "content": "write add"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                           temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert ("".join(c.choices[0].delta.content or "" for c in chunks)
            == whole.choices[0].message.content)
    llm = LLM(chat_model, max_model_len=MAX_MODEL_LEN)
    rendered = "<|user|>write add\n<|assistant|>"
    greedy = SamplingParams(max_tokens=10, temperature=0)
    expected = llm.generate(rendered, greedy, use_tqdm=False)[0]
    assert whole.choices[0].message.content == expected.outputs[0].text
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)


SAMPLED = dict(max_tokens=12, temperature=1.0, seed=321)


def run_alone(reference: LLM, prompt, index: int):
    """Sample `index` of an n > 1 request: the same request alone, with seed + index."""
    params = SamplingParams(max_tokens=SAMPLED["max_tokens"], temperature=SAMPLED["temperature"],
                            seed=SAMPLED["seed"] + index)
    return reference.generate(prompt, params, use_tqdm=False)[0]


def test_n_samples_each_equal_the_request_run_alone_with_seed_plus_i(server, client, reference):
    prompt = "def add(a, b):"
    reply = client.completions.create(model="tiny", prompt=prompt, n=3, **SAMPLED,
                                      extra_body={"return_token_ids": True})
    assert [c.index for c in reply.choices] == [0, 1, 2]
    expected = [run_alone(reference, prompt, i) for i in range(3)]
    for got, want in zip(reply.choices, expected):
        assert got.token_ids == want.outputs[0].token_ids
        assert got.text == want.outputs[0].text
        assert got.finish_reason == want.outputs[0].finish_reason
    assert len({tuple(c.token_ids) for c in reply.choices}) == 3, ("three seeds, three different "
                                                                   "samples")
    # once, not three times
    assert reply.usage.prompt_tokens == len(expected[0].prompt_token_ids)
    assert reply.usage.completion_tokens == sum(len(e.outputs[0].token_ids) for e in expected)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    wait_until_idle(server)
    assert engine_of(server).engine.kv.num_used_blocks() == 0


def test_streamed_n_samples_deliver_every_choice_with_its_index(server, client, reference):
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]   # past one block
    chunks = list(client.completions.create(model="tiny", prompt=prompt, n=2, **SAMPLED,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True}))
    text, token_ids, finish = {}, {}, {}
    for chunk in chunks[:-1]:
        (entry,) = chunk.choices             # one choice per chunk, as OpenAI streams n > 1
        text[entry.index] = text.get(entry.index, "") + entry.text
        token_ids[entry.index] = token_ids.get(entry.index, []) + entry.token_ids
        assert entry.index not in finish, "a chunk came after its choice finished"
        if entry.finish_reason is not None:
            finish[entry.index] = entry.finish_reason
    expected = [run_alone(reference, prompt, i) for i in range(2)]
    assert sorted(text) == sorted(finish) == [0, 1]
    for index, want in enumerate(expected):
        assert token_ids[index] == want.outputs[0].token_ids
        assert text[index] == want.outputs[0].text
        assert finish[index] == want.outputs[0].finish_reason
    assert token_ids[0] != token_ids[1]
    usage = chunks[-1].usage                  # the last chunk: usage over both choices, no choices
    assert chunks[-1].choices == []
    assert usage.prompt_tokens == len(prompt)
    assert usage.completion_tokens == sum(len(e.outputs[0].token_ids) for e in expected)
    wait_until_idle(server)
    assert engine_of(server).engine.kv.num_used_blocks() == 0


def test_chat_with_n_samples_streamed_and_plain_agree(client):
    messages = [{"role": "user", "content": "write add"}]
    options = dict(model="tiny", messages=messages, n=2, max_tokens=10, temperature=1.0, seed=9)
    whole = client.chat.completions.create(**options)
    assert [c.index for c in whole.choices] == [0, 1]
    content, roles = {0: "", 1: ""}, {}
    for chunk in client.chat.completions.create(**options, stream=True):
        for entry in chunk.choices:
            # each choice's first delta has the role
            roles.setdefault(entry.index, entry.delta.role)
            content[entry.index] += entry.delta.content or ""
    assert roles == {0: "assistant", 1: "assistant"}
    assert [content[0], content[1]] == [c.message.content for c in whole.choices]


def test_64_concurrent_streaming_clients_all_complete(server):
    async def one(client: openai.AsyncOpenAI, index: int) -> tuple[list[int], int, str]:
        stream = await client.completions.create(
            model="tiny", prompt=[5 + index % 50, 6, 7], max_tokens=8, temperature=0.5, seed=index,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "return_token_ids": True})
        token_ids, usage, finish = [], None, None
        async for chunk in stream:
            if chunk.choices:
                token_ids += chunk.choices[0].token_ids
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        return token_ids, usage.completion_tokens, finish

    async def everyone():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                      max_retries=0) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    results = run(everyone())
    assert len(results) == 64
    for token_ids, completion_tokens, finish in results:
        assert (len(token_ids), completion_tokens, finish) == (8, 8, "length")
    wait_until_idle(server)
    assert engine_of(server).engine.kv.num_used_blocks() == 0


def test_a_client_that_hangs_up_mid_stream_is_aborted_and_frees_its_blocks(server):
    engine = engine_of(server)
    aborted_before = engine.stats.finished["abort"]
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "stream": True,
            "ignore_eos": True}
    with slow_steps(engine):
        with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            assert engine.engine.kv.num_used_blocks() > 0
        # leaving the block closed the connection after one chunk of 200
        wait_until_idle(server)
    assert engine.stats.finished["abort"] == aborted_before + 1
    assert engine.engine.kv.num_used_blocks() == 0


def test_hanging_up_on_n_samples_aborts_every_one_and_frees_their_blocks(server):
    engine = engine_of(server)
    aborted_before = engine.stats.finished["abort"]
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "n": 3, "stream": True,
            "ignore_eos": True}
    with slow_steps(engine):
        with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            assert engine.engine.kv.num_used_blocks() > 0
        wait_for_aborts(server, aborted_before + 3)
        assert engine.stats.finished["abort"] == aborted_before + 3
        assert engine.engine.kv.num_used_blocks() == 0
        body = {**body, "stream": False, "n": 2}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=0.3)
        wait_for_aborts(server, aborted_before + 5)
    assert engine.stats.finished["abort"] == aborted_before + 5
    assert engine.engine.kv.num_used_blocks() == 0


def test_a_non_streaming_client_that_gives_up_is_aborted_too(server):
    engine = engine_of(server)
    aborted_before = engine.stats.finished["abort"]
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True}
    with slow_steps(engine):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=0.3)
        wait_for_aborts(server, aborted_before + 1)
    assert engine.stats.finished["abort"] == aborted_before + 1
    assert engine.engine.kv.num_used_blocks() == 0


BAD_REQUESTS = [
    ({"model": "tiny", "max_tokens": 4}, "prompt"),
    ({"model": "tiny", "prompt": 123}, "prompt"),
    ({"model": "tiny", "prompt": [5, "six"]}, "prompt"),
    ({"model": "tiny", "prompt": [99999]}, "prompt"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": "8"}, "max_tokens"),
    ({"model": "tiny", "prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"model": "tiny", "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 10_000}, "max_tokens"),
    ({"model": "tiny", "prompt": [5] * 200, "max_tokens": 100}, "max_tokens"),
    ({"model": "tiny", "prompt": "hi", "temperature": -0.5}, "temperature"),
    ({"model": "tiny", "prompt": "hi", "top_p": 0}, "top_p"),
    ({"model": "tiny", "prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"model": "tiny", "prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"model": "tiny", "prompt": "hi", "logprobs": True}, "logprobs"),
    ({"model": "tiny", "prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": "tiny", "prompt": "hi", "frequency_penalty": -3}, "frequency_penalty"),
    ({"model": "tiny", "prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": "tiny", "prompt": "hi", "repetition_penalty": 5e-324}, "repetition_penalty"),
    ({"model": "tiny", "prompt": "hi", "structured_outputs": {"choice": ["a"], "json_object": 0}},
     "structured_outputs"),
    ({"model": "tiny", "prompt": "hi", "min_p": 1.5}, "min_p"),
    ({"model": "tiny", "prompt": "hi", "min_tokens": -1}, "min_tokens"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"model": "tiny", "prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"model": "tiny", "prompt": "hi", "logit_bias": {"99999": 1}}, "logit_bias"),
    ({"model": "tiny", "prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"model": "tiny", "prompt": "hi", "response_format": {"type": "xml"}}, "response_format"),
    ({"model": "tiny", "prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}},
     "response_format"),
    ({"model": "tiny", "prompt": "hi", "structured_outputs": {"regex": "(unclosed"}},
     "structured_outputs"),
    ({"model": "tiny", "prompt": "hi", "structured_outputs": {"regex": "a", "choice": ["b"]}},
     "structured_outputs"),
    ({"model": "tiny", "prompt": "hi", "structured_outputs": {"grammar": "root ::= undefined"}},
     "structured_outputs"),
    ({"model": "tiny", "prompt": "hi", "best_of": 3}, "best_of"),
    ({"model": "tiny", "prompt": "hi", "suffix": "return x"}, "suffix"),
    ({"model": "tiny", "prompt": "hi", "tools": [{"type": "function"}]}, "tools"),
    ({"model": "tiny", "prompt": "hi", "return_hidden_states": True}, "return_hidden_states"),
    ({"model": "tiny", "prompt": "hi", "skip_special_tokens": "no"}, "skip_special_tokens"),
    ({"model": "tiny", "prompt": "hi", "no_stop_trim": True}, "no_stop_trim"),
    ({"model": "tiny", "prompt": "hi", "include_reasoning": "yes"}, "include_reasoning"),
    ({"model": "tiny", "prompt": "hi", "max_completion_tokens": 10_000}, "max_completion_tokens"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 4, "max_completion_tokens": -1},
     "max_completion_tokens"),
    ({"model": "tiny", "prompt": ""}, "prompt"),
    ({"model": "tiny", "prompt": "hi", "stop": ""}, "stop"),
    ({"model": "tiny", "prompt": "hi", "stop": ["x"] * 33}, "stop"),
    ({"model": "tiny", "prompt": "hi", "user": 5}, "user"),
    ({"model": 5, "prompt": "hi"}, "model"),
    ({"model": "tiny", "prompt": "hi", "stream": "false"}, "stream"),
    ({"model": "tiny", "prompt": "hi", "ignore_eos": "false"}, "ignore_eos"),
    ({"model": "tiny", "prompt": "hi", "seed": 2**70}, "seed"),
    ({"model": "tiny", "prompt": "hi", "seed": True}, "seed"),
    ({"model": "tiny", "prompt": "hi", "top_k": True}, "top_k"),
    ({"model": "tiny", "prompt": "hi", "n": True}, "n"),
    ({"model": "tiny", "prompt": "hi", "stop": 123}, "stop"),
    ({"model": "tiny", "prompt": "hi", "stop_token_ids": "abc"}, "stop_token_ids"),
    ({"model": "tiny", "prompt": "hi", "temperature": 10**400}, "temperature"),
    ({"model": "tiny", "prompt": "hi", "stream_options": {"include_usage": "yes"}},
     "include_usage"),
    ({"model": "tiny", "prompt": "hi", "n": 0}, "n"),
    ({"model": "tiny", "prompt": "hi", "n": HTTP_MAX_N + 1}, "n"),
    ({"model": "tiny", "prompt": "hi", "n": 2.5}, "n"),
    ({"model": "tiny", "prompt": "hi", "priority": "high"}, "priority"),
    ({"model": "tiny", "prompt": "hi", "priority": 1.5}, "priority"),
    ({"model": "tiny", "prompt": "hi", "priority": True}, "priority"),
]


@pytest.mark.parametrize("body, param", BAD_REQUESTS, ids=[p for _, p in BAD_REQUESTS])
def test_a_bad_request_gets_400_and_the_next_one_succeeds(server, body, param):
    response = httpx.post(server.url + "/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    good = httpx.post(server.url + "/v1/completions",
                      json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1


def test_too_many_samples_get_400_naming_the_limit_and_the_fix(server):
    response = httpx.post(server.url + "/v1/completions",
                          json={"model": "tiny", "prompt": "hi", "n": 1000})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "n"
    assert f"at most {HTTP_MAX_N}" in error["message"] and "1000" in error["message"]
    assert "several requests" in error["message"]
    assert not engine_of(server).engine.requests        # nothing was queued


@pytest.mark.parametrize("endpoint, body", [
    ("completions", {"prompt": "hi"}),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
def test_priority_must_be_an_integer_and_needs_the_priority_policy(server, endpoint, body):
    url, body = f"{server.url}/v1/{endpoint}", {"model": "tiny", "max_tokens": 2, **body}
    for bad in ("1", 0.5, [1]):
        response = httpx.post(url, json={**body, "priority": bad})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "priority" and "'priority' must be an integer" in error["message"]
    # this server schedules first come, first served: a priority it would ignore is refused, 0 is
    # fine
    response = httpx.post(url, json={**body, "priority": 3})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "priority" and "--policy priority" in error["message"]
    assert httpx.post(url, json={**body, "priority": 0}).status_code == 200
    assert not engine_of(server).engine.requests


def test_a_body_that_is_not_json_gets_400(server):
    response = httpx.post(server.url + "/v1/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]


def test_metrics_count_what_was_served(server):
    wait_until_idle(server)
    before = scrape(server)
    for _ in range(2):
        httpx.post(server.url + "/v1/completions",
                   json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": True})
    after = scrape(server)
    grew = lambda name: after.get(name, 0) - before.get(name, 0)
    assert grew("minicb_generation_tokens_total") == 10
    assert grew("minicb_prompt_tokens_total") == 6
    assert grew('minicb_request_success_total{finished_reason="length"}') == 2
    assert grew("minicb_time_to_first_token_seconds_count") == 2
    assert grew('minicb_time_to_first_token_seconds_bucket{le="+Inf"}') == 2
    kv = engine_of(server).engine.kv
    assert after["minicb_kv_blocks_used"] + after["minicb_kv_blocks_free"] == kv.num_blocks
    assert after["minicb_num_requests_running"] == after["minicb_num_requests_waiting"] == 0


PREFIX = list(range(100, 164))        # 64 tokens: four full blocks of 16


def two_requests_sharing_a_prefix(server) -> None:
    """One after the other, so the second can find the first's blocks in the cache."""
    for suffix in ([7, 8, 9, 10, 11, 12, 13, 14], [20, 21, 22, 23, 24, 25, 26, 27]):
        reply = httpx.post(server.url + "/v1/completions", json={
            "model": "tiny", "prompt": PREFIX + suffix, "max_tokens": 4, "ignore_eos": True})
        assert reply.status_code == 200


PREFIX_METRICS = ("minicb_prefix_cache_queries_total", "minicb_prefix_cache_hits_total",
                  "minicb_prefix_cache_hit_rate", "minicb_prefix_cache_evictions_total")


def test_prefix_cache_metrics_read_0_with_caching_off(server):
    two_requests_sharing_a_prefix(server)
    metrics = scrape(server)
    assert {name: metrics[name] for name in PREFIX_METRICS} == dict.fromkeys(PREFIX_METRICS, 0)


def test_prefix_cache_metrics_count_hits_with_caching_on(chat_model):
    app = build_app(chat_model, served_model_name="tiny", max_model_len=MAX_MODEL_LEN,
                    max_num_seqs=4, block_size=16, enable_prefix_caching=True)
    with ServerThread(app) as server:
        text = httpx.get(server.url + "/metrics").text
        for name in PREFIX_METRICS:
            kind = "gauge" if name.endswith("rate") else "counter"
            assert f"# TYPE {name} {kind}" in text
        two_requests_sharing_a_prefix(server)
        metrics = scrape(server)
        # both looked up their 72 prompt tokens; the second found the 64 of the shared prefix
        assert metrics["minicb_prefix_cache_queries_total"] == 2 * 72
        assert metrics["minicb_prefix_cache_hits_total"] == 64
        assert metrics["minicb_prefix_cache_hit_rate"] == pytest.approx(64 / 144)
        assert metrics["minicb_prefix_cache_evictions_total"] == 0
        # parallel samples with caching on: the third request finds the prefix too, its forks share
        # it
        reply = httpx.post(server.url + "/v1/completions", json={
            "model": "tiny", "prompt": PREFIX + [30, 31], "n": 3, "max_tokens": 4,
            "temperature": 1.0, "seed": 1, "ignore_eos": True}).json()
        assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
        assert reply["usage"] == {"prompt_tokens": 66, "completion_tokens": 12, "total_tokens": 78}
        assert scrape(server)["minicb_prefix_cache_hits_total"] == 64 + 64
        wait_until_idle(server)
        kv = engine_of(server).engine.kv
        assert kv.num_used_blocks() == 0
        assert kv.allocator.num_free() + len(kv.cache.evictable) == kv.num_blocks   # held by no one


def test_the_command_line_passes_enable_prefix_caching_to_the_engine(monkeypatch):
    served = []
    monkeypatch.setattr(minicb.serving.server.uvicorn, "run", lambda app,
                        **options: served.append(app))
    common = ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "2"]
    assert minicb.serving.server.main(common) == 0
    assert minicb.serving.server.main([*common, "--enable-prefix-caching"]) == 0
    caching = [app.state.engine.engine.config.enable_prefix_caching for app in served]
    assert caching == [False, True]
    assert served[1].state.engine.engine.kv.cache is not None
    # a contiguous cache cannot share blocks: a clear usage error
    with pytest.raises(SystemExit):
        minicb.serving.server.main([*common, "--enable-prefix-caching", "--kv-cache", "contiguous"])


def test_the_command_line_passes_the_policy_knobs_to_the_engine(monkeypatch):
    flags = ["--policy", "priority", "--step-order", "prefill_first",
             "--max-prefill-tokens-per-step", "64", "--max-wait-steps", "8", "--watermark-blocks",
             "2"]
    expected = {"policy": "priority", "step_order": "prefill_first",
                "max_prefill_tokens_per_step": 64, "max_wait_steps": 8, "watermark_blocks": 2}
    config = EngineConfig(**EngineConfig.knobs_from_cli(build_parser().parse_args(flags)))
    assert {name: getattr(config, name) for name in POLICY_KNOBS} == expected
    defaults = EngineConfig(**EngineConfig.knobs_from_cli(build_parser().parse_args([])))
    assert {name: getattr(defaults, name) for name in POLICY_KNOBS} == \
        {name: getattr(EngineConfig(), name) for name in POLICY_KNOBS}
    served = []
    monkeypatch.setattr(minicb.serving.server.uvicorn, "run", lambda app,
                        **options: served.append(app))
    assert minicb.serving.server.main(["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "2",
                                       *flags]) == 0
    engine = served[0].state.engine.engine
    assert {name: getattr(engine.config, name) for name in POLICY_KNOBS} == expected
    assert engine.scheduler.config.policy == "priority"


@pytest.mark.parametrize("flags, message", [
    (["--policy", "priority", "--scheduler", "static"],
     "policy='priority' only apply to scheduler='continuous' (got scheduler='static')"),
    (["--scheduler", "naive", "--max-wait-steps", "4"],
     "max_wait_steps=4 only apply to scheduler='continuous'"),
    (["--policy", "lifo"], "argument --policy: invalid choice: 'lifo'"),
    (["--step-order", "random"], "argument --step-order: invalid choice: 'random'"),
    (["--max-prefill-tokens-per-step", "0"],
     "max_prefill_tokens_per_step must be None or an integer from 1"),
    (["--max-wait-steps", "two"], "argument --max-wait-steps: invalid int value: 'two'"),
    (["--max-wait-steps", "0"],
     "max_wait_steps must be None (no ageing) or an integer >= 1 (got 0)"),
    (["--watermark-blocks", "-1"], "watermark_blocks must be an integer >= 0 (got -1)"),
    (["--max-prefill-tokens-per-step", "4096"],
     "max_prefill_tokens_per_step must be None or an integer from 1"),
])
def test_the_command_line_refuses_bad_policy_knobs_with_a_usage_error(
    monkeypatch, capsys, flags, message):
    monkeypatch.setattr(minicb.serving.server.uvicorn, "run", lambda app,
                        **options: pytest.fail("it served"))
    with pytest.raises(SystemExit) as exit_:
        minicb.serving.server.main(flags)
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: python -m minicb serve") and message in error


def test_a_priority_server_serves_a_higher_priority_request_first(chat_model):
    """One slot: while a long request holds it, a low-priority (5) and then a high-priority (-1)
    request queue up; once the slot frees, the one sent second is served first."""
    app = build_app(chat_model, served_model_name="tiny", max_model_len=512, max_num_seqs=1,
                    policy="priority")
    engine = app.state.engine.engine
    finished = []          # the priority of each request, in the order the engine finished them
    engine_step = engine.step

    def step():
        priority = {request_id: r.priority for request_id, r in engine.requests.items()}
        outputs = engine_step()
        finished.extend(priority[o.request_id] for o in outputs if o.finished)
        return outputs

    engine.step = step
    long_body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 500, "stream": True,
                 "ignore_eos": True}
    queued = {
        "low": ("completions", {"prompt": [8, 9], "priority": 5}),
        "high": ("chat/completions",
                 {"messages": [{"role": "user", "content": "hi"}], "priority": -1}),
    }
    responses = {}

    def send(name: str) -> threading.Thread:
        endpoint, body = queued[name]
        thread = threading.Thread(target=lambda: responses.update({name: httpx.post(
            f"{server.url}/v1/{endpoint}",
            json={"model": "tiny", "max_tokens": 8, "ignore_eos": True, **body}, timeout=120)}))
        thread.start()
        return thread

    def wait_for_waiting(count: int) -> dict[str, float]:
        deadline = time.monotonic() + 30
        while (metrics := scrape(server))["minicb_num_requests_waiting"] < count:
            assert time.monotonic() < deadline, f"{count} requests never waited"
            time.sleep(0.01)
        return metrics

    with ServerThread(app) as server, \
            httpx.stream("POST", server.url + "/v1/completions", json=long_body) as hog:
        lines = hog.iter_lines()       # kept: dropping the iterator would close the connection
        next(line for line in lines if line.startswith("data:"))      # the hog holds the slot now
        threads = [send("low")]
        wait_for_waiting(1)
        threads.append(send("high"))
        metrics = wait_for_waiting(2)
        assert metrics["minicb_num_requests_running"] == 1
        assert metrics["minicb_num_requests_waiting"] == 2
        assert not finished            # the hog is still running: nobody was admitted yet
        hog.close()                    # the hog hangs up: the slot frees
        for thread in threads:
            thread.join(120)
    assert responses["low"].status_code == responses["high"].status_code == 200
    assert responses["high"].json()["usage"]["completion_tokens"] == 8
    assert finished == [0, -1, 5]      # the aborted hog, then the high priority, then the low


def test_overload_gets_503_with_retry_after_and_chat_without_template_gets_400(tiny_llama):
    app = build_app(tiny_llama, served_model_name="tiny", scheduler="naive", max_num_seqs=1,
                    max_queue_len=1, max_model_len=MAX_MODEL_LEN)
    # slow_steps: the hog's 200 tokens outlast the test's own requests on a fast or busy machine
    long_body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "stream": True,
                 "ignore_eos": True}
    short_body = {"model": "tiny", "prompt": [8, 9], "max_tokens": 2}
    with ServerThread(app) as server, slow_steps(app.state.engine), \
            httpx.stream("POST", server.url + "/v1/completions", json=long_body) as hog:
        lines = hog.iter_lines()       # kept: dropping the iterator would close the connection
        next(line for line in lines if line.startswith("data:"))      # the hog is running now
        queued = {}
        waiter = threading.Thread(target=lambda: queued.update(
            response=httpx.post(server.url + "/v1/completions", json=short_body, timeout=60)))
        waiter.start()
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health").json()["waiting"] < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.01)
        refused = httpx.post(server.url + "/v1/completions", json=short_body)
        assert refused.status_code == 503
        assert int(refused.headers["retry-after"]) >= 1
        assert "overloaded" in refused.json()["error"]["message"]
        chat = httpx.post(server.url + "/v1/chat/completions",
                          json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and "chat template" in chat.json()["error"]["message"]
        hog.close()                       # the hog hangs up: the queued request runs
        waiter.join(60)
        assert queued["response"].status_code == 200
        assert httpx.post(server.url + "/v1/completions", json=short_body).status_code == 200


def test_the_fields_that_ask_for_nothing_are_accepted(server):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "presence_penalty": 0,
            "frequency_penalty": 0.0, "logit_bias": {}, "best_of": 1, "echo": False,
            "logprobs": False, "response_format": {"type": "text"}, "user": "someone"}
    response = httpx.post(server.url + "/v1/completions", json=body)
    assert response.status_code == 200, response.text


def test_an_unknown_model_is_404_in_openais_shape(server):
    response = httpx.post(server.url + "/v1/completions", json={"model": "gpt-4", "prompt": "hi"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "tiny" in error["message"]


@pytest.mark.parametrize(
    "method, path, status",
    [("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405), ("DELETE", "/v1/models", 405)])
def test_every_error_is_in_openais_shape(server, method, path, status):
    response = httpx.request(method, server.url + path)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["type"]


def test_nested_or_broken_json_is_a_400_not_a_500(server):
    nested = "[" * 100_000 + "]" * 100_000
    for raw in (nested, '{"prompt": "hi"', b"\xff\xfe"):
        response = httpx.post(server.url + "/v1/completions", content=raw,
                              headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert "not valid JSON" in response.json()["error"]["message"]


def test_a_body_over_the_limit_is_413_and_never_stalls_a_running_stream(chat_model):
    app = build_app(chat_model, served_model_name="tiny", max_model_len=MAX_MODEL_LEN,
                    max_body_bytes=10_000)
    with ServerThread(app) as small:
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 40, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", small.url + "/v1/completions", json=body) as stream:
            started = time.perf_counter()
            big = httpx.post(small.url + "/v1/completions",
                             json={"model": "tiny", "prompt": "x" * 50_000})
            assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
            assert time.perf_counter() - started < 5, "the 413 waited for something"
            chunks = [line for line in stream.iter_lines() if line.startswith("data: {")]
        assert len(chunks) == 40, "the stream beside the big body lost tokens"


def test_poison_requests_among_live_streams_leave_the_others_correct(server, reference):
    """Requests that used to fail a step for everyone, sent while others stream: each bad one is
    refused alone and the streams finish with the same text as alone."""
    prompt = [5, 6, 7, 8]
    alone = reference.generate([prompt],
                               SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                               use_tqdm=False)[0].outputs[0].token_ids
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    # a lone surrogate, as JSON can carry it
    poisons = ['{"model": "tiny", "prompt": "a\\ud800b"}',
               json.dumps({"model": "tiny", "prompt": "hi", "top_k": 2**63, "temperature": 1.0,
                           "max_tokens": 3}),
               json.dumps({"model": "tiny", "prompt": "hi", "temperature": 10**400})]
    results = {}

    def good(i):
        results[i] = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()

    threads = [threading.Thread(target=good, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    codes = [httpx.post(server.url + "/v1/completions", content=p, timeout=60,
                        headers={"content-type": "application/json"}).status_code for p in poisons]
    for thread in threads:
        thread.join()
    assert codes[0] == 400 and codes[2] == 400, codes
    assert codes[1] == 200, "a top_k beyond the vocabulary keeps the whole vocabulary"
    assert all(r["choices"][0]["token_ids"] == alone for r in results.values())
    wait_until_idle(server)
    assert engine_of(server).engine.kv.num_used_blocks() == 0


@pytest.mark.parametrize("flags, message", [
    (["--port", "99999"], "is not a TCP port"),
    (["--max-queue-len", "0"], "--max-queue-len 0 would refuse"),
    (["--max-body-bytes", "0"], "--max-body-bytes 0"),])
def test_the_servers_own_flags_are_checked_before_the_model_loads(
    monkeypatch, capsys, flags, message):
    monkeypatch.setattr(minicb.serving.server, "build_app",
                        lambda **kw: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit):
        minicb.serving.server.main(flags)
    assert message in capsys.readouterr().err


def test_chat_works_out_of_the_box_with_the_shipped_model():
    with ServerThread(build_app(None, served_model_name="minicb", max_model_len=256)) as shipped:
        client = openai.OpenAI(base_url=shipped.url + "/v1", api_key="none")
        reply = client.chat.completions.create(
            model="minicb", max_tokens=8, temperature=0,
            messages=[{"role": "user", "content": "Write a Python add."}])
        assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens >= 1


def test_idle_and_slow_connections_are_closed_and_health_still_answers(chat_model):
    import socket

    app = build_app(chat_model, served_model_name="tiny", max_model_len=MAX_MODEL_LEN)
    with ServerThread(app, timeout_keep_alive=1) as quiet:
        idle = socket.create_connection(("127.0.0.1", quiet.port))
        slow = socket.create_connection(("127.0.0.1", quiet.port))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")      # and never the rest
        started = time.perf_counter()
        for sock in (idle, slow):
            sock.settimeout(15)
            try:
                closed = sock.recv(1024) == b""
            except TimeoutError:
                closed = False
            assert closed, "an idle or slow connection stayed open"
        assert time.perf_counter() - started < 10
        assert httpx.get(quiet.url + "/health").json()["status"] == "ok"


def test_a_huge_prompt_is_tokenised_off_the_engine_thread_without_stalling_a_stream(server):
    """A prompt of 900,000 characters (under the body limit, far over max_model_len) is refused
    with 400 after tokenising; a stream running meanwhile keeps its pace: its longest gap
    between tokens stays within twice (plus scheduling noise) its longest gap when alone."""
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 60, "ignore_eos": True,
            "stream": True}

    def longest_gap(during=None) -> float:
        times = []
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.perf_counter())
                    if len(times) == 5 and during is not None:
                        during.start()
        return max(b - a for a, b in zip(times[5:], times[6:]))

    alone = longest_gap()
    refused = {}
    big = threading.Thread(target=lambda: refused.update(response=httpx.post(
        server.url + "/v1/completions",
        json={"model": "tiny", "prompt": "def f(x): return x\n" * 45_000}, timeout=120)))
    together = longest_gap(during=big)
    big.join()
    assert refused["response"].status_code == 400 and "max_model_len" in refused["response"].text
    assert together <= 2 * alone + 0.25, (f"the stream stalled: longest gap {together:.3f} s, "
                                          f"alone {alone:.3f} s")


def test_continuous_usage_and_content_parts_as_load_testers_send_them(server):
    """guidellm asks for usage in every chunk (stream_options.continuous_usage_stats, vLLM's
    extension) and sends chat content as a list of text parts."""
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 6, "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as stream:
        chunks = [json.loads(line[6:]) for line in stream.iter_lines()
                  if line.startswith("data: {")]
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert counts == sorted(counts) and counts[-1] == 6 and all(c["usage"]["prompt_tokens"] == 3
                                                                for c in chunks)
    parts = {"model": "tiny", "max_tokens": 3, "messages": [
        {"role": "user",
         "content": [{"type": "text", "text": "def add"}, {"type": "text", "text": "(a, b):"}]}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=parts).status_code == 200
    parts["messages"][0]["content"] = [{"type": "image_url", "image_url": {"url": "x"}}]
    refused = httpx.post(server.url + "/v1/chat/completions", json=parts)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"


# the bodies vLLM's router sends after parsing a client's request into its own struct: every
# extension field at its default
ROUTER_COMPLETION = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0,
                     "stream": False, "echo": False, "no_stop_trim": False, "ignore_eos": False,
                     "skip_special_tokens": True, "return_hidden_states": False}
ROUTER_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
               "stream": False, "max_tokens": 6, "logprobs": False, "no_stop_trim": False,
               "ignore_eos": False, "continue_final_message": False, "skip_special_tokens": True,
               "separate_reasoning": True, "stream_reasoning": True,
               "return_hidden_states": False, "include_reasoning": True}


def _answer(response, chat: bool) -> str:
    assert response.status_code == 200, response.text
    first = response.json()["choices"][0]
    return first["message"]["content"] if chat else first["text"]


@pytest.mark.parametrize("path, body, plain_fields", [
    ("/v1/completions", ROUTER_COMPLETION, ("model", "prompt", "max_tokens", "temperature")),
    ("/v1/chat/completions", ROUTER_CHAT, ("model", "messages", "max_tokens", "temperature"))])
def test_a_routers_body_gets_the_same_answer_as_the_plain_one(server, path, body, plain_fields):
    chat = "chat" in path
    routed = httpx.post(server.url + path, json=body, timeout=60)
    plain = httpx.post(server.url + path, json={k: body[k] for k in plain_fields}, timeout=60)
    assert _answer(routed, chat) == _answer(plain, chat) != ""
    # SGLang's router renames max_tokens to max_completion_tokens: the same answer
    renamed = {k: v for k, v in body.items() if k != "max_tokens"} | {"max_completion_tokens": 6}
    assert _answer(httpx.post(server.url + path, json=renamed, timeout=60), chat) \
        == _answer(plain, chat)


def test_max_completion_tokens_bounds_the_answer(server):
    body = {"model": "tiny", "prompt": [5, 6], "max_completion_tokens": 7, "ignore_eos": True}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.json()["usage"]["completion_tokens"] == 7
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 5, "ignore_eos": True}
    response = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60)
    assert response.json()["usage"]["completion_tokens"] == 5


def test_unknown_fields_are_ignored_and_named_in_one_log_line(server, caplog):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "temperature": 0,
            "no_such_field": 1, "lora_path": "x"}
    with caplog.at_level("WARNING", logger="minicb.serving"):
        response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    plain = httpx.post(server.url + "/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": "hi", "max_tokens": 3, "temperature": 0})
    assert _answer(response, False) == _answer(plain, False)
    lines = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(lines) == 1 and "lora_path" in lines[0] and "no_such_field" in lines[0]


@pytest.mark.parametrize("endpoint, fields, param, words", [
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs",
     "top_logprobs must be an integer from 0 to 20"),
    ("completions", {"echo": True, "logprobs": 21}, "logprobs", "logprobs must be"),
    ("completions", {"max_completion_tokens": 4, "min_tokens": 5}, "min_tokens",
     "cannot exceed max_tokens"),
    ("completions", {"logit_bias": {"99999": 1}}, "logit_bias", "outside the vocabulary"),
    ("chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}},
     "response_format", "cannot be compiled")])
def test_a_range_samplingparams_refuses_is_a_400_naming_the_clients_field(server, endpoint,
                                                                          fields, param, words):
    """The ranges live in SamplingParams alone: its refusal reaches the client as a 400 whose
    param is the field the client sent (a chat's top_logprobs is SamplingParams.logprobs)."""
    body = {"model": "tiny", "max_tokens": 2} | (
        {"messages": [{"role": "user", "content": "hi"}]} if endpoint.startswith("chat")
        else {"prompt": "hi"}) | fields
    response = httpx.post(f"{server.url}/v1/{endpoint}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize("field, value, words", [
    ("return_hidden_states", True, "text and token ids only"),
    ("tools", [{"type": "function", "function": {"name": "f"}}], "not trained to call tools"),
    ("top_logprobs", 2, "needs 'logprobs': true"),
    ("echo", True, "/v1/completions"),
    ("continue_final_message", True, "send false")])
def test_a_chat_feature_this_server_cannot_honour_is_refused_naming_it(server, field, value,
                                                                       words):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], field: value}
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field and words in error["message"]


def test_echo_puts_the_prompt_in_front_streamed_or_not(server, reference):
    body = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 5, "temperature": 0}
    plain = _answer(httpx.post(server.url + "/v1/completions", json=body, timeout=60), False)
    echoed = _answer(httpx.post(server.url + "/v1/completions", json=body | {"echo": True},
                                timeout=60), False)
    assert echoed == "def add(a, b):" + plain
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    chunks = client.completions.create(**body, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == echoed
    ids = httpx.post(server.url + "/v1/completions", timeout=60,
                     json=body | {"prompt": [5, 6, 7], "echo": True}).json()["choices"][0]["text"]
    prompt_text = reference.llm_engine.tokenizer.decode([5, 6, 7], skip_special_tokens=True)
    assert ids.startswith(prompt_text)


def test_skip_special_tokens_false_keeps_them_in_the_text_echoed_generated_and_streamed(
        server, reference):
    tokenizer = reference.llm_engine.tokenizer
    eos = tokenizer.eos_token_id
    body = {"model": "tiny", "prompt": [5, eos, 6], "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "echo": True, "return_token_ids": True}
    kept = httpx.post(server.url + "/v1/completions", timeout=60,
                      json=body | {"skip_special_tokens": False}).json()["choices"][0]
    dropped = httpx.post(server.url + "/v1/completions", timeout=60,
                         json=body).json()["choices"][0]
    marker = tokenizer.decode([eos])
    assert marker and marker in kept["text"] and marker not in dropped["text"]
    assert kept["token_ids"] == dropped["token_ids"]             # the same tokens, other text
    assert kept["text"] == tokenizer.decode([5, eos, 6], skip_special_tokens=False) \
        + tokenizer.decode(kept["token_ids"], skip_special_tokens=False)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    chunks = client.completions.create(**{k: v for k, v in body.items() if k in (
        "model", "prompt", "max_tokens", "temperature", "echo")}, stream=True,
        extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert "".join(c.choices[0].text for c in chunks if c.choices) == kept["text"]


def test_the_routers_probes_are_answered(server):
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        response = httpx.get(server.url + path)
        assert response.status_code == 200, path
        assert response.json()["served_model_name"] == "tiny"
    assert httpx.get(server.url + "/get_server_info").json()["max_model_len"] == MAX_MODEL_LEN
    assert httpx.get(server.url + "/get_load").json()["load"] == engine_of(server).num_running \
        + engine_of(server).num_waiting


SPEC_METRICS = ["minicb_spec_decode_num_draft_tokens_total",
                "minicb_spec_decode_num_accepted_tokens_total"]


@pytest.mark.parametrize("speculative", [False, True], ids=["off", "ngram"])
def test_metrics_count_speculative_tokens(tiny_llama, speculative):
    knobs = dict(speculative_method="ngram", num_speculative_tokens=4,
                 prompt_lookup_min=1) if speculative else {}
    app = build_app(tiny_llama, served_model_name="tiny", max_model_len=MAX_MODEL_LEN,
                    max_num_seqs=2, **knobs)
    with ServerThread(app) as server:
        phrase = [5, 6, 7, 8, 9]
        for _ in range(2):
            httpx.post(server.url + "/v1/completions", json={
                "model": "tiny", "prompt": phrase * 4, "max_tokens": 24, "temperature": 0,
                "ignore_eos": True}, timeout=60).raise_for_status()
        metrics = scrape(server)
    drafted, accepted = (metrics[name] for name in SPEC_METRICS)
    if speculative:
        assert drafted > 0 and 0 <= accepted <= drafted
    else:
        assert drafted == accepted == 0

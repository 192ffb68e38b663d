"""The OpenAI-compatible server over loopback, serving the shipped default model: the official
openai client (plain and streamed), 64 concurrent streams, clients that hang up, bad requests,
overload, /metrics."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import openai
import pytest
from serving_common import SIMPLE_CHAT_TEMPLATE, checkpoint_copy, run

from minicb import LLM, SamplingParams, default_model_path
from minicb.server import ServerThread, build_app

MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> str:
    """The default model, its tokenizer given a simple chat template (it ships without one)."""
    return checkpoint_copy(default_model_path(), tmp_path_factory.mktemp("chat-model"),
                           chat_template=SIMPLE_CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def server(chat_model):
    app = build_app(chat_model, served_model_name="tiny", max_model_len=MAX_MODEL_LEN, max_num_seqs=16)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def engine_of(server):
    return server.app.state.engine


def wait_until_idle(server, timeout: float = 60.0) -> None:
    engine, deadline = engine_of(server), time.monotonic() + timeout
    while engine.num_running or engine.num_waiting or engine.engine.requests:
        assert time.monotonic() < deadline, "the server did not go idle"
        time.sleep(0.02)


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
    options = dict(model="tiny", prompt=prompt, max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    whole = client.completions.create(**options)
    chunks = list(client.completions.create(**options, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_stop_string_cuts_streamed_and_plain_text_alike(client):
    options = dict(model="tiny", prompt="class Point:", max_tokens=30, temperature=0)
    full = client.completions.create(**options).choices[0].text
    clean = [i for i in range(4, len(full) - 2) if "\ufffd" not in full[i:i + 2] and full[i:i + 2].strip()]
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
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    llm = LLM(chat_model, max_model_len=MAX_MODEL_LEN)
    rendered = "<|user|>write add\n<|assistant|>"
    expected = llm.generate(rendered, SamplingParams(max_tokens=10, temperature=0), use_tqdm=False)[0]
    assert whole.choices[0].message.content == expected.outputs[0].text
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)


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
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
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
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert engine.engine.kv.num_used_blocks() > 0
    # leaving the block closed the connection after one chunk of 200
    wait_until_idle(server)
    assert engine.stats.finished["abort"] == aborted_before + 1
    assert engine.engine.kv.num_used_blocks() == 0


def test_a_non_streaming_client_that_gives_up_is_aborted_too(server):
    engine = engine_of(server)
    aborted_before = engine.stats.finished["abort"]
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.3)
    wait_until_idle(server)
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
    ({"model": "gpt-4", "prompt": "hi"}, "model"),
    ({"model": "tiny", "prompt": "hi", "n": 2}, "n"),
]


@pytest.mark.parametrize("body, param", BAD_REQUESTS, ids=[p for _, p in BAD_REQUESTS])
def test_a_bad_request_gets_400_and_the_next_one_succeeds(server, body, param):
    response = httpx.post(server.url + "/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    good = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1


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


def test_overload_gets_503_with_retry_after_and_chat_without_template_gets_400():
    app = build_app(None, served_model_name="tiny", scheduler="naive", max_num_seqs=1, max_queue_len=1,
                    max_model_len=MAX_MODEL_LEN)
    long_body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "stream": True, "ignore_eos": True}
    short_body = {"model": "tiny", "prompt": [8, 9], "max_tokens": 2}
    with ServerThread(app) as server, \
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

"""What a client asks of the sampler through the server, read back through real clients: log-
probabilities (the prompt's too, in the shape lm-evaluation-harness parses, against transformers'
log-softmax), penalties, logit bias, min_p, min_tokens, and structured outputs through the openai
SDK's own types (`chat.completions.parse` with a Pydantic model, `logprobs.content`)."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
import torch

from minicb import LLM, SamplingParams, default_model_path
from minicb.serving.openai_logprobs import LOGPROB_FLOOR
from minicb.serving.server import ServerThread, build_app

MAX_MODEL_LEN = 256
PROMPT = "import os\n\ndef main(path):\n    for name in os.listdir(path):\n"
# float32 on one CPU: the engine's packed step and transformers' forward sum in other orders
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def server():
    app = build_app(default_model_path(), served_model_name="m", max_model_len=MAX_MODEL_LEN,
                    max_num_seqs=8)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference() -> LLM:
    """The same model offline."""
    return LLM(default_model_path(), max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def hf():
    """transformers' model and tokenizer on the same weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def hf_prompt_logprobs(hf, token_ids: list[int]) -> torch.Tensor:
    """log-softmax over the vocabulary at every position: row p predicts token p + 1."""
    model, _ = hf
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().log_softmax(-1)


def lm_eval_parse(response: dict, ctxlen: int, generated: int) -> tuple[float, bool]:
    """lm-evaluation-harness's LocalCompletionsAPI.parse_logprobs (lm_eval 0.4.13), for one
    choice: the continuation's summed logprob and whether each of its tokens was the greedy one.
    lm_eval asks max_tokens=1 and drops the one generated token ([ctxlen:-1]); with max_tokens=0
    there is none to drop."""
    choice = response["choices"][0]["logprobs"]
    end = -1 if generated else None
    token_logprobs = choice["token_logprobs"][ctxlen:end]
    top_logprobs = choice["top_logprobs"][ctxlen:end]
    is_greedy = all(token == max(top.values()) for token, top in zip(token_logprobs, top_logprobs))
    return sum(token_logprobs), is_greedy


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_logprobs_are_the_prompts_log_softmax_in_the_shape_lm_eval_parses(server, hf,
                                                                              max_tokens):
    _, tokenizer = hf
    context, continuation = "import os\n\npath = os.path.", "join(root, name)"
    context_ids = tokenizer.encode(context)
    ids = tokenizer.encode(context + continuation)
    body = {"model": "m", "prompt": [ids], "temperature": 0, "max_tokens": max_tokens,
            "logprobs": 1, "seed": 1234, "echo": True}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    choice = response["choices"][0]
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(logprobs["tokens"]) == len(ids) + max_tokens
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert choice["text"].startswith(tokenizer.decode(ids))
    assert response["usage"]["completion_tokens"] == max_tokens
    assert choice["finish_reason"] == "length"
    # every prompt position against transformers
    reference = hf_prompt_logprobs(hf, ids)
    expected = reference[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    got = torch.tensor(logprobs["token_logprobs"][1:len(ids)])
    assert torch.allclose(got, expected, atol=TOLERANCE), (got - expected).abs().max()
    for position in range(1, len(ids)):
        top = logprobs["top_logprobs"][position]
        best = reference[position - 1].max().item()
        # the most likely token and the prompt's own: one entry or two
        assert 1 <= len(top) <= 2 and abs(max(top.values()) - best) < TOLERANCE
    # what lm-eval computes from it equals the same sum from transformers
    summed, is_greedy = lm_eval_parse(response, len(context_ids), max_tokens)
    expected_sum = expected[len(context_ids) - 1:].sum().item()
    assert abs(summed - expected_sum) < 10 * TOLERANCE
    continuation_rows = reference[len(context_ids) - 1:-1]
    assert is_greedy == bool((continuation_rows.argmax(-1) == torch.tensor(
        ids[len(context_ids):])).all())
    # offsets run through the echoed text, token by token
    offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
    assert offsets[0] == 0 and all(offsets[i + 1] == offsets[i] + len(tokens[i])
                                   for i in range(len(tokens) - 1))


def test_max_tokens_0_without_echo_is_an_empty_answer(server):
    body = {"model": "m", "prompt": "def add(a, b):", "max_tokens": 0}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert response["choices"][0]["text"] == "" and response["usage"]["completion_tokens"] == 0
    assert response["choices"][0]["finish_reason"] == "length"


def test_completion_logprobs_streamed_equal_the_plain_answer(server, hf):
    body = {"model": "m", "prompt": PROMPT, "temperature": 0, "max_tokens": 8, "logprobs": 3,
            "echo": True, "ignore_eos": True, "return_token_ids": True}
    plain = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    with httpx.stream("POST", server.url + "/v1/completions", json=body | {"stream": True},
                      timeout=60) as stream:
        chunks = [json.loads(line[6:]) for line in stream.iter_lines()
                  if line.startswith("data: {")]
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        for key in streamed:
            streamed[key] += chunk["choices"][0]["logprobs"][key]
    assert streamed == plain["choices"][0]["logprobs"]
    assert len(chunks) > 2      # per chunk, not once at the end
    # the output tokens' logprobs: transformers' on the prompt and the tokens chosen
    _, tokenizer = hf
    prompt_ids = tokenizer.encode(PROMPT)
    output = plain["choices"][0]["logprobs"]
    output_ids = plain["choices"][0]["token_ids"]
    reference = hf_prompt_logprobs(hf, prompt_ids + output_ids)
    for i, token_id in enumerate(output_ids):
        row = reference[len(prompt_ids) - 1 + i]
        assert abs(output["token_logprobs"][len(prompt_ids) + i] - row[token_id].item()) < TOLERANCE
        assert len(output["top_logprobs"][len(prompt_ids) + i]) in (3, 4)


def test_chat_logprobs_and_top_logprobs_read_back_through_the_sdk(client, server):
    completion = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=3)
    content = completion.choices[0].logprobs.content
    assert len(content) == completion.usage.completion_tokens == 6 or \
        completion.choices[0].finish_reason == "stop"
    assert "".join(item.token for item in content) == completion.choices[0].message.content
    for item in content:
        assert len(item.top_logprobs) == 3
        values = [top.logprob for top in item.top_logprobs]
        assert values == sorted(values, reverse=True)
        # greedy: the chosen token is the most likely one
        assert item.logprob == pytest.approx(values[0]) and item.token == item.top_logprobs[0].token
        assert item.bytes == list(item.token.encode())
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=3, stream=True)
    streamed = [item for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for item in chunk.choices[0].logprobs.content]
    assert [(i.token, round(i.logprob, 5)) for i in streamed] == \
        [(i.token, round(i.logprob, 5)) for i in content]


def test_completions_echo_logprobs_through_the_sdk(client):
    completion = client.completions.create(model="m", prompt="import sys\nsys.", max_tokens=0,
                                           echo=True, logprobs=1)
    logprobs = completion.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and all(
        isinstance(v, float) for v in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens) == completion.choices[0].text == "import sys\nsys."


def test_penalties_bias_min_p_and_min_tokens_give_the_engines_own_tokens(server, reference):
    """Each field reaches SamplingParams: the server's tokens equal LLM.generate's with the same
    settings, and differ from the plain run where the setting must change something."""
    engine = reference.llm_engine
    prompt_ids = engine.tokenizer.encode(PROMPT)
    base = {"model": "m", "prompt": prompt_ids, "max_tokens": 12, "temperature": 0,
            "return_token_ids": True}

    def served(**fields) -> list[int]:
        response = httpx.post(server.url + "/v1/completions", json=base | fields, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["token_ids"]

    plain = served()
    eos = sorted(engine.eos_token_ids)[0]
    cases = [({"presence_penalty": 1.5}, {"presence_penalty": 1.5}),
             ({"frequency_penalty": 2.0}, {"frequency_penalty": 2.0}),
             ({"repetition_penalty": 1.8}, {"repetition_penalty": 1.8}),
             ({"logit_bias": {str(plain[0]): -100}}, {"logit_bias": {plain[0]: -100.0}}),
             ({"min_p": 0.3, "temperature": 1.0, "seed": 7},
              {"min_p": 0.3, "temperature": 1.0, "seed": 7}),
             ({"min_tokens": 12, "logit_bias": {str(eos): 100}},
              {"min_tokens": 12, "logit_bias": {eos: 100.0}})]
    for fields, params in cases:
        ours = served(**fields)
        offline = reference.generate([prompt_ids], SamplingParams(**{
            "max_tokens": 12, "temperature": 0} | params), use_tqdm=False)[0].outputs[0].token_ids
        assert ours == offline, fields
    assert served(logit_bias={str(plain[0]): -100})[0] != plain[0]
    # min_tokens holds EOS back though a bias of +100 pushes it: 12 tokens, none of them EOS
    forced = served(min_tokens=12, logit_bias={str(eos): 100})
    assert len(forced) == 12 and eos not in forced
    assert served(max_tokens=4, logit_bias={str(eos): 100}) == [eos]


class Module(pydantic.BaseModel):
    name: Literal["os", "sys", "json", "re"]
    functions: list[Literal["path", "exit", "loads", "compile", "listdir"]] = pydantic.Field(
        max_length=3)
    stable: bool


def test_sdk_parse_with_a_pydantic_model_gets_a_parsed_object(client):
    """The SDK turns the model into a strict json_schema response_format. A model this small,
    free to put any whitespace between JSON tokens, writes newlines until max_tokens (an output
    cut short, which parse refuses): vLLM's disable_any_whitespace option, sent beside it in
    structured_outputs, keeps one space at most."""
    completion = client.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "describe the os module as JSON"}],
        response_format=Module, max_tokens=120, temperature=0,
        extra_body={"structured_outputs": {"disable_any_whitespace": True}})
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, Module)
    assert Module.model_validate_json(choice.message.content) == choice.message.parsed


SCHEMA = {"type": "object", "properties": {
    "module": {"type": "string", "pattern": "^[a-z]{1,8}$"},
    "version": {"type": "number", "minimum": 0, "maximum": 10},
    "tags": {"type": "array", "items": {"enum": ["io", "text", "math"]}, "maxItems": 3},
    "owner": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0,
                                                     "maximum": 9999}}, "required": ["id"],
              "additionalProperties": False}},
    "required": ["module", "version", "tags", "owner"], "additionalProperties": False}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_a_json_schema_output_that_stopped_validates(server, path, temperature):
    body = {"model": "m", "max_tokens": 160, "temperature": temperature, "seed": 3, "n": 3,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "module", "schema": SCHEMA}},
            "structured_outputs": {"disable_any_whitespace": True}}
    body |= ({"prompt": "config = "} if path == "/v1/completions"
             else {"messages": [{"role": "user", "content": "a module as JSON"}]})
    response = httpx.post(server.url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    stopped = 0
    for choice in response.json()["choices"]:
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        assert choice["finish_reason"] in ("stop", "length")
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(text), SCHEMA)
            stopped += 1
    assert stopped >= 1


def test_choice_regex_and_json_object_constrain_the_text(server):
    url = server.url + "/v1/completions"
    base = {"model": "m", "prompt": "import os\nmode = ", "max_tokens": 40, "temperature": 1.0,
            "seed": 5, "n": 4}
    choices = ["'read'", "'write'", "'append'"]
    answer = httpx.post(url, json=base | {"structured_outputs": {"choice": choices}}).json()
    assert all(c["text"] in choices and c["finish_reason"] == "stop" for c in answer["choices"])
    answer = httpx.post(url, json=base | {"structured_outputs": {"regex": r"0o[0-7]{3}"}}).json()
    assert all(c["text"][:2] == "0o" and len(c["text"]) == 5 for c in answer["choices"])
    answer = httpx.post(url, json=base | {"max_tokens": 60, "response_format": {
        "type": "json_object"}, "structured_outputs": {"disable_any_whitespace": True}}).json()
    for choice in answer["choices"]:
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["text"]), dict)


def test_an_output_cut_by_max_tokens_ends_length_not_an_error(server):
    body = {"model": "m", "prompt": "x = ", "max_tokens": 3, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "s", "schema": SCHEMA}}}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_constrained_and_plain_requests_in_one_batch_leave_the_plain_ones_unchanged(server):
    url = server.url + "/v1/completions"
    plain = {"model": "m", "prompt": PROMPT, "max_tokens": 16, "temperature": 0,
             "ignore_eos": True, "logprobs": 2}
    alone = httpx.post(url, json=plain).json()["choices"][0]
    with httpx.Client(timeout=120) as http:
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            constrained = [pool.submit(http.post, url, json={
                "model": "m", "prompt": "x = ", "max_tokens": 40, "temperature": 1.0, "seed": i,
                "structured_outputs": {"json": SCHEMA}}) for i in range(4)]
            together = pool.submit(http.post, url, json=plain)
            assert all(f.result().status_code == 200 for f in constrained)
            beside = together.result().json()["choices"][0]
    assert beside["text"] == alone["text"]
    assert beside["logprobs"]["token_logprobs"] == pytest.approx(
        alone["logprobs"]["token_logprobs"], abs=TOLERANCE)


def test_a_constraint_that_cannot_compile_is_a_400_naming_the_field_and_the_reason(server):
    bad_schema = {"name": "x", "schema": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 5, "maximum": 1}}}}
    for field, value in (("response_format", {"type": "json_schema", "json_schema": bad_schema}),
                         ("structured_outputs", {"regex": "a{2,1}"}),
                         ("structured_outputs", {"grammar": "root ::= missing_rule"})):
        response = httpx.post(server.url + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}], field: value})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and "cannot be compiled" in error["message"], error
    assert not server.app.state.engine.engine.requests
    assert httpx.post(server.url + "/v1/completions", json={
        "model": "m", "prompt": "hi", "max_tokens": 2}).status_code == 200


def test_a_banned_token_logprob_is_finite_json(server):
    """-inf is not JSON: a token that a bias of -100 or a constraint rules out still reads as a
    number (vLLM's -9999.0)."""
    body = {"model": "m", "prompt": "import os\nmode = ", "max_tokens": 1, "temperature": 0,
            "logprobs": 5, "structured_outputs": {"choice": ["'read'"]}}
    response = httpx.post(server.url + "/v1/completions", json=body)
    assert response.status_code == 200
    values = [v for top in response.json()["choices"][0]["logprobs"]["top_logprobs"]
              for v in top.values()]
    assert all(isinstance(v, float) and v >= LOGPROB_FLOOR for v in values)


def test_the_published_schema_lists_every_new_field(server):
    openapi = httpx.get(server.url + "/openapi.json").json()
    for path, fields in (("/v1/completions", ["logprobs", "echo", "max_tokens"]),
                         ("/v1/chat/completions", ["logprobs", "top_logprobs"])):
        schema = openapi["paths"][path]["post"]["requestBody"]["content"][
            "application/json"]["schema"]["properties"]
        for name in fields + ["presence_penalty", "frequency_penalty", "repetition_penalty",
                              "logit_bias", "min_p", "min_tokens", "response_format",
                              "structured_outputs"]:
            assert name in schema, (path, name)
        validator = jsonschema.Draft202012Validator({"type": "object", "properties": schema})
        assert validator.is_valid({"logit_bias": {"4095": 100}})
        assert not validator.is_valid({"logit_bias": {"4096": 1}})
        assert not validator.is_valid({"logit_bias": {"007": 1}})

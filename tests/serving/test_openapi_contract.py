"""The OpenAPI document is the server's contract: what it allows is served, what it forbids is
refused with OpenAI's error body, and every status the server answers is documented.

Two checks. In process, always: bodies generated from the published schema (validated by
jsonschema) must be served, and bodies with one field broken must be refused with a 4xx that
the document lists, in OpenAI's error shape. Then schemathesis, a third-party API fuzzer, with
every one of its checks against the same server, installed into .venv-schemathesis if it is
not there (`make schemathesis-setup`; about a minute, once), a bounded number of cases. The
server runs with an API key, which the clients here and schemathesis send; schemathesis's
ignored_auth check also sends every operation without it and wants the 401 the document lists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis_hooks import breaks_a_rule_beyond_the_schema, most_prompt_tokens

from minicb.serving.openai_protocol import ERROR_SCHEMA
from minicb.serving.server import ServerThread, build_app

REPO = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 128
CASES = 60                # per endpoint and kind
KEY = "contract-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served():
    app = build_app(None, served_model_name="minicb", max_model_len=MAX_MODEL_LEN, max_num_seqs=8,
                    api_keys=[KEY])
    # one client for every request (an httpx.post each would build a TLS context each time)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, headers=AUTH,
                                                   timeout=60) as client:
        yield client, client.get("/openapi.json").json()


def body_schema(openapi: dict, path: str) -> dict:
    return openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def test_the_document_states_error_bodies_bounds_and_metrics_as_text(served):
    _, openapi = served
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = openapi["paths"][path]["post"]["responses"]
        for status in ("400", "404", "413", "503"):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == ERROR_SCHEMA, (path, status)
        assert "text/event-stream" in responses["200"]["content"]
        properties = body_schema(openapi, path)["properties"]
        # the bounds the server enforces, where a schema-valid request used to be refused
        bounds = json.dumps(properties)
        assert '"minLength": 1' in bounds                      # empty stop strings, prompts
        assert json.dumps(properties["temperature"]).count('"maximum": 100') == 1
        assert '{"enum": [-1]}' in json.dumps(properties["top_k"])
    metrics = openapi["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]


def _fits(body: dict) -> bool:
    """Whether the context rule (not expressible in a schema) surely lets the body through."""
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 1
    return (most_prompt_tokens(body) + max_tokens <= MAX_MODEL_LEN
            and not breaks_a_rule_beyond_the_schema(body, MAX_MODEL_LEN))


def _valid_bodies(schema: dict) -> st.SearchStrategy:
    """Small bodies built field by field from the schema's own properties, kept when jsonschema
    says they are valid (so a schema that allows something the server refuses shows up)."""
    validator = jsonschema.Draft202012Validator(schema)
    simple = {
        "model": st.just("minicb"), "max_tokens": st.integers(1, 8),
        "max_completion_tokens": st.integers(1, 8), "temperature": st.floats(0, 100),
        "top_p": st.floats(1e-6, 1), "top_k": st.sampled_from([-1, 1, 2, 50, 10**6]),
        "seed": st.integers(0, 2**53 - 1), "n": st.integers(1, 3),
        "stop": st.one_of(st.text(min_size=1, max_size=4), st.lists(
            st.text(min_size=1, max_size=4), max_size=3)),
        "stop_token_ids": st.lists(st.integers(0, 5000), max_size=3),
        "stream": st.booleans(), "ignore_eos": st.booleans(), "echo": st.booleans(),
        "user": st.text(max_size=5), "logprobs": st.sampled_from([False, True, 0, 2]),
        "top_logprobs": st.integers(0, 3), "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.5, 2),
        "min_p": st.floats(0, 1), "logit_bias": st.dictionaries(
            st.integers(0, 4095).map(str), st.floats(-100, 100), max_size=3),
        "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
        "structured_outputs": st.sampled_from([{"choice": ["yes", "no"]}, {"json_object": True}]),
        "skip_special_tokens": st.booleans(), "include_reasoning": st.booleans(),
        "no_stop_trim": st.just(False), "return_hidden_states": st.just(False),
    }
    prompt = st.one_of(st.text(min_size=1, max_size=30),
                       st.lists(st.integers(0, 4095), min_size=1, max_size=20))
    messages = st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["system", "user", "assistant"]),
        "content": st.text(max_size=30)}), min_size=1, max_size=3)
    required = ({"prompt": prompt} if "prompt" in schema["properties"]
                else {"messages": messages})
    optional = {k: v for k, v in simple.items() if k in schema["properties"]}
    return st.fixed_dictionaries(required, optional=optional).filter(validator.is_valid)


# one field broken per body: (field, a value the schema forbids)
BROKEN = [("temperature", 100.5), ("temperature", -1), ("top_p", 0), ("top_k", 0), ("top_k", -2),
          ("stop", ""), ("stop", [""]), ("n", 0), ("max_tokens", -1),
          ("max_tokens", MAX_MODEL_LEN), ("max_completion_tokens", MAX_MODEL_LEN),
          ("seed", -1), ("seed", 2**53), ("stream", "yes"), ("logprobs", 21),
          ("return_hidden_states", True), ("skip_special_tokens", "no"), ("tools", [{}]),
          ("response_format", {"type": "xml"}), ("stream_options", False),
          ("user", 5), ("model", 5), ("stop", ["x"] * 33), ("include_reasoning", "yes"),
          ("presence_penalty", 2.5), ("frequency_penalty", -2.5), ("repetition_penalty", 0),
          ("min_p", 1.5), ("min_tokens", -1), ("logit_bias", {"4096": 1}),
          ("logit_bias", {"5": -101}), ("logit_bias", {"05": 1}),
          ("structured_outputs", {"disable_any_whitespace": "yes"}),
          ("structured_outputs", {"regex": "a", "choice": ["b"]}),
          ("structured_outputs", {"choice": []}), ("structured_outputs", {"json": "{}"}),
          ("structured_outputs", {}), ("structured_outputs", {"disable_any_whitespace": True})]
# where the two endpoints differ: a completion may ask for 0 tokens (the prompt's logprobs, with
# echo) and for logprobs as a number; a chat asks for logprobs with true and top_logprobs
BROKEN_BY_PATH = {"/v1/completions": [("logprobs", True)],
                  "/v1/chat/completions": [("max_tokens", 0), ("logprobs", 2),
                                           ("top_logprobs", 21)]}


@pytest.mark.slow   # hypothesis over both schemas, about a minute: make test runs it
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_what_the_schema_allows_is_served_and_what_it_forbids_is_refused(served, path):
    client, openapi = served
    schema = body_schema(openapi, path)
    documented = set(openapi["paths"][path]["post"]["responses"])

    @settings(max_examples=CASES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(_valid_bodies(schema))
    def allowed(body):
        if not _fits(body):
            return
        response = client.post(path, json=body)
        assert response.status_code == 200, f"{body!r} refused: {response.text[:300]}"

    allowed()
    base = ({"prompt": "def add(a, b):"} if "prompt" in schema["properties"]
            else {"messages": [{"role": "user", "content": "hi"}]}) | {"max_tokens": 2}
    for field, value in BROKEN + BROKEN_BY_PATH[path]:
        body = base | {field: value}
        assert not jsonschema.Draft202012Validator(schema).is_valid(body), (field, value)
        response = client.post(path, json=body)
        assert 400 <= response.status_code < 500, f"{field}={value!r}: {response.status_code}"
        assert str(response.status_code) in documented
        jsonschema.validate(response.json(), ERROR_SCHEMA)
    # unknown fields are allowed by the schema and ignored by the server
    assert client.post(path, json=base | {"no_such_field": 1}).status_code == 200


def schemathesis_executable() -> Path:
    """.venv-schemathesis/bin/st, installed here if missing (pip, from the package index)."""
    venv = REPO / ".venv-schemathesis"
    st_bin = venv / "bin" / "st"
    if not st_bin.exists():
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        spec = os.environ.get("SCHEMATHESIS_SPEC", "schemathesis==4.32.5")
        install = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", spec],
                                 capture_output=True, text=True)
        assert install.returncode == 0, f"could not install {spec}: {install.stderr[-1000:]}"
        print(f"installed {spec} in {time.perf_counter() - started:.0f} s")
    return st_bin


@pytest.mark.slow
def test_schemathesis_with_every_check_finds_no_failure(served):
    client, _ = served
    st_bin = schemathesis_executable()
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests"),
           "SCHEMATHESIS_HOOKS": "schemathesis_hooks", "MINICB_MAX_MODEL_LEN": str(MAX_MODEL_LEN)}
    schema_url = str(client.base_url.join("/openapi.json"))
    run = subprocess.run([str(st_bin), "run", schema_url, "--checks", "all",
                          "--max-examples", "25", "--request-timeout", "60", "--seed", "1",
                          "--header", f"Authorization: Bearer {KEY}"],
                         capture_output=True, text=True, env=env, timeout=900)
    summary = run.stdout[-3000:]
    assert run.returncode == 0, summary
    assert "No issues found" in summary or "passed" in summary, summary

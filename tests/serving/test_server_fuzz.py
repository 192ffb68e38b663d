"""Fuzz the server from its own OpenAPI document: bodies that follow the published schema, and
bodies that break it (any JSON where a field goes, unknown fields, wrong shapes). Whatever comes
in, the answer is never a 5xx, every error is in OpenAI's shape, and the engine keeps serving
with no KV block left behind. Bounded: a fixed number of cases per endpoint.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from minicb.serving.server import ServerThread, build_app

pytestmark = pytest.mark.slow      # about a minute: make test runs it, make test-fast does not

CASES = 120          # per endpoint and kind (valid / broken): about a minute in all on 2 cores
SCALARS = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | \
    st.text(max_size=20)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4),
                    max_leaves=8)


def from_schema(schema: dict) -> st.SearchStrategy:
    """Values that satisfy a JSON Schema, for the subset the server's request schemas use."""
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(option) for option in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        required = {name: from_schema(properties[name]) for name in schema.get("required", [])}
        optional = {name: from_schema(spec) for name, spec in properties.items() if name
                    not in required}
        return st.fixed_dictionaries(required, optional=optional)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 8), 8))
    if kind == "string":
        return st.text(max_size=40)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return st.floats(low, schema.get("maximum"), allow_nan=False, allow_infinity=False,
                         exclude_min="exclusiveMinimum" in schema)
    if kind == "boolean":
        return st.booleans()
    return JSON


@pytest.fixture(scope="module")
def served():
    # the shipped model
    app = build_app(None, served_model_name="tiny", max_model_len=256, max_num_seqs=4)
    # one client for the hundreds of cases (an httpx.post each builds a TLS context each time,
    # about 25 ms of CPU)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        schema = client.get("/openapi.json").json()
        yield client, schema, app.state.engine


def body_schema(openapi: dict, path: str) -> dict:
    body = openapi["paths"][path]["post"]["requestBody"]
    schema = dict(body["content"]["application/json"]["schema"])
    properties = dict(schema["properties"])
    # keep each case quick: short generations, few samples, small prompts
    properties["max_tokens"] = {"type": "integer", "minimum": 1, "maximum": 24}
    properties["max_completion_tokens"] = {"type": "integer", "minimum": 1, "maximum": 24}
    properties["n"] = {"type": "integer", "minimum": 1, "maximum": 3}
    return {**schema, "properties": properties}


def check(client, engine, path: str, body) -> None:
    # json.dumps, unlike httpx, writes NaN and Infinity (as many JSON libraries accept them)
    response = client.post(path, content=json.dumps(body),
                           headers={"content-type": "application/json"})
    assert response.status_code < 500, f"{response.status_code} for {body!r}: {response.text[:300]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"], ("not OpenAI's error shape: "
                                                    f"{response.text[:300]}")


ENDPOINTS = ["/v1/completions", "/v1/chat/completions"]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_bodies_that_follow_the_schema(served, path):
    client, openapi, engine = served
    started = time.perf_counter()

    @settings(max_examples=CASES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(from_schema(body_schema(openapi, path)))
    def case(body):
        check(client, engine, path, {**body, "model": "tiny"} if "model" in body else body)

    case()
    assert client.get("/health").json()["status"] == "ok"
    print(f"{CASES} schema-following bodies on {path} in {time.perf_counter() - started:.1f} s")


@pytest.mark.parametrize("path", ENDPOINTS)
def test_bodies_that_break_the_schema(served, path):
    client, openapi, engine = served
    names = sorted(body_schema(openapi, path)["properties"]) + ["no_such_field"]

    @settings(max_examples=CASES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(names), JSON, max_size=6) | JSON)
    @example({"best_of": float("inf")})
    @example({"prompt": "hi", "temperature": float("nan")})
    @example({"prompt": "hi", "top_p": float("-inf")})
    def case(body):
        if isinstance(body, dict):
            body.pop("max_tokens", None)                 # keep generations short
            body["max_tokens"] = 8
        check(client, engine, path, body)

    case()
    deadline = time.monotonic() + 30
    while engine.num_running or engine.num_waiting:
        assert time.monotonic() < deadline, "requests were left running after the fuzzing"
        time.sleep(0.05)
    used, free, _ = engine.kv_usage()
    assert used == 0, f"{used} KV blocks leaked"
    assert client.get("/health").json()["status"] == "ok"

"""API keys on the server (minicb.serving.auth), through the openai SDK and raw HTTP: the right
key (either of two) is served, a wrong one, none, or one in the URL gets OpenAI's 401; every
route but /health needs it, one added later too; the refusal comes before the body is read,
and a flood of refused requests costs the engine nothing while keyed streams run; the OpenAPI
document declares the scheme; a server bound beyond loopback without a key says so."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest

import minicb.serving.server as server_module
from minicb import default_model_path
from minicb.serving.auth import OPEN_PATHS, _HideQueryStrings, exposure_warning, keys_from
from minicb.serving.loadgen import BenchConfig, benchmark
from minicb.serving.server import ServerThread, build_app

KEYS = ["first-key-3f9a", "second-key-c21e"]
WRONG = "wrong-key-77d0"
CHAT = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def server():
    app = build_app(default_model_path(), served_model_name="m", max_model_len=128,
                    max_num_seqs=8, api_keys=KEYS)
    with ServerThread(app) as running:
        yield running


def client(server, key: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, **options)


def assert_401(error: openai.APIStatusError, code: str = "invalid_api_key") -> None:
    assert error.status_code == 401
    body = error.response.json()["error"]
    assert body["code"] == code and body["type"] == "invalid_request_error"
    assert "Authorization: Bearer" in body["message"]
    assert WRONG not in error.response.text and not any(k in error.response.text for k in KEYS)


def test_either_key_is_served_and_no_key_or_a_wrong_one_is_refused(server):
    for key in KEYS:
        sdk = client(server, key)
        text = sdk.completions.create(model="m", prompt="def add(a, b):", max_tokens=4,
                                      temperature=0).choices[0].text
        assert text
        assert sdk.chat.completions.create(model="m", messages=CHAT, max_tokens=2).choices
        assert [m.id for m in sdk.models.list()] == ["m"]
    for key in (WRONG, None, KEYS[0][:-1], KEYS[0] + "x"):   # None: no Authorization header
        sdk = client(server, key or "unsent")
        headers = {"Authorization": openai.omit} if key is None else None
        with pytest.raises(openai.AuthenticationError) as refused:
            sdk.completions.create(model="m", prompt="hi", max_tokens=2, extra_headers=headers)
        assert_401(refused.value)
    for header in (f"Basic {KEYS[0]}", KEYS[0], f"Bearer {KEYS[0]}, Bearer {KEYS[1]}"):
        response = httpx.get(server.url + "/v1/models", headers={"Authorization": header})
        assert response.status_code == 401 and response.headers["www-authenticate"]
    # several Authorization headers (a router adding its own): every one must hold a key
    for second, status in ((KEYS[1], 200), (WRONG, 401)):
        headers = [("Authorization", f"Bearer {KEYS[0]}"), ("Authorization", f"Bearer {second}")]
        assert httpx.get(server.url + "/v1/models", headers=headers).status_code == status


def test_a_key_in_the_query_string_is_refused_even_beside_the_right_header(server):
    with pytest.raises(openai.AuthenticationError) as refused:
        client(server, KEYS[0], default_query={"api_key": KEYS[0]}).models.list()
    assert_401(refused.value, "api_key_in_url")
    headers = {"Authorization": f"Bearer {KEYS[0]}"}
    for query in (f"key={KEYS[1]}", f"x={KEYS[1]}", "token=anything"):
        response = httpx.get(f"{server.url}/v1/models?{query}", headers=headers)
        assert response.status_code == 401 and KEYS[1] not in response.text
    # the access log prints no query string (it may hold a key)
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", f"/v1/models?api_key={KEYS[0]}", "1.1", 401),
                               None)
    _HideQueryStrings().filter(record)
    assert KEYS[0] not in record.getMessage() and "/v1/models?" in record.getMessage()


def test_every_route_but_health_needs_the_key_including_one_added_later(server):
    assert OPEN_PATHS == {"/health"}        # opening another route is a decision made here
    app = server.app
    app.add_api_route("/added-later", lambda: {"ok": True}, methods=["GET"])
    routes = [(method, route.path) for route in app.routes
              for method in sorted(getattr(route, "methods", None) or ["GET"])]
    assert ("GET", "/added-later") in routes and ("GET", "/metrics") in routes
    assert len(routes) >= 12
    headers = {"Authorization": f"Bearer {KEYS[1]}"}
    for method, path in routes + [("GET", "/no-such-route"), ("POST", "/health")]:
        refused = httpx.request(method, server.url + path, json={})
        if path == "/health":
            assert refused.status_code in (200, 405), (method, path)
            continue
        assert refused.status_code == 401, (method, path, refused.status_code)
        if method == "GET":
            served = httpx.get(server.url + path, headers=headers)
            assert served.status_code == (404 if path == "/no-such-route" else 200), path
    assert httpx.get(server.url + "/health").status_code == 200


def test_the_refusal_comes_before_the_body_is_read(server):
    """Headers announcing a 10 MB body (larger than the server takes), no body: the 401 comes
    at once and the connection closes; the server never waited for, read or judged the body."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    b"application/json\r\nContent-Length: 10000000\r\n\r\n{\"prompt\": ")
        started = time.monotonic()
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"invalid_api_key" in answer and time.monotonic() - started < 5


@contextlib.contextmanager
def slow_steps(engine, seconds: float = 0.05):
    runner = engine.engine.runner
    execute = runner.execute
    runner.execute = lambda plan: (time.sleep(seconds), execute(plan))[1]
    try:
        yield
    finally:
        del runner.execute


def test_a_flood_of_refused_requests_costs_the_engine_nothing_while_keyed_streams_run(server):
    engine = server.app.state.engine
    sdk = client(server, KEYS[0])
    prompts = [f"def f{i}(x):" for i in range(4)]

    def stream(prompt: str) -> str:
        chunks = sdk.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0,
                                        stream=True, extra_body={"ignore_eos": True})
        return "".join(c.choices[0].text for c in chunks if c.choices)

    alone = [stream(p) for p in prompts]
    added = []
    add_request = engine.add_request

    async def counted(*args, **kwargs):
        added.append(args[0])
        return await add_request(*args, **kwargs)

    engine.add_request = counted
    rejected = dict(engine.stats.rejected)
    body = {"model": "m", "prompt": "x" * 4000, "max_tokens": 64, "stream": True}
    seen_waiting, statuses = [], []

    def flood(index: int, streams) -> None:
        """Refused requests, one after another, for as long as the keyed streams run."""
        headers = {"Authorization": f"Bearer {WRONG}"} if index % 2 else {}
        path = ("/v1/completions", "/v1/chat/completions", "/metrics")[index % 3]
        while not all(s.done() for s in streams):
            seen_waiting.append(engine.num_waiting + engine.num_running)
            statuses.append(httpx.post(server.url + path, json=body, headers=headers,
                                       timeout=30).status_code)

    try:
        with slow_steps(engine), ThreadPoolExecutor(len(prompts) + 6) as pool:
            streams = [pool.submit(stream, p) for p in prompts]
            floods = [pool.submit(flood, i, streams) for i in range(6)]
            texts = [s.result(timeout=120) for s in streams]
            for f in floods:
                f.result(timeout=60)
    finally:
        del engine.add_request
    assert len(statuses) >= 30 and set(statuses) == {401}, (len(statuses), set(statuses))
    assert texts == alone                                  # the streams finished unharmed
    assert sorted(added) == prompts                        # the engine saw the keyed ones only
    assert max(seen_waiting) <= len(prompts)               # the queue never held a refused one
    assert engine.stats.rejected == rejected
    kv = engine.engine.kv
    assert kv.num_free_blocks() == kv.num_blocks           # and no KV block was taken or kept


def test_the_openapi_document_declares_the_bearer_scheme(server):
    assert httpx.get(server.url + "/openapi.json").status_code == 401
    document = httpx.get(server.url + "/openapi.json",
                         headers={"Authorization": f"Bearer {KEYS[0]}"}).json()
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": document["components"][
            "securitySchemes"]["bearerAuth"]["description"]}
    assert document["security"] == [{"bearerAuth": []}]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if path == "/health":
                assert operation["security"] == []
            else:
                assert "401" in operation["responses"], (method, path)
                # and the server does answer 401 there without a key
                assert httpx.request(method, server.url + path).status_code == 401


def test_keys_come_from_the_flag_and_the_environment_and_exposure_is_warned(monkeypatch,
                                                                           capsys):
    assert keys_from(["a", " b "], {"MINICB_API_KEY": "c,a,,d"}) == ["a", "b", "c", "d"]
    assert exposure_warning("127.0.0.1", []) is None and exposure_warning("::1", []) is None
    assert exposure_warning("localhost", []) is None
    assert exposure_warning("0.0.0.0", ["k"]) is None
    built = {}
    # an app as build_app returns it, as far as main reads it: the served name and the model
    app = SimpleNamespace(state=SimpleNamespace(model_name="minicb", engine=SimpleNamespace(
        model_path="/models/shipped")))
    monkeypatch.setattr(server_module, "build_app", lambda **kw: built.update(kw) or app)
    monkeypatch.setattr(server_module.uvicorn, "run", lambda *a, **kw: None)
    monkeypatch.setenv("MINICB_API_KEY", "env-key")
    server_module.main(["--host", "0.0.0.0", "--api-key", "flag-key"])
    assert built["api_keys"] == ["flag-key", "env-key"]
    # the one line every start prints: the name clients must send, and where
    assert capsys.readouterr().err.splitlines() == [
        "serving model 'minicb' (/models/shipped) at http://0.0.0.0:8000/v1"]
    monkeypatch.delenv("MINICB_API_KEY")
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        server_module.main(["--host", host])
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2 and "without an API key" in lines[0] and host in lines[0]
    server_module.main([])                      # 127.0.0.1, the default: no warning
    assert [line.split(" at ")[0] for line in capsys.readouterr().err.splitlines()] == [
        "serving model 'minicb' (/models/shipped)"] and built["api_keys"] == []


def test_the_load_generator_sends_the_key_from_the_environment(server, monkeypatch):
    """`python -m minicb bench serve` (and the routing benchmarks, which drive it) against a
    keyed server: MINICB_API_KEY's first key goes with every request, and into no result."""
    config = BenchConfig(server.url, model="m", num_prompts=3, input_len=8, output_len=4,
                         disable_tqdm=True, ignore_eos=True)
    monkeypatch.delenv("MINICB_API_KEY", raising=False)
    refused = benchmark(config)
    assert refused["completed"] == 0 and "401" in refused["errors"][0]
    monkeypatch.setenv("MINICB_API_KEY", f"{KEYS[1]},{KEYS[0]}")
    served = benchmark(config)
    assert served["completed"] == 3 and not any(key in str(served) for key in KEYS)

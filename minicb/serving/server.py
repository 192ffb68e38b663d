"""An OpenAI-compatible HTTP server over the async engine (FastAPI + uvicorn).

    python -m minicb serve --model PATH --port 8000 --scheduler continuous --kv-cache paged \
        --enable-prefix-caching --policy priority --max-prefill-tokens-per-step 256

Endpoints: POST /v1/completions, POST /v1/chat/completions (where the tokenizer has a chat
template), GET /v1/models, GET /health, GET /metrics (Prometheus text: requests, tokens, KV
blocks, prefix-cache queries, hits and evictions, latency histograms). Tokens stream as
server-sent events when the request says `"stream": true`. `"n": k` (up to HTTP_MAX_N) returns k
samples as choices 0..k-1 (streamed chunks carry their choice's index); they share the prompt's
KV blocks, sample i uses seed + i when a seed is given, and usage counts the prompt once and the
completion tokens of every choice. Log-probabilities (the prompt's too, with echo), penalties,
logit bias, min_p, min_tokens and structured outputs are read by openai_sampling and written
back in OpenAI's shapes by openai_logprobs. A client that hangs up has its request (every
sample of it) aborted and its KV blocks freed before the next step; a bad request gets HTTP 400
and an OpenAI-style error object; too many waiting requests get 503 with Retry-After.

The continuous scheduler's policy knobs are flags (--policy, --step-order,
--max-prefill-tokens-per-step, --max-wait-steps, --watermark-blocks; see benchmarks/policies.md).
Under --policy priority a request may carry an integer `"priority"` (vLLM's extension: lower is
served first, default 0); a server with another policy refuses a priority other than 0, since it
would be ignored.

With `--api-key KEY` (several allowed) or MINICB_API_KEY, every route but GET /health needs
`Authorization: Bearer KEY` (minicb.serving.auth); without one, binding beyond loopback prints a
warning.

From a notebook or a test, run it in a background thread:

    with ServerThread(build_app(model=path, max_num_seqs=8, api_keys=["secret"])) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="secret")
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from minicb.config import EngineConfig
from minicb.engine.llm_engine import LLMEngine
from minicb.serving.async_engine import AsyncLLMEngine, QueueFullError, RequestStream, StreamDelta
from minicb.serving.auth import (
    APIKeyMiddleware,
    exposure_warning,
    hide_query_strings,
    keys_from,
    secure_openapi,
)
from minicb.serving.errors import APIError
from minicb.serving.openai_logprobs import ChoiceLogprobs
from minicb.serving.openai_protocol import (
    ERROR_SCHEMA,
    ParsedRequest,
    choice,
    engine_error,
    new_id,
    openapi_body,
    parse_chat,
    parse_completion,
    request_schemas,
    response,
    usage,
)

# Bounds of the HTTP side, each a flag of `python -m minicb serve`
HTTP_MAX_BODY_BYTES = 8 * 2**20     # a request body (the longest prompt is a million characters)
TIMEOUT_KEEP_ALIVE = 5              # seconds an idle kept-alive connection stays open
LIMIT_CONCURRENCY = 1024            # connections at once; more get 503 at the door
BODY_TIMEOUT = 30                   # seconds a request's body may take to arrive


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a read deadline: a connection that has not sent a whole
    request's headers within `timeout_keep_alive` seconds of opening (or of its last response) is
    closed. uvicorn's own keep-alive timer stops at the first byte, so an idle socket or one that
    trickles its headers would otherwise stay open for good, and enough of them lock everyone
    out."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline = self.loop.call_later(self.timeout_keep_alive, self._expire)

    def handle_events(self) -> None:
        super().handle_events()
        if (self.cycle is not None and not self.cycle.response_complete and self._deadline
            is not None):
            self._deadline.cancel()          # the headers are in: the request is being served
            self._deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.timeout_keep_alive, self._expire)

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _expire(self) -> None:
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()


def build_app(model: str | None = None, *, engine: AsyncLLMEngine | None = None,
              served_model_name: str | None = None, max_queue_len: int | None = 1024,
              max_body_bytes: int = HTTP_MAX_BODY_BYTES, api_keys: Sequence[str] = (),
              **knobs) -> FastAPI:
    """The FastAPI app. Pass engine knobs (scheduler=..., max_num_seqs=...) or a ready engine.
    `api_keys`: with any, every route but /health needs one of them (minicb.serving.auth)."""
    if engine is None:
        engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=model, **knobs)), max_queue_len)
    model_name = served_model_name or model or Path(engine.model_path).name
    max_model_len = engine.config.max_model_len
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        await engine.shutdown()

    app = FastAPI(title="minicb", lifespan=lifespan)
    app.state.engine, app.state.model_name = engine, model_name
    app.state.max_body_bytes = max_body_bytes
    if api_keys:
        # outermost but for Starlette's error catcher: it sees a request before routing does
        app.add_middleware(APIKeyMiddleware, keys=list(api_keys))
        secure_openapi(app, ERROR_SCHEMA)
        hide_query_strings()

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        if error.status in (400, 404, 413, 503):
            engine.stats.rejected["overloaded" if error.status == 503 else "invalid"] += 1
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    # every other error in OpenAI's shape too: unknown routes, wrong methods, and anything
    # unforeseen
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        what = {404: f"no route {request.url.path[:200]}; see POST /v1/completions, POST "
                f"/v1/chat/completions, "
                     "GET /v1/models, GET /health, GET /metrics",
                405: f"{request.method} is not allowed on {request.url.path}"}.get(
                    error.status_code, error.detail)
        return JSONResponse(APIError(str(what), status=error.status_code).body(),
                            status_code=error.status_code, headers=getattr(error, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(APIError(f"invalid request: {error.errors()[:3]}", status=422).body(),
                            status_code=422)

    @app.exception_handler(Exception)
    async def unforeseen(request: Request, error: Exception) -> JSONResponse:
        return JSONResponse(APIError(f"internal error: {type(error).__name__}", status=500,
                                     error_type="internal_error").body(), status_code=500)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "running": engine.num_running, "waiting": engine.num_waiting}

    # What routers ask a replica: its load (power-of-two routing compares two replicas' loads)
    # and what it serves (SGLang's router probes these before it routes).
    @app.get("/get_load")
    async def load() -> dict:
        return {"load": engine.num_running + engine.num_waiting, "running": engine.num_running,
                "waiting": engine.num_waiting}

    def server_info() -> dict:
        config = engine.config
        return {"model_path": engine.model_path, "served_model_name": model_name,
                "max_model_len": max_model_len, "max_num_seqs": config.max_num_seqs,
                "scheduler": config.scheduler, "policy": config.policy,
                "block_size": getattr(config, "block_size", None),
                "enable_prefix_caching": getattr(config, "enable_prefix_caching", None),
                "tp_size": 1, "dp_size": 1}

    def model_info() -> dict:
        return {"model_path": engine.model_path, "served_model_name": model_name,
                "is_generation": True, "max_model_len": max_model_len}

    for path, describe in (("/server_info", server_info), ("/get_server_info", server_info),
                           ("/model_info", model_info), ("/get_model_info", model_info)):
        app.add_api_route(path, describe, methods=["GET"], summary=f"GET {path} (for routers)")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "minicb", "max_model_len": max_model_len}]}

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text exposition format",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics() -> PlainTextResponse:
        text = engine.stats.render(engine.num_running, engine.num_waiting, *engine.kv_usage())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    completion_schema, chat_schema = request_schemas(
        max_model_len, engine.vocab_size, priority=engine.config.policy == "priority")
    errors = {400: "a request this server refuses: the error names the field and the fix (also a "
                   "prompt plus max_tokens beyond the context: code context_length_exceeded; "
                   "min_tokens above max_tokens; top_logprobs without logprobs; a JSON schema, "
                   "regex or grammar that cannot be compiled, quoting the grammar library)",
              404: "a model this server does not serve (code model_not_found)",
              408: "the body did not arrive in time", 413: "the body is over the size limit",
              500: "the engine failed", 503: "too many requests waiting (with Retry-After)"}
    answer = {"description": "the completion: JSON, or server-sent events when stream is true",
              "content": {"application/json": {"schema": {"type": "object"}},
                          # each event: its data is a JSON chunk, the last one "[DONE]"
                          "text/event-stream": {"schema": {
                              "type": "object", "properties": {"data": {"type": "string"}}}}}}

    def documented(schema: dict) -> dict:
        extra = openapi_body(schema, errors)
        extra["responses"]["200"] = answer
        return extra

    @app.post("/v1/completions", openapi_extra=documented(completion_schema))
    async def completions(request: Request):
        parsed = parse_completion(await _json_body(request), model_name, max_model_len)
        return await _serve(engine, request, parsed, model_name, chat=False)

    @app.post("/v1/chat/completions", openapi_extra=documented(chat_schema))
    async def chat_completions(request: Request):
        parsed = parse_chat(await _json_body(request), model_name, max_model_len,
                            engine.has_chat_template)
        try:
            parsed.prompt = await engine.render_chat(parsed.messages)
        except Exception as error:   # the template is the checkpoint's own Jinja code
            raise APIError(f"the chat template failed on these messages: {error}",
                           param="messages") from None
        return await _serve(engine, request, parsed, model_name, chat=True)

    return app


async def _json_body(request: Request) -> dict:
    """The body as a JSON object, read no further than the server's limit (413 past it)."""
    limit = request.app.state.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), BODY_TIMEOUT)
    except ClientDisconnect:
        raise APIError("the client went away before sending the whole body.", status=400) from None
    except asyncio.TimeoutError:
        raise APIError(f"the request body did not arrive within {BODY_TIMEOUT} s.", status=408,
                       code="request_timeout") from None
    try:
        body = json.loads(b"".join(chunks))
    # not JSON, not UTF-8, or nested beyond the parser's depth
    except (ValueError, RecursionError):
        raise APIError("the request body is not valid JSON (or is nested too deeply).") from None
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object.")
    return body


def _too_large(limit: int) -> APIError:
    return APIError(f"the request body is larger than {limit} bytes; send a shorter prompt (or "
                    f"start the "
                    "server with a larger --max-body-bytes).", status=413, code="request_too_large")


async def _serve(engine: AsyncLLMEngine, request: Request, parsed: ParsedRequest, model_name: str,
                 chat: bool):
    policy = engine.config.policy
    if parsed.priority != 0 and policy != "priority":
        raise APIError(f"'priority' is {parsed.priority}, but this server schedules with "
                       f"policy={policy!r}, "
                       "which ignores it; leave 'priority' out (or 0), or start the server with "
                       "--policy priority.", param="priority")
    try:
        stream = await engine.add_request(parsed.prompt, parsed.params, priority=parsed.priority,
                                          require_fit=parsed.require_fit)
    except ValueError as error:
        code = "context_length_exceeded" if "max_model_len" in str(error) else None
        raise engine_error(error, parsed.sources, code) from None
    except QueueFullError as error:
        raise APIError(str(error), status=503, error_type="server_overloaded", code="overloaded",
                       headers={"Retry-After": str(math.ceil(error.retry_after))}) from None
    response_id = new_id("chatcmpl" if chat else "cmpl")
    echoed = await _echoed(engine, parsed)
    k = parsed.params.logprobs
    texts = None if k is None else await engine.token_texts()
    logprobs = [None if k is None else ChoiceLogprobs(chat, k, texts) for _ in range(stream.n)]
    if parsed.stream:
        events = _events(engine, stream, parsed, response_id, model_name, chat, echoed, logprobs)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    deltas = await _collect_unless_disconnected(engine, stream, request)
    if deltas is None:
        return JSONResponse({}, status_code=499)   # nobody is listening any more
    failed = next((d for d in deltas if d.finish_reason == "error"), None)
    if failed is not None:
        raise APIError(f"the engine failed while serving this request: {failed.error}", status=500,
                       error_type="internal_error")
    choices, num_prompt_tokens, num_output_tokens = [], 0, 0
    prompt = next((d for d in deltas if d.prompt_logprobs is not None), None)
    for index in range(stream.n):
        sample = [_kept(parsed, d) for d in deltas if d.index == index]
        last = sample[-1]
        token_ids = [t for d in sample for t in d.token_ids]
        entries = [e for d in sample for e in d.logprobs or []]
        lp = None if logprobs[index] is None else logprobs[index](
            token_ids, entries, *_prompt_logprobs(parsed, prompt))
        choices.append(choice(chat, echoed + "".join(d.text for d in sample), last.finish_reason,
                              token_ids if parsed.return_token_ids else None, False, index=index,
                              logprobs=lp))
        num_prompt_tokens = max(num_prompt_tokens, last.num_prompt_tokens)
        num_output_tokens += last.num_output_tokens
    return response(chat, response_id, model_name, choices,
                    usage(num_prompt_tokens, num_output_tokens), chunk=False)


def _kept(parsed: ParsedRequest, delta: StreamDelta) -> StreamDelta:
    """The delta as the client sees it: under max_tokens=0 the one token the engine computed is
    dropped, and the answer ends "length" (it asked for no tokens and got none)."""
    if parsed.generate:
        return delta
    finish = "length" if delta.finish_reason in ("stop", "length") else delta.finish_reason
    return dataclasses.replace(delta, token_ids=[], text="", logprobs=None, finish_reason=finish,
                               num_output_tokens=0)


def _prompt_logprobs(parsed: ParsedRequest, delta: StreamDelta | None) -> tuple:
    """(prompt token ids, their logprobs) for a choice that echoes them, else (None, None)."""
    if not parsed.echo or delta is None:
        return None, None
    return delta.prompt_token_ids, delta.prompt_logprobs


async def _echoed(engine: AsyncLLMEngine, parsed: ParsedRequest) -> str:
    """The prompt's text, put in front of each choice's text when the request says echo."""
    if not parsed.echo:
        return ""
    if isinstance(parsed.prompt, str):
        return parsed.prompt
    if not engine.has_tokenizer:
        raise APIError("'echo' of a token-id prompt needs the model's tokenizer, and this "
                       "checkpoint has none; send the prompt as text, or leave echo out.",
                       param="echo")
    return await engine.decode(parsed.prompt, parsed.params.skip_special_tokens)


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def _events(engine: AsyncLLMEngine, stream: RequestStream, parsed: ParsedRequest,
                  response_id: str, model_name: str, chat: bool, echoed: str,
                  logprobs: list[ChoiceLogprobs | None]) -> AsyncIterator[str]:
    """Server-sent events: one chunk per step and sample that produced tokens, tagged with the
    sample's choice index. When the client hangs up, the server cancels this generator
    mid-await and `finally` aborts the request, every sample of it."""
    try:
        # choices yet to send a chunk (a chat's first one has the role)
        unsent = set(range(stream.n))
        so_far: dict[int, int] = {}         # tokens streamed per choice (continuous usage)
        num_prompt_tokens = num_output_tokens = 0
        failed = False
        prompt = None               # the delta with the prompt's logprobs (echo), once it came
        async for delta in stream:
            delta = _kept(parsed, delta)
            prompt = prompt or (delta if delta.prompt_logprobs is not None else None)
            if delta.finish_reason == "error":
                yield _sse(APIError(f"the engine failed: {delta.error}", status=500,
                                    error_type="internal_error").body())
                failed = True
                break
            finish = delta.finish_reason if delta.finished else None
            ids = delta.token_ids if parsed.return_token_ids else None
            first = delta.index in unsent
            text = echoed + delta.text if first else delta.text    # echo: the prompt goes first
            builder = logprobs[delta.index]
            lp = None if builder is None else builder(
                delta.token_ids, delta.logprobs, *(_prompt_logprobs(parsed, prompt) if first
                                                   else (None, None)))
            entry = choice(chat, text, finish, ids, delta=True, first=first, index=delta.index,
                           logprobs=lp)
            unsent.discard(delta.index)
            so_far[delta.index] = so_far.get(delta.index, 0) + len(delta.token_ids)
            running_usage = usage(delta.num_prompt_tokens, sum(so_far.values())) \
                if parsed.continuous_usage else None
            yield _sse(response(chat, response_id, model_name, [entry], running_usage, chunk=True))
            if delta.finished:
                num_prompt_tokens = max(num_prompt_tokens, delta.num_prompt_tokens)
                num_output_tokens += delta.num_output_tokens
        if parsed.include_usage and not failed:   # after every choice has finished
            yield _sse(response(chat, response_id, model_name, [],
                                usage(num_prompt_tokens, num_output_tokens), chunk=True))
        yield _sse("[DONE]")
    finally:
        if not stream.finished:
            engine.abort(stream.request_id)


async def _collect_unless_disconnected(engine: AsyncLLMEngine, stream: RequestStream,
                                       request: Request) -> list[StreamDelta] | None:
    """All of a request's deltas (every sample's); None (and the request aborted) if the client
    hangs up first."""

    async def drain() -> list[StreamDelta]:
        return [delta async for delta in stream]

    async def hang_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    collect, watch = asyncio.ensure_future(drain()), asyncio.ensure_future(hang_up())
    try:
        await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        hung_up = not collect.done()
        if hung_up:
            collect.cancel()
            engine.abort(stream.request_id)
    return None if hung_up else collect.result()


class ServerThread:
    """uvicorn in a background thread, for notebooks and tests. port=0 picks a free port."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 timeout_keep_alive: int = TIMEOUT_KEEP_ALIVE,
                 limit_concurrency: int = LIMIT_CONCURRENCY):
        self.app, self.host = app, host
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                                    timeout_keep_alive=timeout_keep_alive,
                                                    limit_concurrency=limit_concurrency,
                                                    http=DeadlineH11Protocol))
        self.thread = threading.Thread(target=self.server.run, name="minicb-server", daemon=True)
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.host}:{self.port}; see the "
                                   "log above.")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def build_parser() -> argparse.ArgumentParser:
    """The `python -m minicb serve` command line."""
    parser = argparse.ArgumentParser(prog="python -m minicb serve",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--served-model-name", default=None,
                        help="the name clients pass as 'model'")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-queue-len", type=int, default=1024,
                        help="waiting requests beyond this get 503 with Retry-After (at least 1)")
    parser.add_argument("--max-body-bytes", type=int, default=HTTP_MAX_BODY_BYTES,
                        help=f"larger request bodies get 413 (default {HTTP_MAX_BODY_BYTES})")
    parser.add_argument("--timeout-keep-alive", type=int, default=TIMEOUT_KEEP_ALIVE,
                        help="seconds an idle connection, or one still sending its request's "
                             "headers, "
                             f"is kept open (default {TIMEOUT_KEEP_ALIVE})")
    parser.add_argument("--limit-concurrency", type=int, default=LIMIT_CONCURRENCY,
                        help=f"connections at once; more get 503 (default {LIMIT_CONCURRENCY})")
    parser.add_argument("--api-key", action="append", default=None, metavar="KEY",
                        help="clients must send 'Authorization: Bearer KEY' on every route but "
                             "/health; give it again for several keys; MINICB_API_KEY (comma-"
                             "separated) is better: a command line shows in `ps`")
    parser.add_argument("--log-level", default="info")
    EngineConfig.add_cli_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # the server's own flags are checked before the model loads
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not a TCP port (0-65535).")
    for flag, value in (("--max-queue-len", args.max_queue_len),
                        ("--max-body-bytes", args.max_body_bytes),
                        ("--timeout-keep-alive", args.timeout_keep_alive),
                        ("--limit-concurrency", args.limit_concurrency)):
        if value < 1:
            parser.error(f"{flag} {value} would refuse every request; give at least 1.")
    keys = keys_from(args.api_key)
    warning = exposure_warning(args.host, keys)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        app = build_app(served_model_name=args.served_model_name, max_queue_len=args.max_queue_len,
                        max_body_bytes=args.max_body_bytes, api_keys=keys,
                        **EngineConfig.knobs_from_cli(args))
    except ValueError as error:     # a knob the config refuses (or a combination): a usage error
        parser.error(str(error))
    # the name clients must send as "model" (a wrong one is refused), said before they guess
    print(f"serving model '{app.state.model_name}' ({app.state.engine.model_path}) at "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_keep_alive=args.timeout_keep_alive,
                limit_concurrency=args.limit_concurrency, http=DeadlineH11Protocol)
    return 0

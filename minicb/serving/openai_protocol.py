"""OpenAI's request and response shapes: parse a JSON body into a prompt and SamplingParams,
build the JSON (or server-sent-event chunks) that OpenAI's clients expect back.

Parsing is done by hand rather than by a schema library so that every bad request gets an
error in OpenAI's shape naming the field at fault and the fix:
    {"error": {"message": ..., "type": "invalid_request_error", "param": "top_p", "code": null}}
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass

from minicb.params import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
    SamplingParams,
)
from minicb.serving.errors import APIError
from minicb.serving.openai_sampling import (
    extra_schemas,
    one_constraint_rule,
    request_sources,
    sampling_extras,
)

log = logging.getLogger("minicb.serving")


_PARAMS_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def engine_error(error: ValueError, sources: dict[str, str] | None = None,
                 code: str | None = None) -> APIError:
    """A ValueError from SamplingParams or the engine's front door as a 400 naming the request's
    field: their messages start with the field's name, which `sources` (request_sources) maps
    back to the name the client sent where the two differ (a chat's top_logprobs is
    SamplingParams.logprobs)."""
    message = str(error)
    match = re.match(r"\w+", message)
    field = match.group(0) if match else ""
    if field in _PARAMS_FIELDS:
        param = (sources or {}).get(field, field)
        if param != field and message[len(field):len(field) + 1] == " ":
            message = param + message[len(field):]
    else:
        param = "prompt" if "prompt" in message or "token ids" in message else None
    return APIError(message, param=param, code=code)


@dataclass
class ParsedRequest:
    prompt: str | list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool        # stream_options.include_usage: a last chunk carries token counts
    return_token_ids: bool     # an extension (as in vLLM): choices also carry the token ids
    require_fit: bool          # max_tokens was given: prompt + max_tokens must fit max_model_len
    # an extension (as in vLLM): under the priority policy, lower is served first
    priority: int = 0
    # stream_options.continuous_usage_stats (vLLM's extension): every chunk carries usage so far
    continuous_usage: bool = False
    # echo (completions): the prompt's text comes back in front of each choice's text
    echo: bool = False
    # max_tokens=0 (completions): the engine computes one token, which is dropped, so the answer
    # is the prompt alone (with echo, its log-probabilities: how evaluation harnesses score text)
    generate: bool = True
    # SamplingParams' field -> the request's, where they differ (to name the field in an error)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    # a chat's messages, rendered into `prompt` by the chat template
    messages: list[dict] | None = None


# Caps only the HTTP server has (every other bound is SamplingParams', in minicb.params):
# the most samples (`n`) one request over the network may ask for (the engine allows MAX_N): each
# is a sequence in the batch, holding a slot and KV blocks of its own once it has diverged from
# the shared prompt, so one client could otherwise fill the batch alone
HTTP_MAX_N = 16
# the largest seed: JSON numbers above 2**53 lose precision in many clients (JavaScript's, or any
# that reads numbers as doubles), so a bigger seed might not be the one the client meant
HTTP_MAX_SEED = 2**53 - 1
# each string of a `stop` list: the JSON Schema cannot bound the list's characters in all (the
# engine's MAX_STOP_CHARS), so it bounds each string to an even share of them
HTTP_MAX_STOP_ITEM_CHARS = MAX_STOP_CHARS // MAX_STOP_STRINGS
# `priority` is a 32-bit integer, as in vLLM's protocol
HTTP_MAX_PRIORITY = 2**31 - 1
CHAT_ROLES = ("system", "user", "assistant")

# (JSON field, allowed Python types, what to call it in an error)
_NUMBER, _INT = ((int, float), "a number"), ((int,), "an integer")
_SAMPLING_FIELDS = {"max_tokens": _INT, "max_completion_tokens": _INT, "temperature": _NUMBER,
                    "top_p": _NUMBER, "top_k": _INT, "seed": _INT, "n": _INT}


def _integral(value):
    """JSON has one number type: 4.0 is an integer to JSON Schema, so to this server too."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _integers(values):
    return [_integral(v) for v in values] if isinstance(values, list) else values


def _field(body: dict, name: str, types: tuple[type, ...], kind: str, default=None):
    value = body.get(name)
    if value is None:
        return default
    if types == (int,):
        value = _integral(value)
    if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
        raise APIError(f"'{name}' must be {kind} (got {value!r}).", param=name)
    return value


def _is_token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def _sampling(body: dict, max_model_len: int, default_max_tokens: int, chat: bool
              ) -> tuple[SamplingParams, bool, dict[str, str]]:
    """SamplingParams from the body's fields, their JSON types checked here and their ranges by
    SamplingParams itself; also whether max_tokens was given, and request_sources."""
    values = {name: _field(body, name, *spec) for name, spec in _SAMPLING_FIELDS.items()}
    n = 1 if values["n"] is None else values["n"]
    if values["seed"] is not None and values["seed"] > HTTP_MAX_SEED:
        raise APIError(f"'seed' must be an integer from 0 to {HTTP_MAX_SEED} (2**53 - 1, the "
                       f"largest integer every JSON client reads exactly); got {values['seed']}.",
                       param="seed")
    if n > HTTP_MAX_N:
        raise APIError(f"'n' must be at most {HTTP_MAX_N} (got {n}); ask for at most {HTTP_MAX_N} "
                       "samples per request, or send several requests (with different seeds) "
                       "for more.", param="n")
    # max_completion_tokens is OpenAI's newer name for max_tokens (SGLang's router sends it)
    # completions allow 0: the prompt alone comes back (with echo, its log-probabilities)
    least = 1 if chat else 0
    for name in ("max_tokens", "max_completion_tokens"):
        value = values[name]
        if value is not None and not least <= value < max_model_len:
            raise APIError(f"{name}={value} cannot fit: max_model_len is {max_model_len} and the "
                           f"prompt needs at least one token; ask for {least} to "
                           f"{max_model_len - 1} tokens.", param=name)
    max_tokens = (values["max_tokens"] if values["max_tokens"] is not None
                  else values["max_completion_tokens"])
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or isinstance(stop, list)
                                 and all(isinstance(s, str) for s in stop)):
        raise APIError(f"'stop' must be a string or a list of strings (got {stop!r}).",
                       param="stop")
    if isinstance(stop, list) and any(len(s) > HTTP_MAX_STOP_ITEM_CHARS for s in stop):
        raise APIError(f"each string of a 'stop' list may have at most {HTTP_MAX_STOP_ITEM_CHARS} "
                       f"characters (the longest has {max(map(len, stop))}); send shorter stop "
                       "strings, or one long one as a string.", param="stop")
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    extras, constraint_field = sampling_extras(body, chat)
    sources = request_sources(chat, body, constraint_field)
    stop_token_ids = _integers(body.get("stop_token_ids"))
    if stop_token_ids is not None and not (stop_token_ids == [] or _is_token_ids(stop_token_ids)):
        raise APIError(f"'stop_token_ids' must be a list of integers (got {stop_token_ids!r}).",
                       param="stop_token_ids")
    try:
        params = SamplingParams(
            n=n, temperature=1.0 if values["temperature"] is None else values["temperature"],
            top_p=1.0 if values["top_p"] is None else values["top_p"],
            top_k=-1 if values["top_k"] is None else values["top_k"], seed=values["seed"],
            max_tokens=max(max_tokens, 1), stop=stop,
            stop_token_ids=stop_token_ids or [],
            ignore_eos=_field(body, "ignore_eos", (bool,), "true or false", False),
            skip_special_tokens=_field(body, "skip_special_tokens", (bool,), "true or false",
                                       True), **extras)
    except ValueError as error:
        raise engine_error(error, sources) from None
    given = values["max_tokens"] is not None or values["max_completion_tokens"] is not None
    return params, given, sources


def _check_model(body: dict, model_name: str) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(f"'model' must be a string (got {json.dumps(model)[:80]}).", param="model")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError(f"'user' must be a string (got {json.dumps(user)[:80]}).", param="user")
    if model is not None and model != model_name:
        raise APIError(f"The model {model!r} does not exist; this server serves {model_name!r} "
                       "(see GET /v1/models).", param="model", code="model_not_found", status=404)


# Every field a request may carry. The ones this server implements are read above and below; the
# extension fields that routers and other servers' clients always send (vLLM's and SGLang's) are
# accepted at the value that asks for nothing and refused, naming the field and the fix, at a
# value this server cannot honour; any other field is ignored with one log line naming it (as
# vLLM's server does), so a client written for a richer server still gets its answer.
# fields read by minicb.serving.openai_sampling
_EXTRA_FIELDS = ("logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "logit_bias", "min_p", "min_tokens", "response_format",
                 "structured_outputs")
_IMPLEMENTED = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
                "top_p", "top_k", "seed", "n", "stop", "stop_token_ids", "stream", "stream_options",
                "ignore_eos", "skip_special_tokens", "priority", "return_token_ids", "user",
                "echo", *_EXTRA_FIELDS}
_NO_EFFECT = {"best_of": (1,), "suffix": ("",), "tools": ([],), "tool_choice": ("none", "auto"),
              "store": (False,), "metadata": ({},), "service_tier": ("auto", "default"),
              # routers' extension fields (vLLM's router, SGLang's router)
              "no_stop_trim": (False,), "return_hidden_states": (False,),
              "continue_final_message": (False,)}
# fields where every boolean asks for nothing here: the model writes no separate reasoning
# section, so there is nothing to include, separate or stream apart; a chat's tool calls are
# refused above, so whether they may run in parallel changes nothing
_ANY_BOOLEAN = {"include_reasoning", "separate_reasoning", "stream_reasoning",
                "parallel_tool_calls"}
# how to get what a refused value asks for, where there is a way
_FIXES = {"tools": "this model was not trained to call tools, and its chat template has no "
                   "format for them; to get arguments as JSON, send response_format with a "
                   "json_schema", "tool_choice": "this server calls no tools",
          "best_of": "it would rank samples by log-probability; send n and the logprobs "
                     "field and rank them yourself",
          "suffix": "this model was not trained to fill in the middle",
          "return_hidden_states": "this server returns text and token ids only"}


def _same_json(value, allowed) -> bool:
    """JSON equality: 0 and 0.0 are the same number, but true is not 1."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    if isinstance(value, (int, float)) and isinstance(allowed, (int, float)):
        return value == allowed
    return type(value) is type(allowed) and value == allowed


def _check_fields(body: dict, chat: bool) -> list[str]:
    """Refuse what cannot be honoured; return the names of unknown fields (to be logged)."""
    unknown = []
    for name, value in body.items():
        if name == "echo" and chat and not (value is None or value is False):
            raise APIError("'echo' is for POST /v1/completions; a chat answer cannot echo its "
                           "messages. Leave it out or send false.", param="echo",
                           code="unsupported_parameter")
        if name in _IMPLEMENTED or value is None:
            continue
        if name in _ANY_BOOLEAN:
            if not isinstance(value, bool):
                raise APIError(f"'{name}' must be true or false (got {json.dumps(value)[:80]}).",
                               param=name)
            continue
        if name in _NO_EFFECT:
            if any(_same_json(value, ok) for ok in _NO_EFFECT[name]):
                continue
            fix = f" ({_FIXES[name]})" if name in _FIXES else ""
            raise APIError(f"'{name}'={json.dumps(value)[:80]} is not supported by this "
                           f"server{fix}; leave it out or send {json.dumps(_NO_EFFECT[name][0])}.",
                           param=name, code="unsupported_parameter")
        unknown.append(name)
    if unknown:
        # the names come from the client: quoted and cut, so one cannot forge log lines
        names = ", ".join(repr(name[:40]) for name in sorted(unknown)[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        log.warning("ignored fields this server does not know: %s%s", names, more)
    return unknown


def _options(body: dict, prompt, params: SamplingParams, require_fit: bool) -> ParsedRequest:
    stream = _field(body, "stream", (bool,), "true or false", False)
    options = {} if body.get("stream_options") is None else body["stream_options"]
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise APIError("'stream_options' must be an object with at most 'include_usage' and "
                       "'continuous_usage_stats'.",
                       param="stream_options")
    include_usage = _field(options, "include_usage", (bool,), "true or false", False)
    continuous = _field(options, "continuous_usage_stats", (bool,), "true or false", False)
    priority = _field(body, "priority", *_INT, 0)
    if not -HTTP_MAX_PRIORITY - 1 <= priority <= HTTP_MAX_PRIORITY:
        raise APIError(f"'priority' must be a 32-bit integer (got {priority}).", param="priority")
    return ParsedRequest(prompt, params, stream, include_usage,
                         _field(body, "return_token_ids", (bool,), "true or false", False),
                         require_fit, priority, continuous)


def parse_completion(body: dict, model_name: str, max_model_len: int) -> ParsedRequest:
    """POST /v1/completions: prompt as a string or token ids (or a list holding one of those)."""
    _check_model(body, model_name)
    _check_fields(body, chat=False)
    prompt = _integers(body.get("prompt"))
    one = isinstance(prompt, list) and len(prompt) == 1
    if one and (isinstance(prompt[0], str) or _is_token_ids(_integers(prompt[0]))):
        prompt = _integers(prompt[0])
    if prompt is None:
        raise APIError("'prompt' is required: a string or a list of token ids.", param="prompt")
    if not (isinstance(prompt, str) or _is_token_ids(prompt)):
        raise APIError("'prompt' must be a string or a list of token ids (one prompt per request; "
                       f"got {type(prompt).__name__}).", param="prompt")
    if prompt == "":
        raise APIError("'prompt' is empty; send at least one character (or token id).",
                       param="prompt")
    params, require_fit, sources = _sampling(body, max_model_len, 16,  # OpenAI's default
                                             chat=False)
    parsed = _options(body, prompt, params, require_fit)
    parsed.echo = _field(body, "echo", (bool,), "true or false", False)
    parsed.generate = body.get("max_tokens") != 0 and body.get("max_completion_tokens") != 0
    parsed.sources = sources
    return parsed


def _text_content(content: str | list) -> str:
    """A message's content: a string, or OpenAI's list of parts, of which this server reads text."""
    if isinstance(content, str):
        return content
    if not all(isinstance(part, dict) and part.get("type") == "text"
               and isinstance(part.get("text"), str) for part in content):
        raise APIError("a message's content must be a string or a list of {\"type\": \"text\", "
                       "\"text\": str} parts; this model reads text only.", param="messages")
    return "".join(part["text"] for part in content)


def parse_chat(body: dict, model_name: str, max_model_len: int,
               has_chat_template: bool) -> ParsedRequest:
    """POST /v1/chat/completions: the messages (as text) in `messages`, for the server to render
    through the chat template on the tokenizer's own thread (AsyncLLMEngine.render_chat) into
    `prompt`."""
    _check_model(body, model_name)
    _check_fields(body, chat=True)
    if not has_chat_template:
        raise APIError("this model's tokenizer has no chat template, so chat messages cannot be "
                       "turned into "
                       "a prompt; use POST /v1/completions, or serve a checkpoint whose "
                       "tokenizer_config.json has a chat_template.", param="messages",
                       code="chat_template_missing")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), (str, list)) for m in messages):
        raise APIError(
            "'messages' must be a non-empty list of {\"role\": str, \"content\": str} objects.",
            param="messages")
    for message in messages:
        if message["role"] not in CHAT_ROLES:
            raise APIError(f"a message's role must be one of {', '.join(CHAT_ROLES)} (got "
                           f"{message['role'][:40]!r}).", param="messages")
    # no max_tokens: as OpenAI, generate until a stop or the context is full
    params, require_fit, sources = _sampling(body, max_model_len, max_model_len, chat=True)
    parsed = _options(body, "", params, require_fit)
    parsed.messages = [{"role": m["role"], "content": _text_content(m["content"])}
                       for m in messages]
    parsed.sources = sources
    return parsed


# --- responses
# -------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(num_prompt_tokens: int, num_output_tokens: int) -> dict:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens}


def choice(chat: bool, text: str, finish_reason: str | None, token_ids: list[int] | None,
           delta: bool, first: bool = False, index: int = 0, logprobs: dict | None = None) -> dict:
    """One entry of `choices` (`index`: which of the n samples): text for completions, a message
    (or a delta of one) for chat; `logprobs` in the endpoint's shape (openai_logprobs)."""
    if not chat:
        entry = {"index": index, "text": text, "logprobs": logprobs,
                 "finish_reason": finish_reason}
    elif delta:
        entry = {"index": index,
                 "delta": {"role": "assistant", "content": text} if first else {"content": text},
                 "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        entry = {"index": index, "message": {"role": "assistant", "content": text},
                 "logprobs": logprobs, "finish_reason": finish_reason}
    if token_ids is not None:
        entry["token_ids"] = token_ids
    return entry


def response(chat: bool, request_id: str, model: str, choices: list[dict], usage_: dict | None,
             chunk: bool) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    body = {"id": request_id, "object": kind, "created": int(time.time()), "model": model,
            "choices": choices}
    if usage_ is not None or not chunk:
        body["usage"] = usage_
    return body


# --- the contract as JSON Schema (published in the server's OpenAPI document) --------------------
# A request the schemas allow is served, one they forbid gets a 400 naming the field: the parser
# above enforces exactly these bounds. The rules a schema here cannot state: the context (prompt
# tokens plus max_tokens must fit max_model_len: a 400 whose code is "context_length_exceeded"),
# min_tokens <= max_tokens, top_logprobs only with logprobs: true, and a constraint (JSON schema,
# regex, grammar) the grammar library can compile (minicb.serving.openai_sampling). Every bound is
# imported: SamplingParams' from minicb.params, the HTTP_MAX_* caps from above.


def _nullable(schema: dict) -> dict:
    """null means "not given" for every optional field, as in OpenAI's API."""
    return {"anyOf": [schema, {"type": "null"}]}


def _const(value) -> dict:
    return {"enum": [value]}


def request_schemas(max_model_len: int, vocab_size: int, priority: bool) -> tuple[dict, dict]:
    """(completion body, chat body) as JSON Schema, for a server with this context length,
    vocabulary and scheduling policy (`priority`: whether "priority" is read)."""
    token_ids = {"type": "array", "minItems": 1,
                 "items": {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}}
    boolean = {"type": "boolean"}
    common = {
        "model": {"type": "string"},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": max_model_len - 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": max_model_len - 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"anyOf": [_const(-1), {"type": "integer", "minimum": 1}]},
        "seed": {"type": "integer", "minimum": 0, "maximum": HTTP_MAX_SEED},
        "n": {"type": "integer", "minimum": 1, "maximum": HTTP_MAX_N},
        "stop": {"anyOf": [{"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS},
                           {"type": "array", "maxItems": MAX_STOP_STRINGS, "items": {
                               "type": "string", "minLength": 1,
                               "maxLength": HTTP_MAX_STOP_ITEM_CHARS}}]},
        "stop_token_ids": {"type": "array", "maxItems": MAX_STOP_TOKEN_IDS,
                           "items": {"type": "integer", "minimum": 0}},
        "stream": boolean,
        "stream_options": {"type": "object", "additionalProperties": False,
                           "properties": {"include_usage": _nullable(boolean),
                                          "continuous_usage_stats": _nullable(boolean)}},
        "ignore_eos": boolean, "skip_special_tokens": boolean, "return_token_ids": boolean,
        "user": {"type": "string"},
        "priority": ({"type": "integer", "minimum": -HTTP_MAX_PRIORITY - 1,
                      "maximum": HTTP_MAX_PRIORITY} if priority
                     else _const(0)),
        **{name: boolean for name in sorted(_ANY_BOOLEAN)},
        # accepted only at the value that asks for nothing
        **{name: {"enum": list(values)} for name, values in _NO_EFFECT.items()},
    }
    completion = {"prompt": {"anyOf": [
        {"type": "string", "minLength": 1}, token_ids,
        {"type": "array", "minItems": 1, "maxItems": 1,
         "items": {"anyOf": [{"type": "string", "minLength": 1}, token_ids]}}]},
        "echo": boolean, **extra_schemas(vocab_size, chat=False),
        # 0: the prompt alone comes back (with echo and logprobs, the prompt's log-probabilities)
        "max_tokens": {"type": "integer", "minimum": 0, "maximum": max_model_len - 1},
        "max_completion_tokens": {"type": "integer", "minimum": 0, "maximum": max_model_len - 1}}
    text_part = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": _const("text"), "text": {"type": "string"}}}
    chat = {"messages": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"enum": list(CHAT_ROLES)},
                       "content": {"anyOf": [{"type": "string"},
                                            {"type": "array", "items": text_part}]}}}},
        "echo": _const(False), **extra_schemas(vocab_size, chat=True)}
    bodies = []
    for required, own in ((["prompt"], completion), (["messages"], chat)):
        properties = {name: (spec if name in required else _nullable(spec))
                      for name, spec in {**common, **own}.items()}
        # other fields are ignored (and logged), so they are allowed
        bodies.append({"type": "object", "required": required, "properties": properties,
                       **one_constraint_rule()})
    return bodies[0], bodies[1]


# OpenAI's error body, the answer to every refused request
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def openapi_body(schema: dict, errors: dict[int, str]) -> dict:
    """FastAPI's `openapi_extra` for a route whose JSON body this module parses by hand: the body's
    schema and every error status the route answers with, each with OpenAI's error body."""
    content = {"application/json": {"schema": ERROR_SCHEMA}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {str(status): {"description": what, "content": content}
                          for status, what in errors.items()}}

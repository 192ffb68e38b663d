"""What a request may ask of the sampler beyond temperature and top-p, in OpenAI's and vLLM's
names: log-probabilities, penalties, logit bias, min_p, min_tokens and structured outputs.

Each field's JSON type is checked here and its value handed to the engine's own SamplingParams
(vLLM's names), which holds every range (minicb.params: OpenAI's where OpenAI documents one).
The JSON Schema below publishes those same bounds, imported: what the schema allows is served.

    completions  logprobs: int (top-k per token), echo + logprobs: the prompt's too
    chat         logprobs: true, top_logprobs: int
    both         presence_penalty, frequency_penalty (OpenAI, [-2, 2]), repetition_penalty
                 (vLLM's, from 0.01), logit_bias {"token id": bias in [-100, 100]}, min_p,
                 min_tokens,
                 response_format {"type": "json_object" | "json_schema" | "text"},
                 structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object"}

Rules no schema here states (a client breaking one gets a 400 naming the field): min_tokens may
not exceed max_tokens; top_logprobs needs logprobs: true; one constraint, named in
response_format or in structured_outputs, not both; no constraint with ignore_eos or min_tokens
(the engine's rule). And a JSON schema, regex or grammar the grammar library cannot compile gets
a 400 quoting the library's reason.
"""

from __future__ import annotations

import json

from minicb.params import (
    MAX_CHOICES,
    MAX_CONSTRAINT_CHARS,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_TOKENS,
    MAX_LOGPROBS,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
    StructuredOutputsParams,
)
from minicb.serving.errors import APIError

# vLLM's structured_outputs fields this server reads: one constraint, and a whitespace switch
EXTENSION_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace")


def _number(body: dict, name: str) -> float | None:
    """A JSON number (its range is SamplingParams')."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(f"'{name}' must be a number (got {json.dumps(value)[:40]}).", param=name)
    return float(value)


def _integer(body: dict, name: str, what: str) -> int | None:
    """A JSON integer (4.0 is one to JSON Schema, so to this server too)."""
    value = body.get(name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise APIError(f"'{name}' must be an integer (got {json.dumps(value)[:20]}): {what}.",
                       param=name)
    return value


def _logit_bias(body: dict) -> dict | None:
    """The object as it came: its keys (token ids as decimal text) and biases are SamplingParams'
    to check, the vocabulary the engine's front door's."""
    bias = body.get("logit_bias")
    if bias is None or bias == {}:
        return None
    if not isinstance(bias, dict):
        raise APIError("'logit_bias' must be an object mapping token ids (as strings: {\"50256\": "
                       f"-100}}) to biases (got {json.dumps(bias)[:40]}).", param="logit_bias")
    return bias


def _logprobs(body: dict, chat: bool) -> tuple[int | None, int | None]:
    """(logprobs per output token, logprobs per prompt token) for SamplingParams, which checks
    the count; a chat's top_logprobs becomes SamplingParams.logprobs, a completion's logprobs
    with echo also its prompt_logprobs (request_sources names them back)."""
    value = body.get("logprobs")
    if chat:
        if value is not None and not isinstance(value, bool):
            raise APIError(f"'logprobs' must be true or false in a chat request (got "
                           f"{json.dumps(value)[:20]}); the count goes in 'top_logprobs'.",
                           param="logprobs")
        top = _integer(body, "top_logprobs", "how many most likely tokens to return")
        if top and not value:
            raise APIError("'top_logprobs' needs 'logprobs': true (OpenAI's rule); send both, "
                           "or leave top_logprobs out.", param="top_logprobs")
        return (top or 0) if value else None, None
    if value is False:
        return None, None
    value = _integer(body, "logprobs", "how many most likely tokens to return beside each "
                     "chosen one, in a completions request")
    return value, value if value is not None and body.get("echo") is True else None


def request_sources(chat: bool, body: dict, constraint_field: str | None) -> dict[str, str]:
    """SamplingParams' field -> the request's field it was read from, where the names differ:
    an error SamplingParams raises is a 400 naming the field the client sent."""
    sources = {"logprobs": "top_logprobs"} if chat else {"prompt_logprobs": "logprobs"}
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is not None:
        sources["max_tokens"] = "max_completion_tokens"
    if constraint_field is not None:
        sources["structured_outputs"] = constraint_field
    return sources


def _constraint(body: dict) -> tuple[StructuredOutputsParams | None, str | None]:
    """The structured-output constraint and the field that asked for it. As in vLLM, a request
    may name its constraint in response_format and its options (disable_any_whitespace) in
    structured_outputs; one constraint in both is refused."""
    response_format = body.get("response_format")
    extension = body.get("structured_outputs")
    if response_format is not None and not isinstance(response_format, dict):
        raise APIError("'response_format' must be an object: {\"type\": \"text\"}, {\"type\": "
                       "\"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {\"name\":"
                       " ..., \"schema\": {...}}}.", param="response_format")
    kind = None if response_format is None else response_format.get("type")
    if kind not in (None, "text", "json_object", "json_schema"):
        raise APIError(f"response_format type {json.dumps(kind)[:40]} is not one of text, "
                       "json_object, json_schema.", param="response_format")
    if extension is not None and (not isinstance(extension, dict)
                                  or set(extension) - set(EXTENSION_FIELDS)):
        raise APIError("'structured_outputs' must be an object with exactly one of "
                       f"{', '.join(EXTENSION_FIELDS[:-1])} (vLLM's names; "
                       "disable_any_whitespace may come beside it).", param="structured_outputs")
    given = {name: value for name, value in (extension or {}).items() if value is not None}
    for name in ("json_object", "disable_any_whitespace"):
        if name in given and not isinstance(given[name], bool):
            raise APIError(f"structured_outputs.{name} must be true or false (got "
                           f"{json.dumps(given[name])[:20]}).", param="structured_outputs")
    if isinstance(given.get("json"), str):
        raise APIError("structured_outputs.json must be the JSON Schema itself, an object (not "
                       "a string holding one).", param="structured_outputs")
    field = "structured_outputs"
    if kind in ("json_object", "json_schema"):
        if any(value is not False for name, value in given.items()
               if name != "disable_any_whitespace"):
            raise APIError("send the constraint in 'response_format' or in 'structured_outputs', "
                           "not both.", param="structured_outputs")
        field = "response_format"
        spec = response_format.get("json_schema") if kind == "json_schema" else {}
        if not isinstance(spec, dict) or kind == "json_schema" and (
                not isinstance(spec.get("name"), str)
                or not isinstance(spec.get("schema", {}), (dict, type(None)))
                or not isinstance(spec.get("description", ""), str)
                or not isinstance(spec.get("strict", False), (bool, type(None)))):
            raise APIError("a json_schema response_format needs \"json_schema\": {\"name\": str, "
                           "\"schema\": {a JSON Schema object}} (and, if given, \"description\": "
                           "str, \"strict\": true or false).", param="response_format")
        # OpenAI's schema is optional: without one, any JSON object
        given |= ({"json": spec["schema"], "json_object": None} if spec.get("schema") is not None
                  else {"json_object": True})
        given = {name: value for name, value in given.items() if value is not None}
    elif extension is None:
        return None, None
    try:
        return StructuredOutputsParams(**given), field
    except ValueError as error:
        raise APIError(str(error), param=field) from None


def sampling_extras(body: dict, chat: bool) -> tuple[dict, str | None]:
    """SamplingParams keyword arguments for the fields above (only those given), and which field
    asked for a structured output (to name it if the constraint fails to compile)."""
    logprobs, prompt_logprobs = _logprobs(body, chat)
    structured, constraint_field = _constraint(body)
    values = {
        "logprobs": logprobs, "prompt_logprobs": prompt_logprobs,
        **{name: _number(body, name) for name in ("presence_penalty", "frequency_penalty",
                                                  "repetition_penalty", "min_p")},
        "logit_bias": _logit_bias(body),
        "min_tokens": _integer(body, "min_tokens", "how many tokens to generate before EOS or a "
                               "stop token id may end the output"),
        "structured_outputs": structured}
    return {name: value for name, value in values.items() if value is not None}, constraint_field


# --- the same rules as JSON Schema ---------------------------------------------------------------
def _digits_below(limit: int) -> str:
    """A regex for the decimal integers 0 .. limit - 1 without leading zeros (token ids as
    logit_bias keys): every shorter length, then each digit position of limit - 1 in turn."""
    top = str(limit - 1)
    options = ["0"] + [f"[1-9][0-9]{{{n - 1}}}" if n > 1 else "[1-9]" for n in range(1, len(top))]
    for position, digit in enumerate(top):
        rest = len(top) - position - 1
        lowest = "1" if position == 0 else "0"
        if int(digit) > int(lowest):
            options.append(f"{top[:position]}[{lowest}-{int(digit) - 1}][0-9]{{{rest}}}")
    options.append(top)
    return "^(" + "|".join(options) + ")$"


def extra_schemas(vocab_size: int, chat: bool) -> dict:
    """The request-body properties for the fields above, as JSON Schema."""
    number = {"type": "number"}
    response_format = {"anyOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text"]}}},
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["json_object"]}}},
        {"type": "object", "required": ["type", "json_schema"], "properties": {
            "type": {"enum": ["json_schema"]},
            "json_schema": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "description": {"type": "string"},
                "schema": {"type": ["object", "null"]},
                "strict": {"type": ["boolean", "null"]}}}}}]}
    named, options_alone = _structured_outputs_schemas()
    logprobs = ({"logprobs": {"type": "boolean"},
                 "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS}}
                if chat else
                {"logprobs": {"anyOf": [{"enum": [False]}, {
                    "type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS}]}})
    return {
        **logprobs,
        "presence_penalty": {**number, "minimum": -MAX_PENALTY, "maximum": MAX_PENALTY},
        "frequency_penalty": {**number, "minimum": -MAX_PENALTY, "maximum": MAX_PENALTY},
        "repetition_penalty": {**number, "minimum": MIN_REPETITION_PENALTY,
                               "maximum": MAX_REPETITION_PENALTY},
        "min_p": {**number, "minimum": 0, "maximum": 1},
        "min_tokens": {"type": "integer", "minimum": 0},
        "logit_bias": {"type": "object", "maxProperties": MAX_LOGIT_BIAS_TOKENS,
                       "propertyNames": {"pattern": _digits_below(vocab_size)},
                       "additionalProperties": {**number, "minimum": -MAX_LOGIT_BIAS,
                                                "maximum": MAX_LOGIT_BIAS}},
        "response_format": response_format,
        "structured_outputs": {"anyOf": [*named, options_alone]},
    }


def _structured_outputs_schemas() -> tuple[list[dict], dict]:
    """structured_outputs as JSON Schema: one object per constraint it may name (exactly one, the
    others null or, for json_object, false), and the object that names none (its options alone)."""
    text = {"type": "string", "minLength": 1, "maxLength": MAX_CONSTRAINT_CHARS}
    one_constraint = {"json": {"type": "object"}, "regex": text, "grammar": text,
                      "choice": {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES,
                                 "items": {"type": "string", "minLength": 1}},
                      "json_object": {"enum": [True]}}
    unset = {name: {"enum": [None, False] if name == "json_object" else [None]}
             for name in one_constraint}
    options = {"disable_any_whitespace": {"type": ["boolean", "null"]}}
    named = [{"type": "object", "additionalProperties": False, "required": [name],
              "properties": {**unset, name: spec, **options}}
             for name, spec in one_constraint.items()]
    return named, {"type": "object", "additionalProperties": False,
                   "properties": {**unset, **options}}


def one_constraint_rule() -> dict:
    """The body-level rule that a request names its constraint exactly once: either
    response_format asks for JSON (json_object or json_schema) and structured_outputs, if sent,
    carries options alone; or response_format does not, and structured_outputs, if sent, names
    one constraint. So `"structured_outputs": {}` alone is outside the document, as the server
    refuses it."""
    named, options_alone = _structured_outputs_schemas()
    null = {"type": "null"}
    json_format = {"type": "object", "required": ["type"],
                   "properties": {"type": {"enum": ["json_object", "json_schema"]}}}
    other_format = {"anyOf": [null, {"type": "object", "required": ["type"],
                                     "properties": {"type": {"enum": ["text"]}}}]}
    # each branch says "object" again (the body is one anyway): generators that build a body
    # from the schema (hypothesis-jsonschema, schemathesis) read a branch without a type as "any"
    return {"anyOf": [
        {"type": "object",
         "properties": {"response_format": other_format,
                        "structured_outputs": {"anyOf": [null, *named]}}},
        {"type": "object", "required": ["response_format"],
         "properties": {"response_format": json_format,
                        "structured_outputs": {"anyOf": [null, options_alone]}}}]}

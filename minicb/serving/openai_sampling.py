"""What a request may ask of the sampler beyond temperature and top-p, in OpenAI's and vLLM's
names: log-probabilities, penalties, logit bias, min_p, min_tokens and structured outputs.

Each field is read into the engine's own SamplingParams (vLLM's names), with the bounds OpenAI
documents, and published as JSON Schema with the same bounds: what the schema allows is served.

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
    MAX_LOGPROBS,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
    StructuredOutputsParams,
)
from minicb.params import MAX_LOGIT_BIAS as MAX_LOGIT_BIAS_ENTRIES
from minicb.serving.errors import APIError

# OpenAI's documented ranges
MAX_PENALTY = 2.0                  # presence_penalty and frequency_penalty in [-2, 2]
MAX_LOGIT_BIAS = 100.0             # each bias in [-100, 100]: -100 bans a token, 100 forces it
# vLLM's structured_outputs fields this server reads: one constraint, and a whitespace switch
EXTENSION_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace")


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise APIError(f"'{name}' must be a number from {low:g} to {high:g} (got "
                       f"{json.dumps(value)[:40]}).", param=name)
    return float(value)


def _logit_bias(body: dict, vocab_size: int) -> dict[int, float] | None:
    bias = body.get("logit_bias")
    if bias is None or bias == {}:
        return None
    fix = ("'logit_bias' maps token ids (as strings: {\"50256\": -100}) to a bias from "
           f"{-MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g}")
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise APIError(f"{fix}, at most {MAX_LOGIT_BIAS_ENTRIES} of them.", param="logit_bias")
    result = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and key == str(int(key))
                and int(key) < vocab_size):
            raise APIError(f"{fix}; {key[:20]!r} is not a token id of this model (0 to "
                           f"{vocab_size - 1}).", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise APIError(f"{fix}; token {key} has {json.dumps(value)[:20]}.",
                           param="logit_bias")
        result[int(key)] = float(value)
    return result


def _logprobs(body: dict, chat: bool) -> tuple[int | None, int | None]:
    """(logprobs per output token, logprobs per prompt token) for SamplingParams."""
    value = body.get("logprobs")
    if chat:
        if value is not None and not isinstance(value, bool):
            raise APIError(f"'logprobs' must be true or false in a chat request (got "
                           f"{json.dumps(value)[:20]}); the count goes in 'top_logprobs'.",
                           param="logprobs")
        top = body.get("top_logprobs")
        if isinstance(top, float) and top.is_integer():
            top = int(top)
        if top is not None and (isinstance(top, bool) or not isinstance(top, int)
                                or not 0 <= top <= MAX_LOGPROBS):
            raise APIError(f"'top_logprobs' must be an integer from 0 to {MAX_LOGPROBS} (got "
                           f"{json.dumps(top)[:20]}).", param="top_logprobs")
        if top and not value:
            raise APIError("'top_logprobs' needs 'logprobs': true (OpenAI's rule); send both, "
                           "or leave top_logprobs out.", param="top_logprobs")
        return (top or 0) if value else None, None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is None or value is False:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise APIError(f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS} in a completions "
                       f"request (got {json.dumps(value)[:20]}): how many most likely tokens to "
                       "return beside each chosen one.", param="logprobs")
    return value, value if body.get("echo") is True else None


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
        if set(given) - {"disable_any_whitespace", "json_object"}:
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


def sampling_extras(body: dict, chat: bool, vocab_size: int) -> tuple[dict, str | None]:
    """SamplingParams keyword arguments for the fields above (only those given), and which field
    asked for a structured output (to name it if the constraint fails to compile)."""
    logprobs, prompt_logprobs = _logprobs(body, chat)
    structured, constraint_field = _constraint(body)
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, float) and min_tokens.is_integer():
        min_tokens = int(min_tokens)
    if min_tokens is not None and (isinstance(min_tokens, bool) or not isinstance(min_tokens, int)
                                   or min_tokens < 0):
        raise APIError(f"'min_tokens' must be an integer >= 0 (got "
                       f"{json.dumps(min_tokens)[:20]}): how many tokens to generate before EOS "
                       "or a stop token id may end the output.", param="min_tokens")
    values = {
        "logprobs": logprobs, "prompt_logprobs": prompt_logprobs,
        "presence_penalty": _number(body, "presence_penalty", -MAX_PENALTY, MAX_PENALTY),
        "frequency_penalty": _number(body, "frequency_penalty", -MAX_PENALTY, MAX_PENALTY),
        "repetition_penalty": _number(body, "repetition_penalty", MIN_REPETITION_PENALTY,
                                      MAX_REPETITION_PENALTY),
        "min_p": _number(body, "min_p", 0.0, 1.0),
        "logit_bias": _logit_bias(body, vocab_size), "min_tokens": min_tokens or None,
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
    json_schema = {"type": "object"}
    response_format = {"anyOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text"]}}},
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["json_object"]}}},
        {"type": "object", "required": ["type", "json_schema"], "properties": {
            "type": {"enum": ["json_schema"]},
            "json_schema": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "description": {"type": "string"},
                "schema": {"type": ["object", "null"]},
                "strict": {"type": ["boolean", "null"]}}}}}]}
    text = {"type": "string", "minLength": 1, "maxLength": MAX_CONSTRAINT_CHARS}
    one_constraint = {"json": json_schema, "regex": text, "grammar": text,
                      "choice": {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES,
                                 "items": {"type": "string", "minLength": 1}},
                      "json_object": {"enum": [True]}}
    # exactly one constraint; the others may be given as null (json_object as false)
    unset = {name: {"enum": [None, False] if name == "json_object" else [None]}
             for name in one_constraint}
    options = {"disable_any_whitespace": {"type": ["boolean", "null"]}}
    structured = {"anyOf": [{"type": "object", "additionalProperties": False, "required": [name],
                             "properties": {**unset, name: spec, **options}}
                            for name, spec in one_constraint.items()]
                  # options alone, beside a response_format that names the constraint
                  + [{"type": "object", "additionalProperties": False,
                      "properties": {**unset, **options}}]}
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
        "logit_bias": {"type": "object", "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
                       "propertyNames": {"pattern": _digits_below(vocab_size)},
                       "additionalProperties": {**number, "minimum": -MAX_LOGIT_BIAS,
                                                "maximum": MAX_LOGIT_BIAS}},
        "response_format": response_format,
        "structured_outputs": structured,
    }

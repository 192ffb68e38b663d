"""SamplingParams (vLLM's names) and every bound a request's parameters must keep.

The ranges live here, once: the engine's front door, `LLM.generate` and the HTTP server all
refuse a request by constructing its SamplingParams, so each bound has one definition and one
message naming the field and the fix. The HTTP layer checks only JSON types and shapes (and
publishes these bounds in its JSON Schema by importing them); the few caps that only a
network-facing server has are named HTTP_MAX_* in minicb.serving.openai_protocol. A test
(tests/engine/test_hardening.py) fails if a bound is defined twice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # the penalties and filters (minicb.runner.logits_process): neutral values leave a row untouched
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    min_p: float = 0.0
    min_tokens: int = 0
    structured_outputs: StructuredOutputsParams | None = None
    # the text leaves out special tokens (end of text, chat markers), as vLLM's does by default;
    # False keeps them in the text (the token ids are the same either way)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise ValueError("stop must be a string or a list of strings (got "
                             f"{type(self.stop).__name__}).")
        self.stop = list(self.stop or [])
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError("stop_token_ids must be a list of token ids "
                             f"(got {type(self.stop_token_ids).__name__}).")
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check_int("n", self.n, 1, MAX_N)
        _check_int("max_tokens", self.max_tokens, 1, None, "ask for at least one token")
        _check_number("temperature", self.temperature, 0.0, MAX_TEMPERATURE,
                      "use 0 for greedy decoding")
        _check_number("top_p", self.top_p, 0.0, 1.0, "1.0 keeps the whole distribution")
        if self.top_p == 0:
            raise ValueError("top_p must be in (0, 1] (got 0); a tiny top_p keeps only the most "
                             "likely token.")
        if not _is_int(self.top_k) or self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or an integer >= 1 (got {self.top_k!r}).")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 0, MAX_LOGPROBS)
        self._check_processors()
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false (got {getattr(self, name)!r}).")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings (got {self.stop!r}).")
        if len(self.stop) > MAX_STOP_STRINGS or sum(len(s) for s in self.stop) > MAX_STOP_CHARS:
            raise ValueError(f"stop may hold at most {MAX_STOP_STRINGS} strings of "
                             f"{MAX_STOP_CHARS} characters in all (got {len(self.stop)} of "
                             f"{sum(len(s) for s in self.stop)}); send fewer or shorter ones.")
        for text in self.stop:
            _check_text("stop", text)
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS or any(
                not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be at most {MAX_STOP_TOKEN_IDS} token ids "
                             f"(integers >= 0); "
                             f"got {self.stop_token_ids[:5]!r}"
                             f"{'...' if len(self.stop_token_ids) > 5 else ''}.")

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            _check_number(name, getattr(self, name), -MAX_PENALTY, MAX_PENALTY, "0 turns it off")
        _check_number("repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY,
                      MAX_REPETITION_PENALTY, "1 turns it off; above 1 discourages repeats")
        _check_number("min_p", self.min_p, 0.0, 1.0, "0 turns it off")
        _check_int("min_tokens", self.min_tokens, 0, self.max_tokens,
                   "it cannot exceed max_tokens")
        if self.logit_bias is not None:
            if (not isinstance(self.logit_bias, dict)
                    or len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS):
                raise ValueError(f"logit_bias must be a dict of at most {MAX_LOGIT_BIAS_TOKENS} "
                                 "token ids to biases, e.g. {50256: -100}.")
            bias = {}
            for token, value in self.logit_bias.items():
                if isinstance(token, str) and token.isascii() and token.isdigit() \
                        and token == str(int(token)):
                    token = int(token)        # OpenAI's JSON keys are token ids as decimal text
                if not _is_int(token) or token < 0:
                    raise ValueError("logit_bias keys must be token ids: integers >= 0, or their "
                                     "decimal text without leading zeros; got "
                                     f"{str(token)[:20]!r}.")
                _check_number(f"logit_bias[{token}]", value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS,
                              "OpenAI's range: -100 bans the token, 100 all but forces it")
                bias[token] = float(value)
            self.logit_bias = bias or None
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as error:
                raise ValueError(f"structured_outputs: {error}; its fields are json, regex, "
                                 "choice, grammar, json_object, disable_any_whitespace.") from None
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ValueError("structured_outputs must be a StructuredOutputsParams (got "
                                 f"{type(self.structured_outputs).__name__}).")
            if self.ignore_eos:
                raise ValueError("structured_outputs cannot be combined with ignore_eos: the "
                                 "grammar ends the output with EOS; drop ignore_eos.")
            if self.min_tokens:
                raise ValueError("structured_outputs cannot be combined with min_tokens: the "
                                 "grammar decides where the output ends; drop min_tokens.")

    @property
    def needs_logits_processing(self) -> bool:
        """Whether any penalty, filter or constraint changes this request's logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0 or self.min_p or self.min_tokens
                    or self.structured_outputs is not None)

    @property
    def greedy(self) -> bool:
        """Temperature 0, or one so small that sampling at it is greedy (dividing logits by it
        would overflow float32)."""
        return self.temperature < GREEDY_BELOW


# Bounds of SamplingParams: beyond them a request is refused, naming the field. Each is defined
# here alone; the HTTP server's JSON Schema publishes these same names.
MAX_N = 128                       # samples of one request (the HTTP server allows fewer)
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**63 - 1              # a torch.Generator's seed
MAX_LOGPROBS = 20                 # as OpenAI's and vLLM's default
MAX_STOP_STRINGS = 32             # stop strings of one request ...
MAX_STOP_CHARS = 4096             # ... and their characters, all of them together
MAX_STOP_TOKEN_IDS = 1024
MAX_PENALTY = 2.0                 # presence_penalty and frequency_penalty in [-2, 2] (OpenAI's)
MAX_REPETITION_PENALTY = 100.0
# vLLM takes any repetition_penalty above 0; a value this small already multiplies every seen
# token's logit by 100, and one below float32's smallest number (1.4e-45) becomes 0, which turns
# a grammar mask's -inf into NaN (0 * -inf) and lets a masked token through
MIN_REPETITION_PENALTY = 0.01
MAX_LOGIT_BIAS_TOKENS = 1024      # entries of logit_bias ...
MAX_LOGIT_BIAS = 100.0            # ... each a bias in [-100, 100]: -100 bans, 100 all but forces
# characters a string prompt may have (the engine's front door, minicb.engine.inputs): far more
# than any context here, and small enough that tokenising it never stalls the engine
MAX_PROMPT_CHARS = 1_000_000
GREEDY_BELOW = 1e-5               # temperatures below this sample greedily


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value, low: int, high: int | None, hint: str = "") -> None:
    if not _is_int(value) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{name} must be an integer {span} (got "
                         f"{value!r}){'; ' + hint if hint else ''}.")


def _check_number(name: str, value, low: float, high: float, hint: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            ok = math.isfinite(float(value)) and low <= value <= high
        except OverflowError:
            ok = False
    if not ok:
        raise ValueError(f"{name} must be a finite number from {low:g} to {high:g} (got "
                         f"{value!r}); {hint}.")


def _check_text(name: str, text: str) -> None:
    """Text must encode as UTF-8: a lone surrogate (say from a broken JSON escape) cannot."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{name} is not valid text: {error.reason} at character {error.start}; "
                         "send valid UTF-8.") from None


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint (vLLM's names). `json`: a JSON schema, as a dict or a JSON string;
    `json_object=True`: any JSON object (OpenAI's response_format {"type": "json_object"});
    `regex`: a regular expression the whole output matches; `choice`: one of these strings;
    `grammar`: an EBNF grammar (xgrammar's, GBNF-like, with a `root` rule).

    `disable_any_whitespace` (vLLM's name) is the whitespace policy of JSON outputs. True, the
    default here: one layout, `{"a": 1, "b": [2, 3]}` (one space after `:` and `,`, none
    elsewhere). False: any run of spaces and newlines between JSON tokens, as JSON allows (vLLM's
    default). Whitespace carries no value, costs tokens, and is where a model that has not
    learned JSON layout drifts: on the shipped model free whitespace sent about half the outputs
    into runs of newlines until max_tokens (chapter 11 shows it), so minicb defaults to the
    compact layout and lets a client ask for free whitespace by sending False."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = True

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs must set exactly one of json, regex, choice, "
                             f"grammar or json_object (got {given or 'none'}).")
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError("structured_outputs.disable_any_whitespace must be true or false.")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    schema = json.loads(self.json)
                except ValueError as error:
                    raise ValueError(f"structured_outputs.json is not valid JSON ({error}); send "
                                     "a JSON schema object.") from None
            else:
                schema = self.json
            if not isinstance(schema, dict):
                raise ValueError("structured_outputs.json must be a JSON schema object (a dict "
                                 f"or its JSON text), got {type(schema).__name__}.")
            try:
                _check_size("json", json.dumps(schema))
            except TypeError as error:
                raise ValueError(f"structured_outputs.json holds a value JSON cannot encode "
                                 f"({error}); use only JSON types.") from None
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, str) or not value:
                    raise ValueError(f"structured_outputs.{name} must be a non-empty string.")
                _check_size(name, value)
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or len(self.choice) > MAX_CHOICES
                    or any(not isinstance(c, str) or not c for c in self.choice)):
                raise ValueError(f"structured_outputs.choice must be a list of 1 to {MAX_CHOICES} "
                                 "non-empty strings.")
            _check_size("choice", "".join(self.choice))
        if self.json_object not in (None, True, False):
            raise ValueError("structured_outputs.json_object must be true or false.")

    @property
    def key(self) -> tuple:
        """What identifies the compiled grammar: equal constraints share one compilation. A
        schema's key order stays (the output writes properties in the schema's order)."""
        if self.json is not None:
            schema = json.loads(self.json) if isinstance(self.json, str) else self.json
            return ("json", json.dumps(schema), self.disable_any_whitespace)
        if self.json_object:
            return ("json_object", "", self.disable_any_whitespace)
        if self.choice is not None:
            return ("choice", json.dumps(list(self.choice)))
        if self.regex is not None:
            return ("regex", self.regex)
        return ("grammar", self.grammar)


def _check_size(name: str, text: str) -> None:
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise ValueError(f"structured_outputs.{name} has {len(text)} characters, more than "
                         f"{MAX_CONSTRAINT_CHARS}; send a shorter constraint.")


MAX_CONSTRAINT_CHARS = 100_000    # a schema or regex longer than this is refused, not compiled
MAX_CHOICES = 1024

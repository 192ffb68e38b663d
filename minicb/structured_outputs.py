"""Structured outputs: a grammar decides which tokens may come next, the sampler masks the rest.

A request's constraint (`StructuredOutputsParams`, vLLM's names: a JSON schema, any JSON object, a
regular expression, a choice of strings or an EBNF grammar) compiles ONCE per constraint into a
grammar over the tokenizer's vocabulary (xgrammar, the default of vLLM and SGLang; an optional
extra: `pip install 'minicb[structured]'`). Each constrained request then owns a matcher, the
grammar's state after the tokens it has produced. Every step:

1. the matcher writes its row of a token bitmask (one bit per vocabulary entry: may come next);
2. the sampler sets the logits of every masked-out token to -inf, so no sampling setting can
   pick one (minicb.logits_process);
3. the token sampled is fed back (`accept`), moving the matcher on.

EOS is allowed only where the grammar may end, so an output that stops by itself is complete;
an output cut by max_tokens ends "length" and may not parse. The engine does not parse JSON: the
grammar library owns the language, the engine owns the mask in the batch.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

INSTALL_HINT = "structured outputs need the xgrammar package: pip install 'minicb[structured]'"
MAX_CONSTRAINT_CHARS = 100_000    # a schema or regex longer than this is refused, not compiled
MAX_CHOICES = 1024
CACHE_SIZE = 256                  # compiled constraints kept (least recently used dropped)


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint (vLLM's names). `json`: a JSON schema, as a dict or a JSON string;
    `json_object=True`: any JSON object (OpenAI's response_format {"type": "json_object"});
    `regex`: a regular expression the whole output matches; `choice`: one of these strings;
    `grammar`: an EBNF grammar (xgrammar's, GBNF-like, with a `root` rule).
    `disable_any_whitespace=True` allows no whitespace between JSON tokens beyond one space after
    `:` and `,` (vLLM's switch; a small model tends to loop on whitespace otherwise)."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

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


def choice_grammar(choices: list[str]) -> str:
    """One EBNF rule: exactly one of the strings (quotes and backslashes escaped), as vLLM's."""
    escaped = (re.sub(r'(["\\])', r"\\\1", c) for c in choices)
    return "root ::= " + " | ".join(f'"{c}"' for c in escaped)


class StructuredOutputManager:
    """The engine's grammar compiler over its tokenizer, and the cache of compiled constraints.

    Built lazily (the first constrained request pays for reading the vocabulary). Compiling is
    thread-safe: the async engine validates requests on its own thread."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        try:
            import xgrammar
        except ImportError:
            raise ValueError(INSTALL_HINT + ".") from None
        if tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer; this checkpoint has "
                             "none.")
        self.xgr = xgrammar
        self.vocab_size = vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                        stop_token_ids=sorted(stop_token_ids))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self._cache: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, params: StructuredOutputsParams):
        """The compiled grammar of a constraint, from the cache when it was compiled before;
        ValueError naming the problem when it cannot be compiled."""
        key = params.key
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            try:
                compiled = self._compile(params)
            except Exception as error:     # xgrammar raises RuntimeError with its C++ location
                raise ValueError(f"structured_outputs.{key[0]} cannot be compiled: "
                                 f"{_clean(error)}; fix the constraint.") from None
            self._cache[key] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return compiled

    def _compile(self, params: StructuredOutputsParams):
        any_whitespace = not params.disable_any_whitespace
        if params.json is not None:
            schema = _length_bounds_as_patterns(json.loads(params.key[1]))
            return self.compiler.compile_json_schema(json.dumps(schema),
                                                     any_whitespace=any_whitespace)
        if params.json_object:
            return self.compiler.compile_json_schema('{"type": "object"}',
                                                     any_whitespace=any_whitespace)
        if params.regex is not None:
            return self.compiler.compile_regex(params.regex)
        if params.choice is not None:
            return self.compiler.compile_grammar(choice_grammar(list(params.choice)))
        return self.compiler.compile_grammar(params.grammar)

    def matcher(self, params: StructuredOutputsParams) -> StructuredOutputMatcher:
        """A fresh matcher for one request (one per sample: each has its own output)."""
        return StructuredOutputMatcher(self.xgr.GrammarMatcher(self.compile(params)),
                                       self.vocab_size)


class StructuredOutputMatcher:
    """One request's place in its grammar: which tokens may come next, and the move on."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write row `row` of an int32 bitmask [rows, ceil(vocab / 32)]: bit t % 32 of word
        t // 32 is 1 when token t may come next."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Move on past a sampled token; False if the grammar refuses it (the mask allowed it
        only if the grammar did, so False means the mask was not applied)."""
        return self.matcher.accept_token(token_id)


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed bitmask: -1 is every bit set."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def bitmask_to_bool(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack [rows, words] int32 bits into [rows, vocab] booleans (True: allowed)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def _length_bounds_as_patterns(schema):
    """The schema with each string's minLength/maxLength (and no pattern or format of its own)
    written as the equivalent pattern over characters JSON allows unescaped. xgrammar (0.2.8)
    compiles a length-bounded string to any character but quote, backslash and line breaks, so
    it would let a raw control character (U+0000 to U+001F) in, and JSON forbids those: the
    output would not parse. Its bounded strings take no escapes either way."""
    if isinstance(schema, list):
        return [_length_bounds_as_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _length_bounds_as_patterns(value) for key, value in schema.items()}
    bounded = "minLength" in schema or "maxLength" in schema
    if (schema.get("type") == "string" and bounded and "pattern" not in schema
            and "format" not in schema):
        low, high = schema.pop("minLength", 0), schema.pop("maxLength", "")
        schema["pattern"] = f'^[^"\\\\\\u0000-\\u001f]{{{low},{high}}}$'
    return schema


def _clean(error: Exception) -> str:
    """xgrammar's message without its timestamp and C++ source location."""
    text = " ".join(str(error).split())
    text = re.sub(r"^\[[\d:]+\]\s*\S+:\d+:\s*", "", text)
    return text.replace("Check failed: (error.empty()) is false: ", "")[:500]

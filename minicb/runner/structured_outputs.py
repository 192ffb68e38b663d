"""Structured outputs: a grammar decides which tokens may come next, the sampler masks the rest.

A request's constraint (`StructuredOutputsParams`, vLLM's names: a JSON schema, any JSON object, a
regular expression, a choice of strings or an EBNF grammar) compiles ONCE per constraint into a
grammar over the tokenizer's vocabulary (xgrammar, the default of vLLM and SGLang; an optional
extra: `pip install 'minicb[structured]'`). Each constrained request then owns a matcher, the
grammar's state after the tokens it has produced. Every step:

1. the matcher writes its row of a token bitmask (one bit per vocabulary entry: may come next);
2. the sampler sets the logits of every masked-out token to -inf, so no sampling setting can
   pick one (minicb.runner.logits_process);
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

import torch

from minicb.params import StructuredOutputsParams

INSTALL_HINT = "structured outputs need the xgrammar package: pip install 'minicb[structured]'"
CACHE_SIZE = 256                  # compiled constraints kept (least recently used dropped)


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

"""Log-probabilities in OpenAI's two shapes, from the engine's (vLLM's): per position a dict
{token_id: logprob} holding the top-k and the chosen token (None for a prompt's first token,
which nothing predicts).

Completions (the legacy shape lm-evaluation-harness and other scorers read):
    {"tokens": ["def", " add"], "token_logprobs": [null, -2.1],
     "top_logprobs": [null, {" add": -2.1, " f": -1.7}], "text_offset": [0, 3]}
`top_logprobs` holds the k most likely and the chosen token (so up to k + 1 entries, as OpenAI
documents); with echo the prompt's positions come first.

Chat:
    {"content": [{"token": " add", "logprob": -2.1, "bytes": [32, 97, 100, 100],
                  "top_logprobs": [{"token": " f", "logprob": -1.7, "bytes": [32, 102]}, ...]}]}
`top_logprobs` holds exactly the k most likely.

JSON has no -inf: a token a constraint or a logit bias ruled out gets -9999.0 (as vLLM's server).
"""

from __future__ import annotations

import math

LOGPROB_FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR


def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    """The k most likely of a position's entries (the chosen token is among the entries even
    when it is not among the k most likely: it is then the least likely of them)."""
    return sorted(entry.items(), key=lambda item: -item[1])[:k]


def token_texts(tokenizer, vocab_size: int) -> list[str]:
    """Each token id's text, decoded alone (special tokens kept), computed once per server."""
    if tokenizer is None:
        return [f"token_id:{i}" for i in range(vocab_size)]
    texts = tokenizer.batch_decode([[i] for i in range(vocab_size)], skip_special_tokens=False)
    return texts + [f"token_id:{i}" for i in range(len(texts), vocab_size)]


class CompletionLogprobs:
    """Builds the legacy shape chunk by chunk: text offsets run on across a stream's chunks."""

    def __init__(self, texts: list[str], k: int):
        self.texts, self.k, self.offset = texts, k, 0

    def __call__(self, token_ids: list[int], entries: list[dict[int, float] | None]) -> dict:
        result = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, entry in zip(token_ids, entries):
            text = self.texts[token_id]
            result["tokens"].append(text)
            result["text_offset"].append(self.offset)
            self.offset += len(text)
            if entry is None:
                result["token_logprobs"].append(None)
                result["top_logprobs"].append(None)
                continue
            chosen = _finite(entry[token_id])
            top = {self.texts[i]: _finite(logprob) for i, logprob in _top(entry, self.k)}
            top.setdefault(text, chosen)
            result["token_logprobs"].append(chosen)
            result["top_logprobs"].append(top)
        return result


def chat_logprobs(texts: list[str], k: int, token_ids: list[int],
                  entries: list[dict[int, float]]) -> dict:
    def token(token_id: int, logprob: float) -> dict:
        text = texts[token_id]
        return {"token": text, "logprob": _finite(logprob),
                "bytes": list(text.encode("utf-8", "surrogatepass"))}

    return {"content": [{**token(token_id, entry[token_id]),
                         "top_logprobs": [token(i, logprob) for i, logprob in _top(entry, k)]}
                        for token_id, entry in zip(token_ids, entries)]}


class ChoiceLogprobs:
    """One choice's log-probabilities, piece by piece (a stream's chunks, or the whole answer
    at once), in its endpoint's shape. The prompt's come first, once (completions with echo)."""

    def __init__(self, chat: bool, k: int, texts: list[str]):
        self.chat, self.k, self.texts = chat, k, texts
        self.legacy = None if chat else CompletionLogprobs(texts, k)

    def __call__(self, token_ids: list[int], entries: list[dict[int, float]] | None,
                 prompt_token_ids: list[int] | None = None,
                 prompt_entries: list[dict[int, float] | None] | None = None) -> dict:
        entries = (entries or [])[-len(token_ids):] if token_ids else []
        if self.chat:
            return chat_logprobs(self.texts, self.k, token_ids, entries)
        if prompt_entries is None:
            return self.legacy(token_ids, entries)
        prompt = self.legacy(prompt_token_ids, prompt_entries)
        output = self.legacy(token_ids, entries)
        return {key: prompt[key] + output[key] for key in prompt}

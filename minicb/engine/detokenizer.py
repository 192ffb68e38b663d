"""Incremental detokenisation: turn a growing list of token ids into text, a few tokens at a time.

The engine keeps one per request that has stop strings or whose text is streamed, and feeds it
each step's new tokens on the step thread (the only thread that touches the tokenizer while a
step runs). Decoding each new token on its own goes wrong in two ways:
  - byte-level BPE can split one character (é, 中, an emoji) across several tokens; decoding
    only the first part yields the replacement character U+FFFD;
  - SentencePiece-style tokenizers drop the leading space of the first token they decode, so
    "▁world" alone decodes to "world", not " world".
So we decode a short window that starts one read earlier, keep only what the newest tokens
added, and wait while the window's text still ends in U+FFFD (the character is not complete).

Stop strings are looked for in the new text only (plus the last `longest stop - 1` characters
before it, where a stop string may have begun): the work per token stays the same however long
the output grows, instead of decoding and searching the whole output at every token.
"""

from __future__ import annotations

REPLACEMENT_CHARACTER = "\ufffd"


class IncrementalDetokenizer:
    """`add` each step's new tokens; it returns the text that became safe to send. Once the
    request finishes, `finish` with the final text returns the rest.

    With stop strings, the last `longest stop - 1` characters are held back: they might be the
    start of a stop string that a later token completes, and text already sent cannot be taken
    back. When a stop string appears, `stop` names it and `text` ends just before it.
    """

    def __init__(self, tokenizer, stop: list[str] | None = None,
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stops = list(stop or [])
        self.token_ids: list[int] = []
        self.prefix_offset = 0   # the window to decode starts here
        self.read_offset = 0     # tokens before this are already turned into text
        self.text = ""           # all text decoded so far (cut before a stop string once found)
        self.num_sent = 0        # characters of `text` already handed out
        self.holdback = max((len(s) for s in self.stops), default=1) - 1
        self.stop: str | None = None   # the stop string found, if any

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the text that became final and safe to send."""
        self.token_ids.extend(new_token_ids)
        if self.tokenizer is None or not new_token_ids or self.stop is not None:
            return ""
        before = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.token_ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT_CHARACTER):
            old_length = len(self.text)
            self.text += after[len(before):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            if self.stops:
                self._find_stop(max(old_length - self.holdback, 0))
        end = len(self.text) if self.stop is not None else \
            max(len(self.text) - self.holdback, self.num_sent)
        piece, self.num_sent = self.text[self.num_sent:end], end
        return piece

    def _find_stop(self, start: int) -> None:
        """The earliest stop string that ends in the new text: cut the text before it."""
        hits = [(index, stop) for stop in self.stops
                if (index := self.text.find(stop, start)) >= 0]
        if hits:
            index, self.stop = min(hits)
            self.text = self.text[:index]

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` (the engine's whole output text) after what was sent."""
        piece = final_text[self.num_sent:]
        self.num_sent = len(final_text)
        return piece

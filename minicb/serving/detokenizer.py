"""Incremental detokenisation: turn a growing list of token ids into text deltas for streaming.

Decoding each new token on its own goes wrong in two ways:
  - byte-level BPE can split one character (é, 中, an emoji) across several tokens; decoding
    only the first part yields the replacement character U+FFFD;
  - SentencePiece-style tokenizers drop the leading space of the first token they decode, so
    "▁world" alone decodes to "world", not " world".
So we decode a short window that starts one read earlier, emit only what the newest tokens
added, and wait while the window's text still ends in U+FFFD (the character is not complete).
"""

from __future__ import annotations

REPLACEMENT_CHARACTER = "\ufffd"


class IncrementalDetokenizer:
    """While a request runs, `add` each step's new tokens and send what it returns; in the step
    the request finishes, call `finish` with the engine's final text instead (that text may be
    cut at a stop string, so the last step's tokens must not go out through `add`).

    With stop strings, the last `longest stop - 1` characters are held back: they might be the
    start of a stop string that a later token completes, and text already sent cannot be taken
    back.
    """

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.prefix_offset = 0   # the window to decode starts here
        self.read_offset = 0     # tokens before this are already turned into text
        self.text = ""           # all text decoded so far
        self.num_sent = 0        # characters of `text` already handed out
        self.holdback = max((len(s) for s in stop or []), default=1) - 1

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the text that became final and safe to send."""
        self.token_ids.extend(new_token_ids)
        if self.tokenizer is None or not new_token_ids:
            return ""
        before = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.token_ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT_CHARACTER):
            self.text += after[len(before):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        end = max(len(self.text) - self.holdback, self.num_sent)
        piece, self.num_sent = self.text[self.num_sent:end], end
        return piece

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` (the engine's whole output text) after what was sent."""
        piece = final_text[self.num_sent:]
        self.num_sent = len(final_text)
        return piece

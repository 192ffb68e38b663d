"""Schemathesis hooks for the contract run (`make schemathesis`,
tests/serving/test_openapi_contract.py).

The one rule of the server that its OpenAPI document cannot state is the context: a prompt's
tokens plus max_tokens must fit max_model_len (else a 400, code "context_length_exceeded"). A
schema-valid body may break it (a long message, or max_tokens at its maximum with any prompt),
so the generated cases that might are left out here, by a bound that never undercounts: the
tokenizer is byte-level BPE, so a text has at most as many tokens as UTF-8 bytes, plus the
special tokens the tokenizer adds. Every other rule is in the schema and checked by every check.
"""

from __future__ import annotations

import os

try:
    import schemathesis
except ImportError:       # the in-process contract test imports most_prompt_tokens alone
    schemathesis = None

MAX_MODEL_LEN = int(os.environ.get("MINICB_MAX_MODEL_LEN", "512"))
SPECIAL = 2          # tokens the tokenizer may add around a text (BOS, EOS)


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def most_prompt_tokens(body: dict) -> int:
    """An upper bound of the prompt's tokens, for either endpoint."""
    if "messages" in body and isinstance(body["messages"], list):
        # the chat template writes "# role: content" per message (each newline of the content
        # followed by "# ") and "# assistant:" at the end
        rendered = "".join(
            f"# {m.get('role', '')}: " + _text(m.get("content")).replace("\n", "\n# ") + "\n"
            for m in body["messages"] if isinstance(m, dict)) + "# assistant:\n"
        return len(rendered.encode("utf-8", "surrogatepass")) + SPECIAL
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "surrogatepass")) + SPECIAL
    return len(prompt) if isinstance(prompt, list) else 0


if schemathesis is not None:
    @schemathesis.hook
    def filter_case(context, case) -> bool:
        """Keep every negative case, and the positive ones that surely fit the context."""
        body = case.body
        meta = case.meta
        if not isinstance(body, dict) or meta is None or not meta.generation.mode.is_positive:
            return True
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_completion_tokens")
        counted = isinstance(max_tokens, (int, float)) and not isinstance(max_tokens, bool)
        needed = most_prompt_tokens(body) + (int(max_tokens) if counted else 1)
        return needed <= MAX_MODEL_LEN

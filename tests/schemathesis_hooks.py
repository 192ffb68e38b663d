"""Schemathesis hooks for the contract run (`make schemathesis`,
tests/serving/test_openapi_contract.py).

The rules of the server that its OpenAPI document cannot state: the context (a prompt's tokens
plus max_tokens must fit max_model_len, else a 400, code "context_length_exceeded"), the rules
that relate two fields, and the constraints only the grammar library can judge (a JSON schema,
regex or grammar). A schema-valid body may break the context (a long message, or max_tokens at
its maximum with any prompt), so the generated cases that might are left out here, by a bound
that never undercounts: the tokenizer is byte-level BPE, so a text has at most as many tokens as
UTF-8 bytes, plus the special tokens the tokenizer adds; and so are those that break the others
(breaks_a_rule_beyond_the_schema). Every other rule is in the schema and checked by every check.
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


def breaks_a_rule_beyond_the_schema(body: dict, max_model_len: int = MAX_MODEL_LEN) -> bool:
    """Whether a schema-valid body breaks one of the server's rules that relate two fields, or
    carries a constraint only the grammar library can judge (minicb.serving.openai_sampling):
    top_logprobs without logprobs: true; min_tokens above max_tokens; a constraint with
    ignore_eos or min_tokens; a JSON schema, regex or grammar
    (compiled or refused with a 400 quoting xgrammar: the dedicated tests cover them)."""
    chat = "messages" in body
    if chat and body.get("top_logprobs") and body.get("logprobs") is not True:
        return True
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = max_model_len if chat else 16
    min_tokens = body.get("min_tokens") or 0
    if isinstance(min_tokens, (int, float)) and min_tokens > max_tokens:
        return True
    response_format = body.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    extension = body.get("structured_outputs")
    constrained = kind in ("json_object", "json_schema") or extension is not None
    if constrained and (body.get("ignore_eos") or min_tokens):
        return True
    if kind == "json_schema":
        return True
    return isinstance(extension, dict) and any(
        extension.get(name) is not None for name in ("json", "regex", "grammar"))


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
        # max_tokens 0 (a completion's prompt alone) still computes one token
        needed = most_prompt_tokens(body) + (max(int(max_tokens), 1) if counted else 1)
        return needed <= MAX_MODEL_LEN and not breaks_a_rule_beyond_the_schema(body)

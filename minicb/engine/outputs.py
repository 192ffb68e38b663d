"""What the engine hands back, shaped like vLLM's RequestOutput so readers' code ports.

Every step reports each request that got a token (or finished). While it runs, its output
carries that step's tokens only (as vLLM's delta outputs do): nothing grows with the length of
the output. The step it finishes, the output carries everything: all its tokens, its text,
logprobs and metrics, copied that once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minicb.metrics import RequestMetrics


@dataclass
class CompletionOutput:
    index: int
    text: str                 # the whole text, once finished ("" while running)
    token_ids: list[int]      # finished: every output token; running: this step's
    finish_reason: str | None = None      # "stop" | "length" | "abort" | "error" | None (running)
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    # per token (finished: every token's; running: this step's tokens'): {token id: logprob} of
    # the top `logprobs` tokens and of the token itself (vLLM's dict, with floats for its Logprob
    # objects), the raw model's log-softmax; None unless asked
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None
    num_tokens: int = 0                   # output tokens so far
    new_text: str = ""        # the text this step added (when the engine streams text)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None            # once finished (None while running)
    new_token_ids: list[int] = field(default_factory=list)   # this step's tokens (for streaming)
    error: str | None = None
    # per prompt position: {token id: logprob} of the prompt's token there and the top
    # prompt_logprobs, None for the first position (nothing predicts it); None unless asked.
    # Given on a request's first output and its last
    prompt_logprobs: list[dict[int, float] | None] | None = None

"""What the engine hands back, shaped like vLLM's RequestOutput so readers' code ports."""

from __future__ import annotations

from dataclasses import dataclass, field

from minicb.metrics import RequestMetrics


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None      # "stop" | "length" | "abort" | "error" | None (running)
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[dict[int, float]] | None = None   # per token: top-k {token_id: logprob}
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    new_token_ids: list[int] = field(default_factory=list)   # this step's tokens (for streaming)
    error: str | None = None

"""SamplingParams (vLLM's names) and the Sampler that turns logits into next tokens.

Every request owns a CPU `torch.Generator`. Sampling draws ONE uniform number per request per
step from it and inverts the request's own CDF, so a seeded request yields the same tokens alone
or inside any batch, on any device: its randomness never depends on its neighbours.

The CDF runs over the vocabulary in token-id order: any fixed order samples the same
distribution, and this one needs no sort. Only a request with top_k or top_p sorts its row, to
find the tokens it keeps (sorting a batch's rows of 4,096 logits costs more than the rest of
sampling together, about a third of a small model's 64-row decode step on a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1 (got {self.n!r}).")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1 (got {self.max_tokens!r}); "
                             "ask for at least one token.")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature!r}); "
                             "use 0 for greedy decoding.")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p!r}); 1.0 keeps the whole distribution.")
        if not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or an integer >= 1 (got {self.top_k!r}).")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None (got {self.seed!r}).")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None or an integer >= 0 (got {self.logprobs!r}).")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings (got {self.stop!r}).")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # per row: (logprob of the chosen token, {token_id: logprob} of the top-k) or None
    logprobs: list[tuple[float, dict[int, float]] | None]


class Sampler:
    """Greedy at temperature 0; otherwise temperature → (top-k → top-p) → one inverse-CDF draw."""

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator]) -> SamplerOutput:
        logits = logits.float()
        greedy = [p.greedy for p in params]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        elif not any(greedy):
            tokens = self._sample(logits, params, generators)
        else:
            tokens = torch.where(torch.tensor(greedy, device=logits.device), logits.argmax(dim=-1),
                                 self._sample(logits, params, generators))
        token_ids = tokens.tolist()
        return SamplerOutput(token_ids, self._logprobs(logits, tokens, params))

    @staticmethod
    def _sample(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator]) -> torch.Tensor:
        device, vocab = logits.device, logits.shape[-1]
        temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params],
                                   device=device)
        probs = (logits / temperature[:, None]).softmax(dim=-1)
        restricted = [row for row, p in enumerate(params) if p.top_k > 0 or p.top_p < 1]
        if restricted:
            rows = torch.tensor(restricted, device=device)
            top_k = torch.tensor([params[r].top_k if params[r].top_k > 0 else vocab for r in restricted],
                                 device=device)
            top_p = torch.tensor([params[r].top_p for r in restricted], device=device)
            probs[rows] = Sampler._keep_top_k_top_p(probs[rows], top_k, top_p)
        cdf = probs.cumsum(dim=-1)
        uniforms = torch.cat([torch.rand(1, generator=g) for g in generators]).to(device)
        # the first token whose cumulative mass exceeds u * total: a token of mass 0 is never it
        choice = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)
        return choice.clamp(max=vocab - 1).squeeze(1)

    @staticmethod
    def _keep_top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        """Zero every token outside the row's top_k most likely, then outside the smallest set of
        the most likely whose mass (renormalised over the top_k) reaches top_p; the first always stays."""
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(probs.shape[-1], device=probs.device)
        sorted_probs = sorted_probs.masked_fill(ranks[None, :] >= top_k[:, None], 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p[:, None], 0.0)
        return torch.zeros_like(probs).scatter_(1, sorted_ids, sorted_probs)

    @staticmethod
    def _logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                  params: list[SamplingParams]) -> list[tuple[float, dict[int, float]] | None]:
        wanted = [p.logprobs for p in params]
        if all(w is None for w in wanted):
            return [None] * len(params)
        logprobs = logits.log_softmax(dim=-1)
        chosen = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
        k = max(w or 0 for w in wanted)
        top_values, top_ids = logprobs.topk(max(k, 1), dim=-1)
        result: list[tuple[float, dict[int, float]] | None] = []
        for row, w in enumerate(wanted):
            if w is None:
                result.append(None)
                continue
            top = dict(zip(top_ids[row, :w].tolist(), top_values[row, :w].tolist()))
            result.append((chosen[row], top))
        return result

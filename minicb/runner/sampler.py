"""The Sampler: it turns a batch's logits into next tokens.

Every request owns a CPU `torch.Generator`. Sampling draws ONE uniform number per request per
step from it and inverts the request's own CDF, so a seeded request yields the same tokens alone
or inside any batch, on any device: its randomness never depends on its neighbours.

The CDF runs over the vocabulary in token-id order: any fixed order samples the same
distribution, and this one needs no sort. Only a request with top_k or top_p sorts its row, to
find the tokens it keeps (sorting a batch's rows of 4,096 logits costs more than the rest of
sampling together, about a third of a small model's 64-row decode step on a CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minicb.params import SamplingParams
from minicb.plan import Logprob, SamplerOutput
from minicb.runner.logits_process import LogitsState, apply_logits_processors


class Sampler:
    """Greedy at temperature 0; otherwise temperature → (top-k → top-p) → one inverse-CDF draw.

    Its public functions are the only place these rules live: the runner samples every row with
    `sample` and reads every emitted token's logprob with `logprobs`; speculative decoding's
    acceptance rule and the draft model draw from `probs` with `draw`."""

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator],
                 states: Sequence[LogitsState | None] | None = None) -> SamplerOutput:
        """One token per row, with its logprobs (of the raw logits, as vLLM's default mode)."""
        logits = logits.float()
        tokens = self.sample(logits, params, generators, states)
        return SamplerOutput(tokens.tolist(), self.logprobs(logits, tokens, params))

    @staticmethod
    def sample(logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator],
               states: Sequence[LogitsState | None] | None = None) -> torch.Tensor:
        """One token per row: the argmax for a greedy row, a draw for the others, after the
        rows' logits processors. `states`: each row's LogitsState (minicb.runner.logits_process),
        for rows with penalties, min_tokens or a grammar; None where no row has any."""
        # the one hook: penalties, bias, filters and grammar masks, on the rows that ask
        logits = apply_logits_processors(logits.float(), params, states)
        greedy = [p.greedy for p in params]
        if all(greedy):
            return Sampler.argmax(logits)
        drawn = Sampler.draw(Sampler.probs(logits, params), generators)
        if not any(greedy):
            return drawn
        return torch.where(torch.tensor(greedy, device=logits.device), Sampler.argmax(logits),
                           drawn)

    @staticmethod
    def argmax(logits: torch.Tensor) -> torch.Tensor:
        """The most likely token of each row (the first, on a tie). On a CPU by numpy's
        vectorised argmax: torch's takes about nine times as long there (128 against 14 µs for
        256 rows of 512 logits on the project's 2-core machine), a sizeable part of a step."""
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            return torch.from_numpy(logits.detach().numpy().argmax(axis=-1))
        return logits.argmax(dim=-1)

    @staticmethod
    def probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Each row's distribution to draw from: temperature, then top-k and top-p (a greedy
        row gets temperature 1; the caller takes its argmax instead)."""
        device, vocab = logits.device, logits.shape[-1]
        temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params],
                                   device=device)
        probs = (logits.float() / temperature[:, None]).softmax(dim=-1)
        restricted = [row for row, p in enumerate(params) if p.top_k > 0 or p.top_p < 1]
        if restricted:
            rows = torch.tensor(restricted, device=device)
            top_k = torch.tensor([min(params[r].top_k, vocab) if params[r].top_k > 0 else vocab
                                  for r in restricted], device=device)
            # float64: a tiny top_p (1e-300) must stay above 0, where it keeps the top token alone
            top_p = torch.tensor([params[r].top_p for r in restricted], device=device,
                                 dtype=torch.float64)
            probs[rows] = Sampler.keep_top_k_top_p(probs[rows], top_k, top_p)
        return probs

    @staticmethod
    def draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """One token per row by inverse CDF, one uniform from each row's own generator. The rows
        need not be normalised: the draw scales the uniform by each row's total."""
        cdf = probs.cumsum(dim=-1)
        uniforms = torch.cat([torch.rand(1, generator=g) for g in generators]).to(probs.device)
        # the first token whose cumulative mass exceeds u * total: a token of mass 0 is never it
        choice = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)
        return choice.clamp(max=probs.shape[-1] - 1).squeeze(1)

    @staticmethod
    def keep_top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor,
                         top_p: torch.Tensor) -> torch.Tensor:
        """Zero every token outside the row's top_k most likely, then outside the smallest set of
        the most likely whose mass (renormalised over the top_k) reaches top_p; the first always
        stays."""
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(probs.shape[-1], device=probs.device)
        sorted_probs = sorted_probs.masked_fill(ranks[None, :] >= top_k[:, None], 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(
            (mass_before >= top_p[:, None]) & (ranks[None, :] > 0), 0.0)
        return torch.zeros_like(probs).scatter_(1, sorted_ids, sorted_probs)

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                 params: list[SamplingParams]) -> list[Logprob | None]:
        """Row r's chosen token `tokens[r]`: its logprob and the row's top `params[r].logprobs`,
        from the raw logits (as vLLM reports them); None for a row that asked for none."""
        return Sampler.top_logprobs(logits, tokens, [p.logprobs for p in params])

    @staticmethod
    def top_logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                     wanted: list[int | None]) -> list[Logprob | None]:
        """Per row: (the log-probability of `tokens[row]`, {token id: log-probability} of the
        row's top wanted[row] tokens and of tokens[row] itself, as vLLM's), or None where
        wanted[row] is None. The log-softmax of the logits as given, in float32."""
        if all(w is None for w in wanted):
            return [None] * len(wanted)
        logprobs = logits.float().log_softmax(dim=-1)
        tokens = tokens.to(logprobs.device)
        chosen = logprobs.gather(1, tokens[:, None])
        k = max(max(w or 0 for w in wanted), 1)
        top_values, top_ids = logprobs.topk(k, dim=-1)
        # one copy to the host for the whole batch, not one per row: per row, the chosen token's
        # logprob, the top k logprobs, their ids and the chosen id (float64 holds every id and
        # every float32 exactly)
        table = torch.cat([chosen.double(), top_values.double(), top_ids.double(),
                           tokens[:, None].double()], dim=1).tolist()
        result: list[Logprob | None] = []
        for row, w in zip(table, wanted):
            if w is None:
                result.append(None)
                continue
            top = dict(zip(map(int, row[1 + k:1 + k + w]), row[1:1 + w]))
            top.setdefault(int(row[-1]), row[0])
            result.append((row[0], top))
        return result

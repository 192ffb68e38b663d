"""The acceptance rule: which of a verification row's proposed tokens the target keeps.

Greedy rows keep the longest prefix equal to the target's argmax, so the output is exactly what
decoding without speculation gives. Sampled rows use the rejection rule of Leviathan et al.
(2023) and Chen et al. (2023): accept a proposed token x with probability min(1, p(x)/q(x)), and
on the first rejection draw from max(0, p - q), normalised. Every emitted token is then
distributed exactly as the target model's own sample would be. p is the sampler's own
distribution and every draw the sampler's own inverse-CDF draw (minicb.runner.sampler.Sampler).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minicb.params import SamplingParams
from minicb.runner.sampler import Sampler


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from for one request: temperature, then top-k and top-p.
    `logits` is [positions, vocab]; the result has the same shape and rows summing to 1."""
    return Sampler.probs(logits, [params] * logits.shape[0])


def accept(logits: torch.Tensor, proposed: Sequence[int], params: SamplingParams,
           generator: torch.Generator | None = None,
           draft_probs: torch.Tensor | None = None) -> list[int]:
    """The tokens a verification step emits for one request: the accepted prefix of `proposed`
    and then one more (the target's correction at the first rejection, or a bonus token after the
    last position when all k are accepted). Between 1 and k + 1 tokens.

    `logits` is [k + 1, vocab]: row i scores the token after proposed[:i]. `draft_probs`
    ([k, vocab]) is the proposer's distribution for each proposed token; None means a
    deterministic proposer (prompt lookup), whose q puts all its mass on the proposed token.
    """
    k = len(proposed)
    if logits.shape[0] != k + 1:
        raise ValueError(f"verification needs k + 1 = {k + 1} rows of logits, got "
                         f"{logits.shape[0]}")
    if params.greedy:
        target = Sampler.argmax(logits.float()).tolist()
        accepted = 0
        while accepted < k and proposed[accepted] == target[accepted]:
            accepted += 1
        return list(proposed[:accepted]) + [target[accepted]]

    if generator is None:
        raise ValueError("a sampled request needs its generator to verify proposals")
    p = target_probs(logits, params).double()
    out: list[int] = []
    for i, token in enumerate(proposed):
        if draft_probs is None:
            q_row = torch.zeros_like(p[i])
            q_row[token] = 1.0
        else:
            q_row = draft_probs[i].double()
        ratio = p[i, token] / q_row[token] if q_row[token] > 0 else torch.tensor(0.0)
        u = torch.rand(1, generator=generator, dtype=torch.float64).item()
        if u < min(1.0, float(ratio)):
            out.append(int(token))
            continue
        residual = (p[i] - q_row).clamp(min=0)
        if residual.sum() <= 0:        # p == q: nothing to correct towards; p itself is right
            residual = p[i]
        return out + Sampler.draw(residual[None], [generator]).tolist()
    return out + Sampler.draw(p[k:], [generator]).tolist()

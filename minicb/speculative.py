"""Speculative decoding's two halves that need no engine: proposing tokens and accepting them.

A decode step reads every weight to produce one token per request. Speculation guesses k tokens
cheaply, then the target model scores all of them (plus the token before them) in ONE step, as a
short multi-token row, and keeps the longest run it agrees with, plus one token of its own. A
step then yields between 1 and k + 1 tokens for the weight reads of one.

- `propose_ngram`: prompt lookup. Find the last earlier place where the request's final n tokens
  appeared (in its prompt or its output) and propose the k tokens that followed them there.
  Code repeats itself (names, indentation, boilerplate), so on the shipped model this pays.
- `accept`: the verification rule. Greedy rows keep the longest prefix equal to the target's
  argmax, so the output is exactly what decoding without speculation gives. Sampled rows use the
  rejection rule of Leviathan et al. (2023) and Chen et al. (2023): accept a proposed token x with
  probability min(1, p(x)/q(x)), and on the first rejection draw from max(0, p - q), normalised.
  Every emitted token is then distributed exactly as the target model's own sample would be.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from minicb.sampling import Sampler, SamplingParams


def propose_ngram(token_ids: Sequence[int], k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """Up to k tokens that followed the last earlier occurrence of the sequence's final n tokens,
    trying the longest n first (a longer match is a better predictor); [] when nothing matches."""
    if k <= 0:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        # every window of n tokens that starts early enough to have a token after it
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if len(starts):
            follow = starts[-1] + n            # the most recent match: the freshest context
            return tokens[follow:follow + k].tolist()
    return []


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from for one request: temperature, then top-k and top-p.
    `logits` is [positions, vocab]; the result has the same shape and rows summing to 1."""
    probs = (logits.float() / params.temperature).softmax(dim=-1)
    if params.top_k > 0 or params.top_p < 1:
        vocab = probs.shape[-1]
        top_k = torch.full((probs.shape[0],), min(params.top_k, vocab) if params.top_k > 0
                           else vocab, device=probs.device)
        top_p = torch.full((probs.shape[0],), params.top_p, device=probs.device,
                           dtype=torch.float64)
        probs = Sampler._keep_top_k_top_p(probs, top_k, top_p)
    return probs


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a (possibly unnormalised) distribution, by one uniform draw: the sampler's
    own inverse-CDF method."""
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand(1, generator=generator, dtype=torch.float64).item() * cdf[-1].item()
    return int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True)
               .clamp(max=len(cdf) - 1))


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
        target = logits.argmax(dim=-1).tolist()
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
        return out + [_draw(residual, generator)]
    return out + [_draw(p[k], generator)]

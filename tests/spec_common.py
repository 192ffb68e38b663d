"""The acceptance rule's distribution check, shared by the speculative-decoding tests
(tests/spec/) and chapter 08's exercise tests: a chi-square test over a tiny vocabulary whose
target distribution is the same at every position."""

from __future__ import annotations

import torch

from minicb.params import SamplingParams

SIGNIFICANCE = 1e-3         # the chi-square tests reject at this p-value (seeded: deterministic)
VOCAB = 6
TARGET = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
DRAFT = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.20, 0.30])     # a poor draft on purpose


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(len(counts) - 1))
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def acceptance_stream(rule, steps: int = 6000, k: int = 3, deterministic_proposer: bool = False):
    """The tokens emitted over many verification steps when the target's distribution is the
    same at every position (so the target's own samples would be independent draws from TARGET)."""
    params = SamplingParams(temperature=1.0, seed=0)
    logits = TARGET.log().expand(k + 1, VOCAB).clone()
    gen, draft_gen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    first, everything = torch.zeros(VOCAB), torch.zeros(VOCAB)
    for _ in range(steps):
        if deterministic_proposer:
            proposed, draft = [0, 1, 0], None          # prompt lookup: q is all on its guess
        else:
            proposed = torch.multinomial(DRAFT, k, replacement=True, generator=draft_gen).tolist()
            draft = DRAFT.expand(k, VOCAB)
        out = rule(logits, proposed, params, gen, draft)
        first[out[0]] += 1
        for token in out:
            everything[token] += 1
    return first, everything

"""Speculative decoding: the proposers and the acceptance rule, together.

A decode step reads every weight to produce one token per request. Speculation guesses k tokens
cheaply, then the target model scores all of them (plus the token before them) in ONE step, as a
short multi-token row, and keeps the longest run it agrees with, plus one token of its own. A
step then yields between 1 and k + 1 tokens for the weight reads of one; to the scheduler that
row is an ordinary row whose result is a list of tokens (minicb.runner.sampler.ModelRunnerOutput).

- `ngram.propose_ngram`: prompt lookup, proposing from the request's own tokens;
- `draft_model.DraftModelProposer`: a smaller model drafts the k tokens, its KV in the target's
  blocks;
- `rejection.accept`: the verification rule, exact for greedy and sampled requests alike.
"""

from minicb.spec.ngram import propose_ngram
from minicb.spec.rejection import accept, target_probs

__all__ = ["accept", "propose_ngram", "target_probs"]

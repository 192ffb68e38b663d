# Generated from solutions/ch08_speculative.py by scripts/make_exercises.py. Replace each
# NotImplementedError with your code, then run `make grade CH=08`.
"""Chapter 08 exercise: speculative decoding's proposer (prompt lookup) and its acceptance rule.

A decode step reads every weight to make one token per request. Speculation guesses k tokens
cheaply, the target model scores the last token and the k guesses in ONE step, and the rule
below keeps the longest run it agrees with, plus one token of the target's own:

    sequence so far   ... def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a
    prompt lookup     the last 2-4 tokens occurred before; propose what followed them: " + b \\n"
    verification      the target scores [a, " +", " b", "\\n"] in one pass
    acceptance        it agrees with " +" but wants " -": emit " -" after nothing accepted, or
                      " + b" and its own next token when it agrees with all of them

Greedy requests keep the longest prefix equal to the target's argmax, so the output is exactly
what decoding without speculation gives. Sampled requests use the rejection rule (Leviathan et
al. 2023; Chen et al. 2023): accept a proposed token x with probability min(1, p(x) / q(x)), and
at the first rejection draw from max(0, p - q), normalised; every emitted token is then
distributed as the target's own sample.

Your two functions replace minicb's (minicb/spec/) inside the real engine: the
scheduler proposes with your `propose_ngram`, the runner verifies with your `accept`, and the
greedy output must still equal transformers'.

Grade it: make grade CH=08
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minicb.params import SamplingParams
from minicb.spec.rejection import target_probs  # noqa: F401 (given: the sampled rule uses it)


def propose_ngram(token_ids: Sequence[int], k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """Prompt lookup: up to k tokens that followed the LAST earlier occurrence of the sequence's
    final n tokens, trying n = max_n first, down to min_n (a longer match predicts better);
    [] when k <= 0 or nothing matches.

    "Earlier" means the match must start before the suffix itself and be followed by at least
    one token (the suffix trivially matches itself; skip that one). n never exceeds
    len(token_ids) - 1. The proposal may be shorter than k when the match is near the end.

    >>> propose_ngram([5, 6, 7, 8, 9, 5, 6, 7, 1, 5, 6, 7], k=3, min_n=2, max_n=3)
    [1, 5, 6]
    >>> propose_ngram([0, 2, 3, 4, 7, 7, 3, 4, 9, 2, 3, 4], k=1, min_n=2, max_n=3)
    [7]
    >>> propose_ngram([1, 2, 3, 1, 2], k=5, min_n=2, max_n=2)
    [3, 1, 2]
    >>> propose_ngram([1, 2, 3, 4], k=4), propose_ngram([1, 2, 1, 2], k=0)
    ([], [])
    """
    raise NotImplementedError(
        "propose_ngram: for n from max_n down to min_n, scan right to left for the final n tokens")


def accept(logits: torch.Tensor, proposed: Sequence[int], params: SamplingParams,
           generator: torch.Generator | None = None,
           draft_probs: torch.Tensor | None = None) -> list[int]:
    """The tokens one verification step emits: the accepted prefix of `proposed`, then one more
    (the target's correction at the first rejection, or a bonus token when all k are accepted).
    Always between 1 and k + 1 tokens.

    `logits` is [k + 1, vocab]: row i scores the token after proposed[:i] (row 0: after the last
    accepted token; row k: after every proposal). Raise ValueError when it does not have k + 1
    rows. `draft_probs` ([k, vocab]) is the proposer's distribution q for each proposed token;
    None means a deterministic proposer (prompt lookup): q is 1 on the proposed token.

    Greedy (`params.greedy`): compare with logits.argmax(dim=-1); no randomness.
    Sampled: p = target_probs(logits, params) (temperature, top-k, top-p: given). For each
    proposed x in order, draw u ~ U(0, 1) with `generator`; accept x if u < min(1, p(x) / q(x));
    at the first rejection, return the accepted tokens plus one token drawn from
    max(0, p_i - q_i) normalised (use p_i itself if that is all zero). When all are accepted,
    draw the bonus token from p_k.

    >>> logits = torch.zeros(4, 8)
    >>> logits[[0, 1, 2, 3], [3, 4, 5, 6]] = 5.0          # the target's choices: 3, 4, 5, 6
    >>> greedy = SamplingParams(temperature=0)
    >>> accept(logits, [3, 4, 5], greedy)                  # all agree: plus the bonus token
    [3, 4, 5, 6]
    >>> accept(logits, [3, 1, 5], greedy)                  # the target replaces the first miss
    [3, 4]
    >>> accept(logits, [2, 4, 5], greedy)                  # nothing accepted: still one token
    [3]
    >>> accept(logits[:1], [], greedy)                     # no proposal: an ordinary decode
    [3]
    """
    raise NotImplementedError(
        "accept: check the rows; greedy: agreeing prefix + the target's token; else rejection")

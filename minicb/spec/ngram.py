"""Prompt lookup, the proposer that needs no model.

Find the last earlier place where the request's final n tokens appeared (in its prompt or its
output) and propose the k tokens that followed them there. Code repeats itself (names,
indentation, boilerplate), so on the shipped model this pays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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

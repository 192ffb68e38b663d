"""The book's rule for reading a measured comparison, in one place.

A ratio measured on a shared machine (one system's tokens per second over another's, in runs
that alternate the two) moves from repeat to repeat. The book states a comparison as a verdict
("A is faster than B") only when the difference exceeds the spread of its repeats: at least
three of them, and the distance of their median from the reference (1.0 for a ratio) larger
than the distance between the lowest and the highest. Otherwise the text says the difference is
within this machine's noise, and shows the spread beside the number (`str(repeats)`:
"1.16 (1.07–1.41)").
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

MIN_REPEATS = 3


@dataclass(frozen=True)
class Repeats:
    """The repeats of one measured number (a ratio, unless `reference` says otherwise)."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Repeats:
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("Repeats needs at least one measured value.")
        return cls(values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """Highest minus lowest repeat."""
        return max(self.values) - min(self.values)

    def beyond_noise(self, reference: float = 1.0) -> bool:
        """True when this is a verdict: enough repeats, and the median further from `reference`
        than the repeats are from each other."""
        return len(self.values) >= MIN_REPEATS and abs(self.median - reference) > self.spread

    def verdict(self, above: str, below: str, reference: float = 1.0) -> str:
        """`above` or `below` when the difference is a verdict, else the words for noise."""
        if not self.beyond_noise(reference):
            return "within this machine's noise"
        return above if self.median > reference else below

    def __str__(self) -> str:
        return f"{self.median:.2f} ({min(self.values):.2f}–{max(self.values):.2f})"

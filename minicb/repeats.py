"""The book's rule for reading a measured comparison, in one place: direction and size apart.

A comparison is measured in paired, alternated repeats: each repeat runs A and then B (or B then
A) back to back, so a change in the machine's other work falls on both, and gives one ratio,
A's figure over B's. The repeats are read twice, for two different questions.

**The direction** (is A above B at all?) comes from an exact two-sided **sign test** over the
paired ratios: under "no difference" each repeat's ratio is as likely above 1 as below, so the
chance that k or more of n repeats fall on one side is a binomial tail. A direction is stated
when that p-value is at most ALPHA = 1/16: five repeats that all agree have p = 2 × (1/2)^5 =
1/16, so **five agreeing repeats are the fewest that give a direction**; three or four never do,
however far apart A and B look (p = 1/4 and 1/8). More repeats allow one dissent: 8 of 9
(p = 0.039), 9 of 10 (0.021). A ratio exactly at 1 counts for neither side.

**The size** (by how much?) is one statistic, named: **the median of the paired ratios**, shown
with the lowest and highest repeat: "1.15× (1.11–1.53)". The size is *beyond the spread* when the
median's distance from 1 exceeds the repeats' range (high minus low), and *within the spread*
otherwise: then the direction may be certain while the size is not.

So a sentence reads, for 5 repeats all above 1: "faster in every one of 5 alternated repeats (at
least 1.11×); the size, 1.15× (1.11–1.53), is within the spread". With 3 repeats, however clean,
it reads "no direction from 3 repeats (5 agreeing are the fewest)".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

ALPHA = 1 / 16                  # the sign test's two-sided level: 5 of 5 is the fewest to pass
MIN_REPEATS = 5                 # the fewest repeats that can give a direction at ALPHA
NO_DIRECTION = "no direction"   # the short reading when the sign test gives none


def sign_test_p(above: int, below: int) -> float:
    """Two-sided exact sign test: the chance, with no difference, of a split at least as
    lopsided as `above` against `below` (ties already left out)."""
    n = above + below
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(max(above, below), n + 1)) / 2 ** n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class Repeats:
    """The paired repeats of one measured ratio (or of a figure against `reference`)."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Repeats:
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("Repeats needs at least one measured value.")
        return cls(values)

    @property
    def median(self) -> float:
        """The size: the median of the paired ratios."""
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """Highest minus lowest repeat."""
        return max(self.values) - min(self.values)

    def sides(self, reference: float = 1.0) -> tuple[int, int]:
        """(repeats above `reference`, repeats below it); a repeat exactly at it is neither."""
        return (sum(v > reference for v in self.values), sum(v < reference for v in self.values))

    def p_value(self, reference: float = 1.0) -> float:
        """The sign test's two-sided p-value for a direction away from `reference`."""
        return sign_test_p(*self.sides(reference))

    def direction(self, reference: float = 1.0) -> int:
        """+1 (above `reference`), -1 (below) or 0 (no direction) by the sign test at ALPHA."""
        if self.p_value(reference) > ALPHA:
            return 0
        above, below = self.sides(reference)
        return 1 if above > below else -1

    def size_within_spread(self, reference: float = 1.0) -> bool:
        """True when the median is no further from `reference` than the repeats' range."""
        return abs(self.median - reference) <= self.spread

    def verdict(self, above: str, below: str, reference: float = 1.0) -> str:
        """The short reading for a table: `above`, `below` or NO_DIRECTION."""
        return {1: above, -1: below, 0: NO_DIRECTION}[self.direction(reference)]

    def describe(self, above: str, below: str, reference: float = 1.0, unit: str = "×") -> str:
        """The reading as a sentence: the direction with its count of repeats and its weakest
        repeat, then the size, the median of the ratios, and whether it is beyond the spread."""
        n, (up, down) = len(self.values), self.sides(reference)
        direction = self.direction(reference)
        if direction == 0:
            why = (f"{MIN_REPEATS} agreeing are the fewest" if n < MIN_REPEATS else
                   f"{up} above and {down} below, sign test p = {self.p_value(reference):.2g}")
            head = f"{NO_DIRECTION} from {n} alternated repeats ({why})"
        else:
            word, agreeing = (above, up) if direction > 0 else (below, down)
            weakest = min(self.values) if direction > 0 else max(self.values)
            bound = "at least" if direction > 0 else "at most"
            head = (f"{word} in every one of {n} alternated repeats ({bound} {weakest:.2f}{unit})"
                    if agreeing == n else f"{word} in {agreeing} of {n} alternated repeats "
                    f"(sign test p = {self.p_value(reference):.2g})")
        where = "within" if self.size_within_spread(reference) else "beyond"
        return (f"{head}; the size, {self.median:.2f}{unit} ({min(self.values):.2f}–"
                f"{max(self.values):.2f}), is {where} the spread")

    def __str__(self) -> str:
        return f"{self.median:.2f} ({min(self.values):.2f}–{max(self.values):.2f})"

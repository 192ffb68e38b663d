"""Chapter 08's pictures: what each verification step kept, and the tokens each step emitted.
Expected values come from the recorded steps given by hand, not from the functions under test."""

from __future__ import annotations

import pytest
from figures import rendered
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle

from minicb.viz.speculative import (
    ACCEPTED,
    DISCARDED,
    REJECTED,
    TARGET,
    accepted_lengths,
    verify_steps,
)


def cell_colours(fig) -> list[list[str]]:
    """The cells' colours, row by row (a row is one verification step)."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for patch in fig.axes[0].patches:
        if isinstance(patch, Rectangle):
            rows.setdefault(patch.get_y(), []).append((patch.get_x(),
                                                       to_hex(patch.get_facecolor())))
    return [[colour for _, colour in sorted(cells)] for _, cells in sorted(rows.items())]


def test_verify_steps_colours_accepted_target_rejected_and_discarded():
    steps = [([5, 6, 7, 8], 2, 9),        # two accepted, the target's token, then 7 rejected
             ([1, 2], 2, 3),              # all accepted: the target's bonus token last
             ([4], 0, 4)]                 # nothing accepted: the target's token first
    fig = rendered(verify_steps(steps, text={5: "a"}))
    assert cell_colours(fig) == [[ACCEPTED, ACCEPTED, TARGET, REJECTED, DISCARDED],
                                 [ACCEPTED, ACCEPTED, TARGET],
                                 [TARGET, REJECTED]]
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels[:5] == ["a", "6", "9", "7", "8"]


def test_verify_steps_shows_at_most_max_steps_and_needs_one():
    fig = rendered(verify_steps([([1], 1, 2)] * 30, max_steps=4))
    assert len(cell_colours(fig)) == 4
    with pytest.raises(ValueError, match="at least one"):
        verify_steps([])


def test_accepted_lengths_counts_tokens_per_step():
    fig = rendered(accepted_lengths({"lookup": [0, 0, 4, 1], "draft": [3, 3]}, k=4))
    counts = fig.axes[1]
    # tokens emitted = accepted + 1: lookup 1, 1, 5, 2; draft 4, 4 (bars for 1..5 tokens each)
    heights = [round(bar.get_height()) for bar in counts.patches]
    assert heights == [2, 1, 0, 0, 1] + [0, 0, 0, 2, 0]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["lookup: 2.25 tokens/step", "draft: 4.00 tokens/step"]
    with pytest.raises(ValueError, match="at least one"):
        accepted_lengths({}, k=4)

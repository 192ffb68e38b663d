"""Speculative decoding's pictures: what each verification step kept, and how much it yielded.

A step is recorded as (proposal, accepted, target): the k proposed tokens, how many of them the
target agreed with (a prefix), and the token the target emitted itself after them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from minicb.viz.base import PALETTE, new_figure

ACCEPTED, REJECTED, DISCARDED, TARGET = "#2ca02c", "#d62728", "#eeeeee", "#1f77b4"


def verify_steps(steps: Sequence[tuple[Sequence[int], int, int]],
                 text: Mapping[int, str] | None = None, max_steps: int = 16,
                 width: float = 8.0) -> Figure:
    """One row per verification step: the proposals the target accepted (green), the first it
    rejected (red), the ones after it, scored but thrown away (grey), and the target's own token
    (blue). `text` maps a token id to what is written in its cell."""
    if not steps:
        raise ValueError("verify_steps needs at least one recorded step.")
    shown = list(steps)[:max_steps]
    columns = max(len(proposal) for proposal, _, _ in shown) + 1
    fig, (ax,) = new_figure(width, 0.8 + 0.32 * len(shown))
    for row, (proposal, accepted, target) in enumerate(shown):
        cells = [(token, ACCEPTED if i < accepted else REJECTED if i == accepted else DISCARDED)
                 for i, token in enumerate(proposal)]
        cells.insert(accepted, (target, TARGET))     # the target's token follows the accepted run
        for column, (token, colour) in enumerate(cells):
            ax.add_patch(Rectangle((column, row), 0.94, 0.86, facecolor=colour,
                                   edgecolor="white"))
            label = text.get(token, str(token)) if text else str(token)
            ax.text(column + 0.47, row + 0.43, label, ha="center", va="center", fontsize=7,
                    color="black" if colour == DISCARDED else "white", clip_on=True)
    ax.set_xlim(0, columns)
    ax.set_ylim(len(shown), 0)
    ax.set_yticks(np.arange(len(shown)) + 0.43, [str(i + 1) for i in range(len(shown))])
    ax.set_xticks([])
    ax.set_ylabel("verification step")
    ax.legend(handles=[Patch(color=ACCEPTED, label="accepted"),
                       Patch(color=TARGET, label="the target's own token"),
                       Patch(color=REJECTED, label="first rejected"),
                       Patch(color=DISCARDED, label="after it: discarded")],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=4, fontsize=8, frameon=False)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    return fig


def accepted_lengths(series: Mapping[str, Sequence[int]], k: int, width: float = 9.0) -> Figure:
    """Tokens each step emitted (accepted proposals + 1), per proposer: over the
    steps (left) and how often each count came (right). One token a step is plain decoding."""
    if not series:
        raise ValueError("accepted_lengths needs at least one proposer's accepted counts.")
    fig, (over_steps, counts) = new_figure(width, 3.2, cols=2)
    bar = 0.8 / len(series)
    for index, (name, accepted) in enumerate(series.items()):
        emitted = np.asarray(accepted) + 1
        colour = PALETTE[index % len(PALETTE)]
        over_steps.step(np.arange(1, len(emitted) + 1), emitted, where="mid", color=colour,
                        label=f"{name}: {emitted.mean():.2f} tokens/step")
        histogram = np.bincount(emitted, minlength=k + 2)[1:k + 2]
        counts.bar(np.arange(1, k + 2) + (index - (len(series) - 1) / 2) * bar, histogram,
                   width=bar, color=colour, label=name)
    over_steps.axhline(1, color="grey", linestyle=":", linewidth=1)
    over_steps.set_xlabel("step after the prefill")
    over_steps.set_ylabel("tokens emitted")
    over_steps.set_yticks(range(1, k + 2))
    over_steps.legend(fontsize=8)
    counts.set_xlabel("tokens emitted in one step")
    counts.set_ylabel("steps")
    counts.set_xticks(range(1, k + 2))
    counts.legend(fontsize=8)
    return fig

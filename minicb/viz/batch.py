"""Pictures of one batch: how its tokens are laid out (padded rows or one packed run) and which
query may attend to which key (the attention mask that layout implies)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from minicb.viz.base import IDLE_HATCH, PAD_COLOUR, new_figure, request_colour


def _check_lengths(lengths: Sequence[int]) -> list[int]:
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError("lengths must be a non-empty list of positive token counts (got "
                         f"{lengths}).")
    return lengths


def batch_layout(lengths: Sequence[int], packed: bool = False, title: str | None = None,
                 width: float = 8.0) -> Figure:
    """The tokens of a batch: one left-padded row per request, or all of them packed in one run.

    Padded: rows are requests, each padded on the left up to the longest (grey, hatched).
    Packed: one run of tokens with request boundaries at `cu_seqlens` and no padding at all.
    """
    lengths = _check_lengths(lengths)
    longest, total = max(lengths), sum(lengths)
    if packed:
        fig, (ax,) = new_figure(width, 1.6)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        for i, (start, n) in enumerate(zip(bounds[:-1], lengths)):
            ax.add_patch(Rectangle((start, 0), n, 1, facecolor=request_colour(i),
                                   edgecolor="white"))
            ax.text(start + n / 2, 0.5, f"r{i}: {n}", ha="center", va="center", color="white",
                    fontsize=8)
        ax.set_xlim(0, total)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_xticks(bounds)
        ax.set_xlabel("cu_seqlens: where each request's tokens start and end")
        ax.set_title(title or f"packed: {total} slots for {total} tokens, no padding", fontsize=10)
        return fig
    fig, (ax,) = new_figure(width, 0.8 + 0.4 * len(lengths))
    for row, n in enumerate(lengths):
        pad = longest - n
        if pad:
            ax.add_patch(Rectangle((0, row - 0.4), pad, 0.8, facecolor=PAD_COLOUR,
                                   edgecolor="white", hatch=IDLE_HATCH))
        ax.add_patch(Rectangle((pad, row - 0.4), n, 0.8, facecolor=request_colour(row),
                               edgecolor="white"))
        ax.text(longest - n / 2, row, f"{n} tokens", ha="center", va="center", color="white",
                fontsize=8)
    ax.set_xlim(0, longest)
    ax.set_ylim(len(lengths) - 0.5, -0.5)
    ax.set_yticks(range(len(lengths)), [f"r{i}" for i in range(len(lengths))])
    ax.set_xlabel("token position in the padded batch")
    slots = longest * len(lengths)
    padding = slots - total
    ax.set_title(title or f"padded: {slots} slots for {total} tokens "
                          f"({padding} padding, {padding / slots:.0%})", fontsize=10)
    ax.legend(handles=[Patch(facecolor=PAD_COLOUR, hatch=IDLE_HATCH, label="padding")], fontsize=8,
              loc="lower left")
    return fig


def mask_image(lengths: Sequence[int], packed: bool = False,
               num_cached: Sequence[int] | None = None) -> tuple[np.ndarray, int, int]:
    """The attention pattern of one step as an RGB image, plus (useful scores, computed scores).

    Rows are the queries computed this step, columns the keys they may read; each request is a
    block on the diagonal, in its colour where a query may look (its own request, at or before
    its own position). Padded, every block is longest × longest and the padding's rows and
    columns are computed too (grey) but carry nothing. Packed, `num_cached` gives each request's
    tokens already in the cache: a decode is one query row reading all of them. White is never
    computed: no request attends to another's tokens.
    """
    lengths = _check_lengths(lengths)
    cached = [0] * len(lengths) if num_cached is None else [int(c) for c in num_cached]
    if len(cached) != len(lengths) or min(cached) < 0:
        raise ValueError(f"num_cached needs one count >= 0 per request (got {cached} for "
                         f"{len(lengths)}).")
    if any(cached) and not packed:
        raise ValueError("num_cached describes a packed step; a padded batch here is a prefill "
                         "from scratch.")
    size = max(lengths)
    # (tokens, pad, cached)
    blocks = [(n, 0 if packed else size - n, c) for n, c in zip(lengths, cached)]
    image = np.ones((sum(n + pad for n, pad, _ in blocks), sum(n + pad + c for n, pad, c in blocks),
                     3))
    row = col = useful = computed = 0
    for i, (n, pad, c) in enumerate(blocks):
        span = n + pad
        block = image[row:row + span, col:col + c + span]
        block[:] = to_rgb(PAD_COLOUR)
        # query j (of this step's n) sits at position c + j and sees keys 0 .. c + j
        allowed = np.arange(c + n)[None, :] <= (c + np.arange(n))[:, None]
        block[pad:, pad:][allowed] = to_rgb(request_colour(i))
        block[pad:, pad:][~allowed] = 1.0
        useful += int(allowed.sum())
        computed += span * span if not packed else int(allowed.sum())
        row, col = row + span, col + c + span
    return image, useful, computed


def attention_mask(lengths: Sequence[int], packed: bool = False,
                   num_cached: Sequence[int] | None = None, title: str | None = None,
                   width: float = 4.0) -> Figure:
    """The attention mask of one step (see `mask_image`): who may look at whom."""
    image, useful, computed = mask_image(lengths, packed, num_cached)
    rows, cols = image.shape[:2]
    fig, (ax,) = new_figure(width, max(width * rows / cols, 1.5) + 0.6)
    ax.imshow(image, interpolation="nearest", aspect="equal")
    ax.set_xlabel("key (a token in the cache)")
    ax.set_ylabel("query (computed now)")
    ax.set_xticks([])
    ax.set_yticks([])
    kind = "packed" if packed else "padded"
    ax.set_title(title or f"{kind}: {useful} useful scores of {computed} computed", fontsize=10)
    return fig

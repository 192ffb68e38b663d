"""Shared check for the figure tests."""

from __future__ import annotations

import io

from matplotlib.figure import Figure


def rendered(fig: Figure) -> Figure:
    """Draw the figure to PNG bytes: errors in text, patches or limits surface only here."""
    assert isinstance(fig, Figure)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    assert buffer.tell() > 1000
    return fig

"""What every picture of the book shares: one way to make a figure, one colour per request,
and a plain-text table for results that should read the same on every machine.

Figures are built with matplotlib's object API (`Figure`, not `pyplot`), so a picture never leaks
into global state: tests can draw hundreds, a widget can redraw on every slider move, and a
notebook shows a figure only when a cell returns it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

# A modest resolution keeps the executed notebooks small (every figure is stored as a PNG).
DPI = 80
# tab10 without its grey, so grey can mean "padding" and white can mean "empty".
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2")
PAD_COLOUR = "#bbbbbb"
IDLE_HATCH = "////"


def new_figure(width: float = 8.0, height: float = 3.0, rows: int = 1, cols: int = 1,
               **subplot_kw) -> tuple[Figure, list[Axes]]:
    """A figure and its axes as a flat list (one entry per subplot)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, **subplot_kw)
    return fig, [ax for row in axes for ax in row]


def request_colour(request_id: Hashable, order: Sequence | None = None) -> str:
    """A stable colour for a request: by its position in `order`, else by its id when numeric."""
    if order is not None:
        index = list(order).index(request_id)
    else:
        index = int(request_id) if str(request_id).isdigit() else sum(map(ord, str(request_id)))
    return PALETTE[index % len(PALETTE)]


def darker(colour: str, amount: float = 0.35) -> tuple[float, float, float]:
    """The colour mixed towards black: the same request, doing different work (prefill)."""
    return tuple(c * (1 - amount) for c in to_rgb(colour))


def format_table(rows: Sequence[Mapping], columns: Sequence[str] | None = None,
                 digits: int = 2) -> str:
    """Rows of dicts as an aligned text table; floats rounded to `digits` decimals."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.{digits}f}"
        return "-" if value is None else str(value)

    body = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in body]
    return "\n".join(lines)

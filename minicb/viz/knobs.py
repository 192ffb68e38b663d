"""The scheduler's knobs as numbers and pictures: a sweep over max_num_seqs and
max_num_batched_tokens on the cost-model runner, and the callback an interactive widget calls
each time a slider moves (a plain function, so tests call it too)."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from minicb.sim import CostModel, SimResult, simulate
from minicb.sim.workload import Workload
from minicb.viz.base import new_figure
from minicb.viz.schedule import draw_slots, slot_legend, slots_height


def knob_row(result: SimResult) -> dict:
    """The numbers a reader compares between settings, in cost-model time units."""
    summary = result.summary(virtual=False)
    config = result.config
    return {"max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens, "steps": result.num_steps,
            "tokens_per_unit": summary.output_throughput, "ttft_p50": summary.ttft["p50"],
            "ttft_p95": summary.ttft["p95"], "tpot_p50": summary.tpot["p50"],
            "itl_p99": summary.itl["p99"], "busy_slots": result.slot_utilisation()}


def knob_sweep(workload: Workload, max_num_seqs: Sequence[int],
               max_num_batched_tokens: Sequence[int], cost: CostModel | None = None,
               **knobs) -> list[dict]:
    """Every combination of the two knobs (skipping token budgets below the slot count, which
    EngineConfig rejects), served by the continuous scheduler in virtual time."""
    rows = []
    for tokens in max_num_batched_tokens:
        for seqs in max_num_seqs:
            if tokens < seqs:
                continue
            result = simulate(workload, cost=cost, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                              **knobs)
            rows.append(knob_row(result))
    return rows


def knob_view(workload: Workload, max_num_seqs: int = 4, max_num_batched_tokens: int = 256,
              cost: CostModel | None = None, scheduler: str = "continuous",
              width: float = 8.0) -> Figure:
    """The widget's callback: re-run the schedule with these knobs and draw its slot timeline,
    its numbers in the title. A token budget below the slot count is raised to it (the slider
    may pass through such pairs; EngineConfig would reject them)."""
    max_num_batched_tokens = max(max_num_batched_tokens, max_num_seqs)
    result = simulate(workload, cost=cost, scheduler=scheduler, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens)
    row = knob_row(result)
    fig, (ax,) = new_figure(width, 1.5 + slots_height(max_num_seqs))
    draw_slots(ax, result, max_num_seqs,
               title=f"max_num_seqs={max_num_seqs}, "
                     f"max_num_batched_tokens={max_num_batched_tokens}: "
                     f"{row['tokens_per_unit']:.2f} tokens/unit, TTFT p95 {row['ttft_p95']:.1f}, "
                     f"TPOT p50 {row['tpot_p50']:.2f} units")
    slot_legend(fig)
    return fig


def knob_widget(workload: Workload, cost: CostModel | None = None, max_num_seqs: int = 8,
                max_num_batched_tokens: int = 256, scheduler: str = "continuous"):
    """Two sliders and the schedule they give: every move re-runs `knob_view` and redraws.

    The picture goes into an Output widget that the sliders' observer fills, so it shows in
    JupyterLab and in the classic notebook alike (a Figure returned by an `interactive`
    callback is not displayed)."""
    import ipywidgets as widgets
    from IPython.display import display

    style = {"description_width": "initial"}
    seqs = widgets.IntSlider(value=max_num_seqs, min=1, max=32, description="max_num_seqs",
                             style=style,
                             tooltip="requests that may run at once (the batch's slots)",
                             layout=widgets.Layout(width="360px"))
    tokens = widgets.IntSlider(
        value=max_num_batched_tokens, min=16, max=1024, step=16,
        description="max_num_batched_tokens", style=style,
        tooltip="tokens one step may carry: prompt chunks plus one per decode",
        layout=widgets.Layout(width="460px"))
    picture = widgets.Output()

    def redraw(_change=None) -> None:
        figure = knob_view(workload, seqs.value, tokens.value, cost=cost, scheduler=scheduler)
        picture.clear_output(wait=True)
        with picture:
            display(figure)

    seqs.observe(redraw, names="value")
    tokens.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([seqs, tokens]), picture])

"""The book's pictures, as plain functions that return matplotlib Figures.

    from minicb import viz
    from minicb.sim import simulate
    from minicb.sim.workload import seed_example
    viz.slot_timeline(simulate(seed_example(), scheduler="static", max_num_seqs=4))

Schedules (from `minicb.sim.SimResult`): slot_timeline, compare_timelines, kv_usage_timeline.
One batch: batch_layout (padded rows or packed), attention_mask.
Measurements: request_timelines, tradeoff_curve, line_plot, bar_chart, roofline, length_histogram.
Knobs: knob_sweep (numbers), knob_view (the picture for one setting), knob_widget (sliders).
Memory: block_map, block_reuse, free_blocks_timeline. Kernels: paged_lookup. Steps: step_costs.
Speculative decoding: verify_steps (what each step kept), accepted_lengths (tokens per step).
A router's choices over a trace: routing_strips. The host's and the device's lanes over time
(bench timeline): lane_chart, busy_fraction.
Several GPUs (minicb.sim.cluster, bench disagg): cluster_timeline, slo_attainment_curves,
goodput_bars, slo_scale_plot, tp_parts, tp_tpot.
The interview quiz: quiz_widget, interview_markdown. The engine's own code: show_source
(show_file for the C kernels).
A figure is shown in a notebook when a cell returns it; nothing is drawn through pyplot.
"""

from minicb.viz.base import PALETTE, format_table, new_figure, request_colour
from minicb.viz.batch import attention_mask, batch_layout, mask_image
from minicb.viz.cluster import (
           cluster_timeline,
           goodput_bars,
           slo_attainment_curves,
           slo_scale_plot,
           tp_parts,
           tp_tpot,
)
from minicb.viz.curves import (
           bar_chart,
           length_histogram,
           length_spread,
           line_plot,
           request_timelines,
           roofline,
           tradeoff_curve,
)
from minicb.viz.kernel_plans import (
           decode_grid_picture,
           decode_programs,
           split_kv_picture,
           split_ranges,
)
from minicb.viz.kernels import paged_lookup, recorded_kernel_results
from minicb.viz.knobs import knob_row, knob_sweep, knob_view, knob_widget
from minicb.viz.lanes import busy_fraction, lane_chart
from minicb.viz.memory import block_map, block_owners, block_reuse, free_blocks_timeline
from minicb.viz.quiz import (
           book_interview,
           interview_markdown,
           quiz_card,
           quiz_widget,
           worked_question,
)
from minicb.viz.schedule import (
           compare_timelines,
           draw_slots,
           kv_usage,
           kv_usage_timeline,
           slot_grid,
           slot_timeline,
)
from minicb.viz.serving import (
           load_study_plot,
           peer_load_plot,
           rate_label,
           routing_strips,
           step_costs,
)
from minicb.viz.source import show_file, show_source
from minicb.viz.speculative import accepted_lengths, verify_steps

__all__ = ["busy_fraction", "lane_chart", "PALETTE", "format_table", "new_figure",
           "request_colour", "attention_mask",
           "batch_layout", "mask_image", "bar_chart", "length_histogram", "line_plot",
           "request_timelines", "roofline", "tradeoff_curve", "paged_lookup",
           "recorded_kernel_results", "knob_row", "knob_sweep", "knob_view", "knob_widget",
           "block_map", "block_owners", "block_reuse", "free_blocks_timeline", "book_interview",
           "interview_markdown", "quiz_card", "quiz_widget", "worked_question", "compare_timelines",
           "draw_slots",
           "kv_usage", "kv_usage_timeline", "slot_grid", "slot_timeline", "step_costs",
           "routing_strips",
           "show_source", "show_file", "load_study_plot", "peer_load_plot", "rate_label",
           "decode_grid_picture",
           "decode_programs", "split_kv_picture", "split_ranges", "length_spread",
           "cluster_timeline", "goodput_bars", "slo_attainment_curves", "slo_scale_plot",
           "tp_parts", "tp_tpot", "accepted_lengths", "verify_steps"]

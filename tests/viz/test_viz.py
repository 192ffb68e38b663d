"""The book's pictures: the slot grid and KV accounting they are drawn from, the widget callback,
and that every figure renders. Expected values come from the worked examples (static 14 steps,
continuous 10) and from arithmetic on the workload, not from the functions under test."""

from __future__ import annotations

import numpy as np
import pytest
from figures import rendered
from matplotlib.colors import to_rgb

from minicb import viz
from minicb.sim import simulate
from minicb.sim.workload import chat, fixed, seed_example
from minicb.viz.base import PAD_COLOUR


def requests_per_slot(grid) -> list[list[str]]:
    """For each slot, the requests it held in order of appearance."""
    out = []
    for row in grid:
        seen: list[str] = []
        for cell in row:
            if cell is not None and (not seen or seen[-1] != cell[0]):
                seen.append(cell[0])
        out.append(seen)
    return out


# --- the slot grid ---------------------------------------------------------------------------
def test_continuous_newcomers_take_the_finished_requests_slots():
    result = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    grid = viz.slot_grid(result.steps, 4)
    # A (0) and B (1) finish at step 4; E (4) and F (5) take their slots from step 5 on
    assert requests_per_slot(grid) == [["0", "4"], ["1", "5"], ["2"], ["3"]]
    assert grid[0][4] == ("4", "prefill") and grid[0][5] == ("4", "decode")
    assert all(cell is None for cell in grid[0][8:])            # E finished at step 8
    assert [cell[0] for cell in grid[2]] == ["2"] * 10           # C decodes all ten steps


def test_static_batch_keeps_finished_rows_idle_until_the_longest_ends():
    result = simulate(seed_example(), scheduler="static", max_num_seqs=4)
    grid = viz.slot_grid(result.steps, 4)
    assert len(grid[0]) == 14
    # A ran steps 1-4, then idled in its row through step 10; E got the slot at step 11
    assert [cell[1] for cell in grid[0][4:10]] == ["idle"] * 6
    assert grid[0][10] == ("4", "prefill")
    # slots 2 and 3 sit empty at the end
    assert all(cell is None for cell in grid[2][10:])


def test_every_row_of_every_step_lands_in_exactly_one_slot():
    workload = chat(40, seed=3)
    result = simulate(workload, scheduler="continuous", max_num_seqs=6, max_num_batched_tokens=64)
    grid = viz.slot_grid(result.steps, 6)
    for column, step in enumerate(result.steps):
        drawn = sorted(grid[s][column][0] for s in range(6) if grid[s][column] is not None)
        assert drawn == sorted(r for r, _, _ in step.rows)
    # each request decodes output_len - 1 times after the step that makes its first token
    decodes = {}
    for row in grid:
        for cell in row:
            if cell is not None and cell[1] == "decode":
                decodes[cell[0]] = decodes.get(cell[0], 0) + 1
    assert decodes == {str(i): n - 1 for i, n in enumerate(workload.output_lens) if n > 1}


def test_slot_grid_refuses_too_few_slots():
    result = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    with pytest.raises(ValueError, match="num_slots"):
        viz.slot_grid(result.steps, 3)


def test_timelines_draw_one_hatched_run_per_idle_stretch():
    static = simulate(seed_example(), scheduler="static", max_num_seqs=4)
    continuous = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    fig = rendered(viz.slot_timeline(static))
    hatched = [p for p in fig.axes[0].patches if p.get_hatch()]
    assert len(hatched) == 2                                      # A's and B's idle rows
    assert fig.axes[0].get_xlim() == (0.5, 14.5)
    fig = rendered(viz.compare_timelines({"static": static, "continuous": continuous},
                                         names=dict(zip("012345", "ABCDEF"))))
    assert [ax.get_xlim() for ax in fig.axes] == [(0.5, 14.5)] * 2
    assert not [p for p in fig.axes[1].patches if p.get_hatch()]
    assert "10 steps" in fig.axes[1].get_title()


# --- KV accounting ---------------------------------------------------------------------------
def test_kv_usage_counts_prompt_then_one_token_per_decode():
    result = simulate(seed_example(), scheduler="continuous", max_num_seqs=4, block_size=4,
                      record_blocks=True)
    usage = viz.kv_usage(result)
    assert usage[0] == (4 * 4, 4 * 4)          # four 4-token prompts, one 4-slot block each
    assert usage[1] == (4 * 5, 4 * 8)          # each wrote one more token and needed a 2nd block
    assert usage[4][0] == 2 * 8 + 2 * 4        # C, D at 8 tokens; E, F just prefilled 4 each


def test_paged_wastes_under_a_block_per_request_contiguous_reserves_max_model_len():
    workload = chat(24, seed=1)
    paged = simulate(workload, scheduler="continuous", max_num_seqs=8, block_size=16,
                     record_blocks=True)
    for step, (used, reserved) in zip(paged.steps, viz.kv_usage(paged)):
        assert 0 <= reserved - used < 16 * len(step.rows)
    contiguous = simulate(workload, scheduler="continuous", kv_cache="contiguous", max_num_seqs=8,
                          max_model_len=512, block_size=16, record_blocks=True)
    for step, (used, reserved) in zip(contiguous.steps, viz.kv_usage(contiguous)):
        assert reserved == 512 * len(step.rows) and used <= reserved
    fig = rendered(viz.kv_usage_timeline(contiguous))
    assert fig.axes[0].get_title().startswith("contiguous KV")


def test_kv_usage_needs_recorded_block_tables():
    result = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    with pytest.raises(ValueError, match="record_blocks=True"):
        viz.kv_usage(result)


# --- one batch -----------------------------------------------------------------------------------
def test_mask_counts_padding_as_computed_and_never_crosses_requests():
    lengths = [5, 9, 3]
    useful = sum(n * (n + 1) // 2 for n in lengths)
    image, got_useful, computed = viz.mask_image(lengths)
    assert (got_useful, computed) == (useful, 3 * 9 * 9)
    assert image.shape == (27, 27, 3)
    assert np.allclose(image[0, 0], to_rgb(PAD_COLOUR))         # row 0 starts with 4 pads
    assert np.allclose(image[0:9, 9:27], 1.0)                    # no attention between requests
    image, got_useful, computed = viz.mask_image(lengths, packed=True)
    assert (got_useful, computed) == (useful, useful)
    assert image.shape == (17, 17, 3)
    assert np.allclose(image[4, 5], 1.0) and not np.allclose(image[5, 5], 1.0)   # a boundary
    with pytest.raises(ValueError, match="positive token counts"):
        viz.mask_image([])


def test_mask_of_a_mixed_step_lets_a_decode_read_its_whole_cache():
    # a decode with 4 tokens cached, then a 6-token prefill: 1 + 6 query rows, 5 + 6 key columns
    image, useful, computed = viz.mask_image([1, 6], packed=True, num_cached=[4, 0])
    assert image.shape == (7, 11, 3)
    assert (useful, computed) == (5 + 21, 5 + 21)
    assert not np.allclose(image[0, :5], 1.0) and np.allclose(image[0, 5:], 1.0)
    assert np.allclose(image[1, 5], to_rgb(viz.request_colour(1))) and np.allclose(image[1, 6], 1.0)
    with pytest.raises(ValueError, match="packed step"):
        viz.mask_image([1, 6], num_cached=[4, 0])
    with pytest.raises(ValueError, match="one count"):
        viz.mask_image([1, 6], packed=True, num_cached=[4])


def test_batch_pictures_render_with_their_padding_in_the_title():
    fig = rendered(viz.batch_layout([5, 9, 3, 7]))
    assert "36 slots for 24 tokens (12 padding" in fig.axes[0].get_title()
    fig = rendered(viz.batch_layout([5, 9, 3, 7], packed=True))
    assert [int(t) for t in fig.axes[0].get_xticks()] == [0, 5, 14, 17, 24]
    rendered(viz.attention_mask([2, 4], packed=True))


# --- measurements ------------------------------------------------------------------------------
def test_request_timelines_and_curves_render():
    result = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    fig = rendered(viz.request_timelines(result.metrics, names=list("ABCDEF"), annotate=4))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list("ABCDEF")
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "TTFT 5 steps" in texts and "E2E 8 steps" in texts and "ITL 1 step" in texts
    with pytest.raises(ValueError):
        viz.request_timelines([])
    points = [{"x": 1, "y": 2, "n": 1, "g": 0}, {"x": 2, "y": 1, "n": 2, "g": 0}]
    rendered(viz.tradeoff_curve(points, "x", "y", label="n", group="g", logy=True))
    rendered(viz.line_plot([1, 2, 4], {"a": [1, 2, 3], "b": [3, 2, 1]}, "x", "y", logx=True))
    rendered(viz.bar_chart(["a", "b"], [1.0, 2.0], "y"))
    fig = rendered(viz.length_histogram([1, 2, 3, 4, 100]))
    assert "p50 = 3" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_roofline_caps_at_peak_and_bends_at_the_ridge():
    fig = rendered(viz.roofline(100e12, 1e12, {"low": 1.0, "high": 1000.0}))
    x, y = fig.axes[0].lines[0].get_data()
    assert max(y) == pytest.approx(100.0)                         # TFLOP/s
    assert y[x < 100].max() < 100.0 and np.allclose(y[x > 100], 100.0)
    with pytest.raises(ValueError, match="positive"):
        viz.roofline(0, 1e12, {})


# --- knobs and the widget's callback -----------------------------------------------------------
def test_knob_view_redraws_the_schedule_the_sliders_ask_for():
    four = rendered(viz.knob_view(seed_example(), max_num_seqs=4, max_num_batched_tokens=64))
    assert four.axes[0].get_xlim()[1] == 10.5                    # the worked example: 10 steps
    one = rendered(viz.knob_view(seed_example(), max_num_seqs=1, max_num_batched_tokens=64))
    assert one.axes[0].get_xlim()[1] == 4 + 4 + 10 + 10 + 4 + 4 + 0.5   # one request at a time
    # a token budget below the slot count (the sliders can pass through one) is raised, not refused
    raised = viz.knob_view(seed_example(), max_num_seqs=4, max_num_batched_tokens=2)
    assert "max_num_batched_tokens=4" in raised.axes[0].get_title()


def test_knob_sweep_skips_invalid_pairs_and_more_slots_finish_sooner():
    rows = viz.knob_sweep(seed_example(), [1, 4, 8], [4, 64])
    assert [(r["max_num_seqs"], r["max_num_batched_tokens"]) for r in rows] == \
        [(1, 4), (4, 4), (1, 64), (4, 64), (8, 64)]
    steps = {(r["max_num_seqs"], r["max_num_batched_tokens"]): r["steps"] for r in rows}
    assert steps[(1, 64)] == 36 and steps[(4, 64)] == 10
    # 4-token budget chunks the prefills
    assert steps[(4, 4)] > steps[(4, 64)]
    table = viz.format_table(rows, ["max_num_seqs", "steps", "busy_slots"])
    assert table.splitlines()[0].split() == ["max_num_seqs", "steps", "busy_slots"]
    assert len(table.splitlines()) == len(rows) + 1


def test_format_table_rounds_and_aligns():
    table = viz.format_table([{"a": 1.23456, "b": None}, {"a": 10.0, "b": "x"}], digits=1)
    assert table.splitlines() == ["   a  b", " 1.2  -", "10.0  x"]
    assert viz.format_table([]) == "(no rows)"


def test_request_colour_is_stable_and_distinct_for_neighbours():
    assert viz.request_colour("3") == viz.request_colour(3)
    assert len({viz.request_colour(i) for i in range(10)}) == 10
    assert viz.request_colour("b", order=["a", "b"]) == viz.PALETTE[1]


def test_three_answers_static_barrier_is_visible_in_the_grid():
    workload = fixed("three", [8, 8, 8], [6, 50, 300])
    grid = viz.slot_grid(simulate(workload, scheduler="static", max_num_seqs=3).steps, 3)
    idle = [sum(1 for cell in row if cell and cell[1] == "idle") for row in grid]
    assert idle == [300 - 6, 300 - 50, 0]


def test_show_source_is_the_installed_code_with_its_real_path_and_line_numbers():
    from pathlib import Path

    from minicb.scheduler.continuous import ContinuousScheduler

    shown = viz.show_source(ContinuousScheduler.schedule)
    assert shown.path == "minicb/scheduler/continuous.py"
    source = Path(__file__).resolve().parents[2] / shown.path
    file_lines = source.read_text().splitlines(keepends=True)
    assert file_lines[shown.first_line - 1:shown.last_line] == shown.lines
    assert shown.lines[0].lstrip().startswith("def schedule(")
    assert f"{shown.first_line}  " in shown._repr_markdown_()
    part = viz.show_source(ContinuousScheduler.schedule, start="step_count", stop="return")
    assert (part.first_line > shown.first_line and "step_count" in part.lines[0] and "return"
            in part.lines[-1])
    with pytest.raises(ValueError, match="not in the source"):
        viz.show_source(ContinuousScheduler.schedule, start="no such line")


def test_show_source_names_kernels_by_their_place_in_the_repository():
    from minicb.kernels import paged_attention

    assert viz.show_source(paged_attention).path == "kernels/paged_attention.py"


def test_show_file_shows_a_c_function_from_its_first_line_to_its_closing_brace():
    from pathlib import Path

    from minicb.kernels import cpu

    path = Path(cpu.__file__).with_name("cpu_decode_layer.c")
    shown = viz.show_file(path, "int minicb_decode_layer(", "}")
    assert shown.path == "kernels/cpu_decode_layer.c"
    file_lines = path.read_text().splitlines(keepends=True)
    assert file_lines[shown.first_line - 1:shown.last_line] == shown.lines
    assert shown.lines[0].startswith("int minicb_decode_layer(")
    assert shown.lines[-1] == "}\n"               # the function's own brace, not an inner one
    assert "return failed" in shown.lines[-2]
    assert shown._repr_markdown_().split("\n")[2] == "```c"
    with pytest.raises(ValueError, match="not in the source"):
        viz.show_file(path, "no such line")

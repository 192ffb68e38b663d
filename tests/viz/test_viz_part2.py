"""Pictures and functions of chapters 04-07 and the interview notebook: the block map and its
hand-overs, free blocks under preemption, the paged lookup, recorded kernel results, serving at
rising rates, step lengths, and the interview questions gathered from the chapter sources.
Expected values come from the allocator's rules, the workloads and hand arithmetic, not from
the functions under test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import nbformat
import pytest
from figures import rendered

from minicb.sim import CostModel, serve_at_rates, simulate
from minicb.sim.workload import Workload, WorkloadRequest, chat, fixed, seed_example
from minicb.viz.kernels import paged_lookup, recorded_kernel_results
from minicb.viz.memory import block_map, block_owners, block_reuse, free_blocks_timeline
from minicb.viz.quiz import (
    InterviewQuestion,
    book_interview,
    interview_markdown,
    parse_interview,
    quiz_card,
    quiz_widget,
)
from minicb.viz.serving import step_costs

ROOT = Path(__file__).resolve().parents[2]




def worked_example_blocks():
    """The worked example with 2-token blocks: A and B (0, 1) finish at step 4, E and F (4, 5)
    enter at 5."""
    return simulate(seed_example(), max_num_seqs=4, block_size=2, num_kv_blocks=24,
                    record_blocks=True)


# --- the block map ------------------------------------------------------------------------------
def test_a_finished_requests_blocks_go_to_the_next_request_at_the_next_step():
    result = worked_example_blocks()
    step4, step5 = result.steps[3], result.steps[4]
    assert step4.step == 4 and set(step4.block_tables) == {"0", "1", "2", "3"}
    # the free list is a stack: B (freed after A) is on top, so E's 4-token prompt (2 blocks) gets
    # B's first two blocks and F the next two, in B's own order
    assert step5.block_tables["4"] == step4.block_tables["1"][:2]
    assert step5.block_tables["5"] == step4.block_tables["1"][2:4]
    first_handovers = [event for event in block_reuse(result) if event[0] == 5]
    assert sorted(block for _, block, _, _ in first_handovers) == sorted(step4.block_tables["1"])
    assert {(previous, new) for _, _, previous, new in first_handovers} == {("1", "4"), ("1", "5")}


def test_block_owners_matches_the_recorded_tables_and_reuse_needs_a_new_holder():
    result = worked_example_blocks()
    owners = block_owners(result)
    for step, held in zip(result.steps, owners):
        assert sum(len(h) for h in held.values()) == sum(len(t) for t in step.block_tables.values())
    # every hand-over names a holder that held the block before and a different one now
    for step_number, block, previous, new in block_reuse(result):
        assert previous != new
        assert block in result.steps[step_number - 1].block_tables[new]
    # a single request never hands a block to anyone
    alone = simulate(fixed("one", [4], [10]), block_size=2, num_kv_blocks=8, record_blocks=True)
    assert block_reuse(alone) == []


def test_block_pictures_need_recorded_tables():
    with pytest.raises(ValueError, match="record_blocks=True"):
        block_map(simulate(seed_example(), max_num_seqs=4))


def test_block_map_renders_private_and_shared_blocks():
    rendered(block_map(worked_example_blocks(), names=dict(zip("012345", "ABCDEF"))))
    # the simulator's prompts are all the same token, so with prefix caching later requests share
    # the first one's full blocks
    shared = simulate(fixed("same prompt", [8, 8], [6, 6]).with_arrivals([0, 2]), block_size=4,
                      num_kv_blocks=16, enable_prefix_caching=True, record_blocks=True)
    assert any(len(holders) > 1 for held in block_owners(shared) for holders in held.values())
    rendered(block_map(shared))


def test_free_blocks_timeline_marks_every_preempting_step():
    tight = simulate(chat(24, seed=0), max_num_seqs=16, block_size=16, max_model_len=512,
                     num_kv_blocks=40)
    roomy = simulate(chat(24, seed=0), max_num_seqs=16, block_size=16, max_model_len=512,
                     num_kv_blocks=512)
    preempting = [s for s in tight.steps if s.preempted]
    assert preempting and not any(s.preempted for s in roomy.steps)
    fig = rendered(free_blocks_timeline({"tight": tight, "roomy": roomy}))
    marks = [line for line in fig.axes[0].lines if line.get_marker() == "x"]
    assert len(marks) == 1 and len(marks[0].get_xdata()) == len(preempting)


# --- kernels ------------------------------------------------------------------------------------
def test_paged_lookup_names_block_offset_and_slot():
    fig = rendered(paged_lookup([3, 0, 7], block_size=4, seq_len=10, num_blocks=8, position=9))
    # position 9: logical block 9 // 4 = 2 -> physical 7; offset 9 % 4 = 1; slot 7 * 4 + 1 = 29
    assert "block 7, offset 9 % 4 = 1, slot 29" in fig.axes[0].get_title()


@pytest.mark.parametrize("table, seq_len, position, message", [
    ([3, 0], 10, None, "need 3 blocks"),
    ([3, 0, 9], 10, None, "outside the pool"),
    ([3, 0, 7], 10, 10, "not one of the request's 10 keys"),
])
def test_paged_lookup_rejects_inconsistent_arguments(table, seq_len, position, message):
    with pytest.raises(ValueError, match=message):
        paged_lookup(table, block_size=4, seq_len=seq_len, num_blocks=8, position=position)


def test_recorded_kernel_results_keeps_gpu_runs_only(tmp_path):
    assert recorded_kernel_results(tmp_path) == []
    (tmp_path / "kernels-nvidia-h100.json").write_text(json.dumps({
        "device": "NVIDIA H100", "dry_run": False}))
    dry_run = tmp_path / "kernels-cpu-triton-interpreter-dry-run.json"
    dry_run.write_text(json.dumps({"dry_run": True}))
    (tmp_path / "memory-chat.json").write_text("{}")
    runs = recorded_kernel_results(tmp_path)
    assert [r["device"] for r in runs] == ["NVIDIA H100"]
    assert runs[0]["plot_path"] == str(tmp_path / "kernels-nvidia-h100.png")


# --- serving ------------------------------------------------------------------------------------
def test_serve_at_rates_goodput_follows_the_slos():
    traffic = chat(40, seed=0)
    cost = CostModel(step_overhead=1.0, decode_seq=0.05, prefill_token=1 / 64)
    offline, = serve_at_rates(traffic, [math.inf], cost=cost, max_num_seqs=8)
    assert offline["time_units"] == simulate(traffic, cost=cost, max_num_seqs=8).total_time
    assert offline["goodput"] is None and offline["slo_share"] is None
    loose, = serve_at_rates(traffic, [0.05], cost=cost, slo_ttft=1e9, slo_tpot=1e9, max_num_seqs=8)
    assert loose["slo_share"] == 1.0
    assert loose["goodput"] == pytest.approx(loose["requests_per_unit"])
    # no first token can come sooner than one step (1 unit) after arrival
    strict, = serve_at_rates(traffic, [0.05], cost=cost, slo_ttft=0.5, max_num_seqs=8)
    assert strict["goodput"] == 0.0
    rows = serve_at_rates(traffic, [0.02, 0.5], cost=cost, slo_ttft=20.0, max_num_seqs=8)
    assert [r["rate"] for r in rows] == [0.02, 0.5]
    assert rows[1]["ttft_p95"] > rows[0]["ttft_p95"]          # more load, longer queue


def test_step_costs_shows_the_long_prefill_step():
    requests = [WorkloadRequest(8, 20) for _ in range(4)] + [WorkloadRequest(640, 4, arrival=5.0)]
    traffic = Workload("decoders and one long prompt", requests)
    whole = simulate(traffic, max_num_batched_tokens=1024)
    chunked = simulate(traffic, max_num_batched_tokens=1024, max_prefill_tokens_per_step=64)
    fig = rendered(step_costs({"whole": whole, "chunked": chunked}))
    # default cost model: 1 unit per step + 1/64 per prefill token: the 640-token prefill alone is
    # 10 units
    heights = [max(bar.get_height() for bar in ax.patches) for ax in fig.axes[:2]]
    assert heights[0] >= 1 + 640 / 64 and heights[1] <= 1 + 64 / 64 + 4 / 64 + 1e-9


# --- interview questions ------------------------------------------------------------------------
SECTION = """
## Pause and recall

1. Not a question of the interview section.

## Interview questions

**What is a block table?**
A list of physical blocks,
one per logical block.
*A common wrong answer:* "a table of
the model's layers."

**Why page?**
To stop fragmentation.
*A common wrong answer:* "speed."

## Exercise

**Not an interview question**
"""


def test_parse_interview_reads_question_answer_and_wrong_answer():
    questions = parse_interview(SECTION, "04 · Paging")
    assert questions == [
        InterviewQuestion("04 · Paging", "What is a block table?",
                          "A list of physical blocks, one per logical block.",
                          '"a table of the model\'s layers."'),
        InterviewQuestion("04 · Paging", "Why page?", "To stop fragmentation.", '"speed."'),
    ]
    assert parse_interview("# A chapter\n\nno questions here", "x") == []
    with pytest.raises(ValueError, match="no '\\*A common wrong answer:\\*' line"):
        parse_interview("## Interview questions\n\n**Why?**\nBecause.\n", "x")


def test_every_chapter_contributes_questions_with_wrong_answers():
    questions = book_interview(ROOT / "notebooks")
    chapters = list(dict.fromkeys(q.chapter for q in questions))
    present = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    numbered = [c for c in chapters if c[:2].isdigit()]
    assert [c[:2] for c in numbered] == present and present[:9] == [f"{n:02d}" for n in range(9)]
    # the appendices come after the chapters, each with its own questions
    assert all(c.startswith("Appendix") for c in chapters[len(numbered):])
    for chapter in chapters:
        assert sum(q.chapter == chapter for q in questions) >= 3, chapter
    for q in questions:
        assert q.question.endswith("?") and q.answer and q.wrong_answer.strip('"')
    with pytest.raises(FileNotFoundError):
        book_interview(ROOT / "docs")


def test_quiz_card_hides_the_answer_until_asked():
    question = InterviewQuestion("04 · Paging", "Why page?", "To stop fragmentation.", '"speed."')
    hidden = quiz_card(question, 3, 10, reveal=False)
    assert "Why page?" in hidden and "Question 3 of 10" in hidden
    assert "fragmentation" not in hidden and "speed" not in hidden
    shown = quiz_card(question, 3, 10, reveal=True)
    assert "To stop fragmentation." in shown and '"speed."' in shown
    folded = interview_markdown([question])
    assert folded.index("<details>") < folded.index("To stop fragmentation.") \
        < folded.index("</details>")


def test_quiz_widget_reveals_then_moves_on_hidden():
    questions = [InterviewQuestion("c", f"Question number {i}?", f"reply {i}", f"wrong {i}")
                 for i in range(3)]
    widget = quiz_widget(questions, seed=1)
    card, (show, following) = widget.children[0], widget.children[1].children

    def text() -> str:
        return card.outputs[-1]["data"]["text/markdown"]

    asked = [next(i for i in range(3) if f"number {i}?" in text())]
    assert "reply" not in text() and "wrong" not in text()
    show.click()
    assert f"reply {asked[0]}" in text() and f"wrong {asked[0]}" in text()
    for _ in range(2):
        following.click()
        asked.append(next(i for i in range(3) if f"number {i}?" in text()))
        assert "reply" not in text() and "wrong" not in text()
    assert sorted(asked) == [0, 1, 2]            # every question once per round


def test_the_interview_notebook_holds_every_chapter_question():
    notebook = nbformat.read(ROOT / "notebooks" / "interview.ipynb", as_version=4)
    markdown = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    missing = [q.question for q in book_interview(ROOT / "notebooks") if q.question
               not in markdown]
    assert not missing, f"refresh it: scripts/execute_notebooks.py interview ({missing})"


def test_a_worked_answer_becomes_a_quiz_question():
    from minicb.viz.quiz import worked_question

    rendered = ("**Answer (an estimate).** Capacity is memory left\nover KV per token. "
                "*A common wrong answer:* \"one request\".")
    q = worked_question("How many requests fit?", rendered)
    assert q == InterviewQuestion("Interview classics", "How many requests fit?",
                                  "Capacity is memory left over KV per token.", '"one request".')
    with pytest.raises(ValueError, match="no '\\*A common wrong answer:\\*' part"):
        worked_question("Why?", "**Answer.** Because.")


def test_a_worked_answer_may_break_its_wrong_answer_line():
    from minicb.viz.quiz import worked_question

    q = worked_question("Why?", "**Answer.** Because. *A common wrong\nanswer:* \"no\".")
    assert (q.answer, q.wrong_answer) == ("Because.", '"no".')

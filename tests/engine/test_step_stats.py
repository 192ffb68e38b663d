"""Per-step counts of real engine runs: slot utilisation, padding waste, KV utilisation.

The expected numbers are worked out by hand in the comments; the last tests check that the real
engine and the cost-model runner (minicb.sim) count the same steps the same way.
"""

from __future__ import annotations

import math

import pytest

from minicb import LLM, SamplingParams
from minicb.metrics import StepStats, StepTotals, summarize, summarize_steps
from minicb.sim import simulate
from minicb.sim.workload import Workload, WorkloadRequest


def serve(model: str, prompt_lens, output_lens, **knobs) -> LLM:
    llm = LLM(model, **knobs)
    prompts = [[3 + (7 * i + j) % 500 for j in range(n)] for i, n in enumerate(prompt_lens)]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in output_lens]
    llm.generate(prompts, params, use_tqdm=False)
    return llm


STATIC = dict(scheduler="static", max_num_seqs=3, block_size=4, max_model_len=32)


# Static batch of 3 slots, outputs [2, 6, 6]. Step 1 prefills all three (each gets its first
# token), steps 2..6 decode; A finishes at step 2 (its 2nd token) and rides along as a ghost row in
# steps 3..6 while B and C make tokens 2..6. So 6 steps, 3 rows each: 18 slot-steps, 4 of them
# ghosts → slot utilisation 14/18. Token rows: step 1 computes 3 x longest prompt (8), steps 2..6
# one row each per slot, 3 x 5 = 15 → 39 rows. Waste: the 4 ghost rows, plus the left padding of
# a shorter prompt (8 - 5 = 3 pads when A's prompt has 5 tokens).
#
# KV (paged, blocks of 4): a static batch reserves each member's whole length up front, until the
# batch ends. Equal prompts of 8: A 8 + 2 = 10 → 3 blocks = 12 slots, B and C 14 → 16 each: 44
# slots held after steps 1..5, nothing after step 6 (the batch ended). Tokens stored after each
# step: 24 (prompts), 27, then A stays at 9 while B and C grow by one: 29, 31, 33, then 0.
# 144 / (5 x 44). With A's prompt 5: A 7 → 2 blocks = 8 slots, 40 held; tokens 21, 24, 26, 28, 30
# → 129 / (5 x 40). Contiguous reserves max_model_len = 32 per member: 96 slots, 144 / (5 x 96).
@pytest.mark.parametrize("kv_cache, prompt_lens, pad, kv_utilisation", [
    ("paged", (8, 8, 8), 4, 144 / 220),
    ("paged", (5, 8, 8), 4 + 3, 129 / 200),
    ("contiguous", (8, 8, 8), 4, 144 / 480),
])
def test_static_batch_ghost_rows_and_padding(tiny_llama, kv_cache, prompt_lens, pad,
                                             kv_utilisation):
    llm = serve(tiny_llama, prompt_lens, [2, 6, 6], kv_cache=kv_cache, **STATIC)
    steps = list(llm.llm_engine.step_stats.recent)
    assert [s.num_rows for s in steps] == [3] * 6
    assert [s.num_useful_rows for s in steps] == [3, 3, 2, 2, 2, 2]
    assert [s.num_pad_tokens for s in steps] == [pad - 4, 0, 1, 1, 1, 1]
    assert [s.num_tokens for s in steps] == [24, 3, 3, 3, 3, 3]
    assert steps[-1].num_reserved_slots == steps[-1].num_kv_tokens == 0
    summary = llm.step_stats.summary()
    assert summary.num_steps == 6
    assert summary.slot_utilisation == pytest.approx(14 / 18)
    assert summary.padding_waste == pytest.approx(pad / 39)
    assert summary.kv_utilisation == pytest.approx(kv_utilisation)


# Continuous batching, 2 slots, three requests of a 4-token prompt and 3 output tokens. A and B run
# steps 1..3 (prefill, then two decodes) and leave after step 3; C enters at step 4 and finishes
# at step 6. Useful rows 2, 2, 2, 1, 1, 1 of 2 slots each → 9/12; no padding ever. KV (paged,
# blocks of 4): after step 1 each of A, B holds 1 block with 4 tokens (8 of 8); after step 2
# 2 blocks with 5 (10 of 16); after step 3 both are gone (0 of 0); C then 4 of 4, 5 of 8, 0 of 0.
# 27 / 36 = 0.75.
def test_continuous_slot_and_kv_utilisation(tiny_llama):
    llm = serve(tiny_llama, [4, 4, 4], [3, 3, 3], scheduler="continuous", kv_cache="paged",
                max_num_seqs=2, block_size=4, max_model_len=16)
    steps = list(llm.llm_engine.step_stats.recent)
    assert [s.num_useful_rows for s in steps] == [2, 2, 2, 1, 1, 1]
    assert [s.num_reserved_slots for s in steps] == [8, 16, 0, 4, 8, 0]
    assert [s.num_kv_tokens for s in steps] == [8, 10, 0, 4, 5, 0]
    assert [(s.num_prefill_tokens, s.num_decode_tokens) for s in steps] == \
        [(8, 0), (0, 2), (0, 2), (4, 0), (0, 1), (0, 1)]
    summary = summarize_steps(llm.step_stats)
    assert summary.slot_utilisation == pytest.approx(9 / 12)
    assert summary.padding_waste == 0
    assert summary.kv_utilisation == pytest.approx(27 / 36)
    assert summary.mean_running == pytest.approx(9 / 6)


def test_summarize_takes_the_step_stats_and_keeps_its_old_signature(tiny_llama):
    llm = LLM(tiny_llama, scheduler="static", max_num_seqs=2)
    outputs = llm.generate(
        [[5] * 6, [6] * 6],
        [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (1, 3)],
        use_tqdm=False)
    metrics = [o.metrics for o in outputs]
    assert summarize(metrics, virtual=True).steps is None
    summary = summarize(metrics, virtual=True, steps=llm.step_stats)
    # 3 steps of 2 rows; the 1-token request is a ghost in steps 2 and 3
    assert summary.steps == summarize_steps(llm.step_stats.recent)
    assert summary.steps.slot_utilisation == pytest.approx(4 / 6)
    llm.step_stats.reset()
    assert llm.step_stats.num_steps == 0 and not llm.step_stats.recent
    assert math.isnan(llm.step_stats.summary().slot_utilisation)


def test_totals_are_bounded_but_count_every_step():
    totals = StepTotals(window=2)
    for step in range(1, 6):
        # 4 slots, `step % 3` ghost rows of 4 rows; 8 of 16 KV slots hold a token
        ghosts = step % 3
        totals.add(StepStats(step, 4, 4, 4 - ghosts, 4, ghosts, 0, 4 - ghosts, 16, 8))
    assert [s.step for s in totals.recent] == [4, 5]
    # ghosts per step 1, 2, 0, 1, 2 = 6 of 20 rows
    summary = totals.summary()
    assert summary.num_steps == 5
    assert summary.slot_utilisation == pytest.approx(14 / 20)
    assert summary.padding_waste == pytest.approx(6 / 20)
    assert summary.kv_utilisation == pytest.approx(0.5)


WORKLOAD = [(12, 5), (30, 2), (7, 9), (21, 4), (9, 1), (16, 7), (25, 3)]   # (prompt, output) tokens


@pytest.mark.parametrize("knobs", [
    dict(scheduler="static", kv_cache="contiguous", max_num_seqs=3),
    dict(scheduler="naive", kv_cache="paged", max_num_seqs=2),
    dict(scheduler="continuous", kv_cache="contiguous", max_num_seqs=3, max_num_batched_tokens=16),
    # chunked prefill (16-token budget) and a pool too small for everyone → preemption
    dict(scheduler="continuous", kv_cache="paged", max_num_seqs=4, max_num_batched_tokens=16,
         num_kv_blocks=7),
], ids=["static", "naive", "continuous-contiguous", "continuous-paged-preempting"])
def test_engine_counts_what_the_simulator_counts(tiny_llama, knobs):
    knobs = dict(knobs, block_size=8, max_model_len=40)
    workload = Workload("mixed", [WorkloadRequest(p, o) for p, o in WORKLOAD])
    sim = simulate(workload, **knobs)
    llm = serve(tiny_llama, [p for p, _ in WORKLOAD], [o for _, o in WORKLOAD], **knobs)
    engine_steps = list(llm.llm_engine.step_stats.recent)
    assert engine_steps == [s.stats for s in sim.steps]
    assert llm.step_stats.summary() == sim.step_summary()
    assert llm.step_stats.summary().slot_utilisation == pytest.approx(sim.slot_utilisation())
    if knobs["scheduler"] == "static":
        assert llm.step_stats.num_pad_tokens > 0
    if knobs.get("num_kv_blocks"):
        assert llm.step_stats.num_preempted > 0, "the pool was meant to be too small"

"""Chapter 03: the continuous scheduler's step, plugged into minicb's simulator and real engine."""

from __future__ import annotations

import pytest
from adapter import chapter
from engine_probe import generate_completions, random_prompts
from reference import compare, hf_greedy

import minicb.scheduler
from minicb import LLM
from minicb.sim import SimResult, simulate
from minicb.sim.workload import Workload, fixed, mixed, poisson_arrivals, seed_example

ch03 = chapter("03")

# name → (workload, engine knobs): each scenario leans on one part of the step
SCENARIOS = {
    "chunked-prefill": (fixed("long prompts", [40, 8, 25, 3, 17], [5, 12, 3, 9, 4]),
                        dict(max_num_seqs=4, max_num_batched_tokens=16)),
    "evictions": (fixed("tight KV", [9, 7, 12, 5, 8], [20, 15, 10, 18, 6]),
                  dict(max_num_seqs=4, block_size=4, num_kv_blocks=12)),
    "evictions-and-chunks": (
        fixed("tight KV", [9, 7, 12, 5, 8], [20, 15, 10, 18, 6]),
        dict(max_num_seqs=4, block_size=4, num_kv_blocks=12, max_num_batched_tokens=6)),
    "arrivals": (mixed(n=14, seed=7).with_arrivals(poisson_arrivals(14, rate=0.4, seed=7)),
                 dict(max_num_seqs=3, max_num_batched_tokens=64)),
    "contiguous-kv": (mixed(n=10, seed=8),
                      dict(max_num_seqs=4, kv_cache="contiguous", num_kv_blocks=30)),
}


MAX_STEPS = 400     # every scenario finishes in far fewer with minicb's scheduler


class StepLimited(ch03.StepScheduler):
    """Your scheduler, stopped with a clear message when it runs MAX_STEPS steps."""

    def schedule(self):
        if self.step_count >= MAX_STEPS:
            raise AssertionError(
                f"no progress after {MAX_STEPS} steps: {len(self.waiting)} requests waiting, "
                f"{len(self.running)} running. Check that admitted requests leave the waiting "
                "queue and that every step gives running requests their tokens.")
        return super().schedule()


def run_yours(monkeypatch, workload: Workload, **knobs) -> SimResult:
    """The cost-model simulator with your scheduler as the engine's "continuous" scheduler."""
    with monkeypatch.context() as patch:
        patch.setitem(minicb.scheduler.SCHEDULER_CLASSES, "continuous", StepLimited)
        return simulate(workload, record_blocks=True, **knobs)


def describe(rows) -> str:
    return ", ".join(f"{rid}:{kind} {n}" for rid, kind, n in rows) or "(nothing)"


def assert_same_schedule(expected: SimResult, got: SimResult, where: str) -> None:
    for step, (want, have) in enumerate(zip(expected.steps, got.steps), start=1):
        problems = []
        if have.rows != want.rows:
            problems.append(f"rows (request:kind tokens) should be [{describe(want.rows)}], "
                            f"yours [{describe(have.rows)}]")
        if have.preempted != want.preempted:
            problems.append(f"evicted should be {want.preempted}, yours {have.preempted}")
        if have.block_tables != want.block_tables or have.num_free_blocks != want.num_free_blocks:
            problems.append(f"block tables should be {want.block_tables} ({want.num_free_blocks} "
                            f"free), yours {have.block_tables} ({have.num_free_blocks} free)")
        if problems:
            previous = describe(expected.steps[step - 2].rows) if step > 1 else "(first step)"
            raise AssertionError(
                f"{where}, step {step}: " + "; ".join(problems) +
                f".\nThe step before ran [{previous}]. Hint: running requests first in their "
                f"order, "
                "then admissions in arrival order; evict the latest arrival; admit no one after an "
                "eviction.")
    assert got.num_steps == expected.num_steps, \
        f"{where}: minicb's scheduler serves everyone in {expected.num_steps} steps, yours in " \
        f"{got.num_steps}"


def test_ch03_seed_example_takes_10_steps(monkeypatch):
    """The book's example: 4, 4, 10, 10 on four slots, two 4s waiting: 10 steps, not 14."""
    got = run_yours(monkeypatch, seed_example(), max_num_seqs=4)
    expected = simulate(seed_example(), max_num_seqs=4)
    assert got.num_steps == expected.num_steps == 10, ("continuous batching serves the seed "
                                                       f"example in {expected.num_steps} steps; "
                                                       f"yours took {got.num_steps}. Hint: a "
                                                       "finished request's slot goes to a waiting "
                                                       "one at the very next step.")
    assert got.finish_steps() == expected.finish_steps(), \
        f"finish steps should be {expected.finish_steps()}, yours {got.finish_steps()}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ch03_step_by_step_like_minicb(monkeypatch, scenario):
    workload, knobs = SCENARIOS[scenario]
    expected = simulate(workload, record_blocks=True, **knobs)
    got = run_yours(monkeypatch, workload, **knobs)
    assert_same_schedule(expected, got, f"scenario {scenario!r} ({knobs})")
    # each scenario must really lean on its move, or it would prove nothing
    if scenario == "chunked-prefill":
        assert any(kind == "prefill" and n < workload.prompt_lens[int(rid)]
                   for step in expected.steps for rid, kind, n in step.rows)
    if scenario.startswith("evictions"):
        assert any(step.preempted for step in expected.steps)


def test_ch03_step_respects_slots_and_budget(monkeypatch):
    workload, knobs = SCENARIOS["chunked-prefill"]
    got = run_yours(monkeypatch, workload, **knobs)
    for step in got.steps:
        tokens = sum(n for _, _, n in step.rows)
        assert tokens <= knobs["max_num_batched_tokens"], (
            f"step {step.step} carries {tokens} tokens, over max_num_batched_tokens="
            f"{knobs['max_num_batched_tokens']}: [{describe(step.rows)}]. Hint: chunk long "
            "prompts.")
        assert len(step.rows) <= knobs["max_num_seqs"], \
            f"step {step.step} runs {len(step.rows)} requests on {knobs['max_num_seqs']} slots"


def test_ch03_real_engine_with_evictions_equals_transformers(monkeypatch, tiny_model):
    """Your scheduler drives a real model through chunking and evictions; outputs stay exact."""
    monkeypatch.setitem(minicb.scheduler.SCHEDULER_CLASSES, "continuous", StepLimited)
    llm = LLM(tiny_model, block_size=4, num_kv_blocks=9, max_num_seqs=3, max_num_batched_tokens=8)
    prompts, lengths = random_prompts([10, 7, 12], 512, seed=9), [12, 10, 8]
    completions = generate_completions(llm, prompts, lengths)
    engine = llm.llm_engine
    assert isinstance(engine.scheduler, ch03.StepScheduler)
    for index, (reference, completion) in enumerate(zip(hf_greedy(tiny_model, prompts, lengths),
                                                        completions)):
        try:
            compare(reference, completion.token_ids, completion.logprobs, f"request {index}")
        except AssertionError as error:
            raise AssertionError(f"{error}. transformers generates {reference.token_ids}, the "
                                 f"engine with your scheduler {completion.token_ids}. Hint: an "
                                 "evicted request must recompute from token 0.") from None
    assert engine.scheduler.num_preemptions > 0, ("this setting should force evictions; none "
                                                  "happened")
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, \
        f"{engine.kv.num_blocks - engine.kv.num_free_blocks()} KV blocks still held after every " \
        "request finished"


def test_ch03_victim_is_the_latest_arrival_not_yet_scheduled():
    """pick_victim's contract, with running requests out of arrival order (as after re-admission):
    a request already given its tokens this step is never the victim."""
    from minicb.config import EngineConfig
    from minicb.params import SamplingParams
    from minicb.request import Request

    scheduler = ch03.StepScheduler(EngineConfig(), None, lambda: 0.0)
    arrivals = {"a": 0, "d": 3, "b": 1, "c": 2}
    scheduler.running = [Request(rid, [1, 2, 3], SamplingParams(max_tokens=4), arrival_index=index)
                         for rid, index in arrivals.items()]
    for scheduled, expected in [(set(), "d"), ({"d"}, "c"), ({"a", "d"}, "c"),
                                ({"d", "c"}, "b"), ({"d", "c", "b"}, "a")]:
        scheduler.scheduled_ids = set(scheduled)
        victim = scheduler.pick_victim()
        assert victim is not None and victim.request_id == expected, (
            f"with running {list(arrivals)} (arrival indices {list(arrivals.values())}) and "
            f"scheduled_ids {sorted(scheduled)}, your pick_victim() returned "
            f"{getattr(victim, 'request_id', victim)!r}; the victim is {expected!r}, the latest "
            "arrival among the requests not scheduled this step.")

"""Scheduler policies: admission order, ageing, step composition, the prefill cap, the watermark.

Most checks drive the real ContinuousScheduler through the cost-model runner (one step = one
time unit), where every step's rows are recorded, and rebuild from those records what each
policy promises. The last ones run the real engine on the tiny checkpoints: greedy outputs do
not depend on the policy, only the timing does, and they equal transformers'.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import compare, hf_greedy

from minicb import LLM, SamplingParams
from minicb.config import EngineConfig
from minicb.sim import CostModel, SimResult, simulate
from minicb.sim.workload import Workload, WorkloadRequest

ONE_STEP = CostModel(step_overhead=1.0, prefill_token=0.0, decode_seq=0.0)   # time unit = step


# --- validation -------------------------------------------------------------------------------
@pytest.mark.parametrize("knobs,names", [
    ({"policy": "lifo"}, "policy"),
    ({"step_order": "decode_last"}, "step_order"),
    ({"max_prefill_tokens_per_step": 0}, "max_prefill_tokens_per_step"),
    ({"max_prefill_tokens_per_step": 2.5}, "max_prefill_tokens_per_step"),
    ({"max_prefill_tokens_per_step": 4096, "max_num_batched_tokens": 2048}, "never bind"),
    ({"max_wait_steps": 0}, "max_wait_steps"),
    ({"max_wait_steps": 1.5}, "max_wait_steps"),
    ({"watermark_blocks": -1}, "watermark_blocks"),
    ({"watermark_blocks": True}, "watermark_blocks"),
    ({"scheduler": "static", "policy": "priority"}, "only apply to scheduler='continuous'"),
    ({"scheduler": "naive", "watermark_blocks": 2}, "only apply to scheduler='continuous'"),
    ({"scheduler": "static", "enable_prefix_caching": True},
     "enable_prefix_caching=True only apply to"),
])
def test_bad_policy_knobs_raise_a_clear_error(knobs, names):
    with pytest.raises(ValueError, match=names):
        EngineConfig(**knobs)


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_a_watermark_that_leaves_no_room_for_one_request_is_refused(kv_cache):
    """Admission keeps the watermark free even in an empty pool: a request must still fit."""
    workload = Workload("one", [WorkloadRequest(30, 4)])
    with pytest.raises(ValueError, match="watermark_blocks=5 leaves 5"):
        simulate(workload, kv_cache=kv_cache, block_size=4, num_kv_blocks=10, watermark_blocks=5)
    ok = simulate(workload, kv_cache=kv_cache, block_size=4, num_kv_blocks=10, watermark_blocks=1)
    assert ok.requests[0].num_output_tokens == 4


# --- what the step records show ----------------------------------------------------------------
def check_promises(result: SimResult, workload: Workload) -> None:
    """Replay the recorded steps and check every promise the knobs make.

    - nothing is lost and no KV block leaks;
    - no step carries more tokens than max_num_batched_tokens, nor more prefill tokens than
      max_prefill_tokens_per_step;
    - decode_first: every running request past its prefill gets its token in every step,
      unless it is the one preempted;
    - decode_first with a watermark: a step that admits someone leaves watermark_blocks free;
    - ageing: while an overdue request waits, only requests that arrived before it are admitted.
    """
    config, requests = result.config, result.requests
    by_id = {r.request_id: r for r in requests}
    running: set[str] = set()       # admitted and not since preempted or finished
    decoding: set[str] = set()      # running and past the prefill
    for record in result.steps:
        step, rows = record.step, {rid: (kind, n) for rid, kind, n in record.rows}
        assert sum(n for _, n in rows.values()) <= config.max_num_batched_tokens
        prefill = sum(n for kind, n in rows.values() if kind == "prefill")
        assert prefill <= (config.max_prefill_tokens_per_step or config.max_num_batched_tokens), \
            f"step {step} carries {prefill} prefill tokens"
        admitted = set(rows) - running
        if config.step_order == "decode_first":
            for rid in decoding - set(record.preempted):
                assert rows.get(rid) == ("decode", 1), (f"step {step}: running request {rid} got "
                                                        "no token")
            if admitted and config.watermark_blocks:
                assert record.num_free_blocks >= config.watermark_blocks
        if config.max_wait_steps is not None:
            overdue_waiting = [r for r in requests if r.request_id not in running and
                               r.times.arrival_step + config.max_wait_steps + 1 <= step and
                               (r.times.finished_step is None or r.times.finished_step >= step) and
                               r.request_id not in admitted]
            for waiter in overdue_waiting:
                overtakers = [rid for rid in admitted
                              if by_id[rid].arrival_index > waiter.arrival_index]
                assert not overtakers, \
                    f"step {step}: {overtakers} admitted ahead of overdue request " \
                    f"{waiter.request_id}"
        running = (running | set(rows)) - set(record.preempted)
        for rid in rows:
            request = by_id[rid]
            if step in request.times.token_steps:
                decoding.add(rid)                 # a decode, or the prefill's last chunk
            else:
                decoding.discard(rid)
            if request.times.finished_step == step:
                running.discard(rid)
                decoding.discard(rid)
        decoding -= set(record.preempted)
    assert [r.num_output_tokens for r in requests] == workload.output_lens, "a request was lost"
    assert result.steps[-1].num_free_blocks == config.num_kv_blocks, "KV blocks leaked"


def blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@st.composite
def runs(draw):
    n = draw(st.integers(1, 10))
    arrivals, now = [], 0.0
    for _ in range(n):
        now += draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]))
        arrivals.append(now)
    requests = [WorkloadRequest(draw(st.integers(1, 40)), draw(st.integers(1, 12)), arrival,
                                draw(st.integers(0, 2))) for arrival in arrivals]
    workload = Workload("drawn", requests)
    max_num_seqs = draw(st.integers(1, 4))
    budget = draw(st.integers(max_num_seqs, 48))
    block_size = 4
    longest = max(r.prompt_len + r.output_len for r in requests)
    num_kv_blocks = blocks(longest, block_size) + draw(st.integers(0, 12))
    cap = draw(st.one_of(st.none(), st.integers(1, budget)))
    first_chunk = blocks(min(cap or budget, longest), block_size)
    watermark = draw(st.integers(0, max(num_kv_blocks - first_chunk, 0)))
    knobs = dict(policy=draw(st.sampled_from(["fcfs", "priority", "shortest_prompt_first"])),
                 step_order=draw(st.sampled_from(["decode_first", "prefill_first"])),
                 max_wait_steps=draw(st.one_of(st.none(), st.integers(1, 10))),
                 max_prefill_tokens_per_step=cap, watermark_blocks=watermark,
                 max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, block_size=block_size,
                 num_kv_blocks=num_kv_blocks)
    return workload, knobs


@settings(max_examples=150, deadline=None)
@given(runs())
def test_every_policy_keeps_its_promises(run):
    workload, knobs = run
    check_promises(simulate(workload, cost=ONE_STEP, **knobs), workload)


# --- starvation ------------------------------------------------------------------------------
SHORT, LONG, MAX_WAIT = WorkloadRequest(4, 4), WorkloadRequest(40, 10, priority=1), 8


def stream_with_one_long_request() -> Workload:
    """Short requests arrive every step, twice as fast as two slots can serve them; one long,
    low-priority request arrives among the first ones and is the oldest waiting from then on."""
    shorts = [WorkloadRequest(SHORT.prompt_len, SHORT.output_len, float(t)) for t in range(80)]
    long_one = WorkloadRequest(LONG.prompt_len, LONG.output_len, 1.5, LONG.priority)
    return Workload("stream", shorts[:2] + [long_one] + shorts[2:])


def serve_stream(policy: str, max_wait_steps: int | None) -> SimResult:
    return simulate(stream_with_one_long_request(), cost=ONE_STEP, policy=policy,
                    max_wait_steps=max_wait_steps, max_num_seqs=2, max_num_batched_tokens=64,
                    block_size=4)


@pytest.mark.parametrize("policy", ["fcfs", "priority", "shortest_prompt_first"])
def test_a_long_request_finishes_within_the_ageing_bound(policy):
    """The bound follows from the continuous scheduler's ageing promise. The long request is
    overdue from step arrival + W + 1; from then on nobody younger is admitted, and the requests
    already running
    (shorts, each holding its slot for SHORT.output_len steps: prefill plus decodes) free a slot
    by step arrival + W + SHORT.output_len. Its prompt fits one step's budget and, decode-first,
    it then gets a token every step: LONG.output_len - 1 more steps."""
    result = serve_stream(policy, MAX_WAIT)
    long_one = result.requests[2]
    arrival = long_one.times.arrival_step
    assert long_one.times.first_scheduled_step <= arrival + MAX_WAIT + SHORT.output_len
    assert (long_one.times.finished_step <= arrival + MAX_WAIT + SHORT.output_len + LONG.output_len
            - 1)
    check_promises(result, stream_with_one_long_request())


@pytest.mark.parametrize("policy", ["priority", "shortest_prompt_first"])
def test_without_ageing_the_long_request_starves_until_the_stream_ends(policy):
    result = serve_stream(policy, None)
    long_one = result.requests[2]
    assert long_one.times.finished_step == result.num_steps, "it should be served last of all"
    assert long_one.times.finished_step > \
        long_one.times.arrival_step + MAX_WAIT + SHORT.output_len + LONG.output_len - 1


# --- preemption victims ---------------------------------------------------------------------
@pytest.mark.parametrize("policy,priorities,max_wait_steps,victim", [
    ("fcfs", [0, 0, 0], None, "2"),                 # the latest arrival
    ("priority", [1, 0, 0], None, "0"),             # the lowest priority, though it came first
    ("priority", [0, 1, 0], None, "1"),
    ("priority", [1, 0, 0], 2, "2"),                # everyone is overdue: age beats priority
    ("shortest_prompt_first", [0, 0, 0], None, "2"),   # the latest arrival, though not the longest
])
def test_the_preemption_victim_follows_the_policy(policy, priorities, max_wait_steps, victim):
    """Three requests fill a 6-block pool (2 blocks each by their 5th token); the first to need a
    third block forces a preemption."""
    prompts = [4, 8, 4] if policy == "shortest_prompt_first" else [4, 4, 4]
    workload = Workload("full",
                        [WorkloadRequest(p, 16 - p, 0.0, q) for p, q in zip(prompts, priorities)])
    result = simulate(workload, cost=ONE_STEP, policy=policy, max_wait_steps=max_wait_steps,
                      max_num_seqs=3, block_size=4,
                      num_kv_blocks=7 if policy == "shortest_prompt_first" else 6)
    first = next(record.preempted for record in result.steps if record.preempted)
    assert first == [victim]
    check_promises(result, workload)


# --- the real engine ---------------------------------------------------------------------------
POLICY_CONFIGS = {
    "fcfs": {},
    "priority+ageing": {"policy": "priority", "max_wait_steps": 8},
    "shortest-prompt-first": {"policy": "shortest_prompt_first"},
    "prefill-first+cap": {"step_order": "prefill_first", "max_prefill_tokens_per_step": 12},
    "cap+small-pool": {"max_prefill_tokens_per_step": 8, "num_kv_blocks": 20},
    "priority+watermark+small-pool": {"policy": "priority", "watermark_blocks": 4,
                                      "num_kv_blocks": 18},
}


def engine_workload(seed: int = 1, num_requests: int = 10, vocab: int = 512):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 48))]
               for _ in range(num_requests)]
    max_tokens = [rng.randint(1, 24) for _ in range(num_requests)]
    priorities = [rng.randint(0, 2) for _ in range(num_requests)]
    arrival_steps = sorted(rng.randint(0, 12) for _ in range(num_requests))
    return prompts, max_tokens, priorities, arrival_steps


def serve(llm: LLM, prompts, max_tokens, priorities, arrival_steps):
    """Request i joins just before step arrival_steps[i]; returns outputs and first-token steps."""
    engine = llm.llm_engine
    finished, requests, step = {}, [], 0
    while len(requests) < len(prompts) or engine.has_unfinished_requests():
        while len(requests) < len(prompts) and arrival_steps[len(requests)] <= step:
            i = len(requests)
            params = SamplingParams(max_tokens=max_tokens[i], temperature=0, ignore_eos=True,
                                    logprobs=5)
            requests.extend(engine.add_request(str(i), prompts[i], params, priority=priorities[i]))
        for output in engine.step():
            if output.finished:
                finished[int(output.request_id)] = output.outputs[0]
        step += 1
    return [finished[i] for i in range(len(prompts))], tuple(
        r.times.first_token_step for r in requests)


def test_greedy_outputs_do_not_depend_on_the_policy(tiny_model):
    prompts, max_tokens, priorities, arrival_steps = workload = engine_workload()
    references = hf_greedy(tiny_model, prompts, max_tokens)
    schedules, outputs_by_config = {}, {}
    for name, knobs in POLICY_CONFIGS.items():
        llm = LLM(tiny_model, max_num_seqs=3, max_num_batched_tokens=32, max_model_len=80,
                  block_size=4, **knobs)
        outputs, schedules[name] = serve(llm, *workload)
        verdicts = [compare(ref, out.token_ids, out.logprobs, f"{name}, request {i}")
                    for i, (ref, out) in enumerate(zip(references, outputs))]
        outputs_by_config[name] = [out.token_ids if v == "equal" else None for out, v
                                   in zip(outputs, verdicts)]
        engine = llm.llm_engine
        assert engine.kv.num_free_blocks() == engine.kv.num_blocks, f"{name}: KV blocks leaked"
        if "small-pool" in name:
            assert engine.scheduler.num_preemptions > 0, (f"{name}: the pool was meant to force "
                                                          "preemptions")
    # the same tokens everywhere (a near-tie with transformers is the only excuse)...
    for i in range(len(prompts)):
        seen = {tuple(out[i]) for out in outputs_by_config.values() if out[i] is not None}
        assert len(seen) <= 1, f"request {i} differs between policies"
    # ...from genuinely different schedules
    assert len(set(schedules.values())) == len(POLICY_CONFIGS), schedules


def test_llm_generate_serves_priorities_in_order(tiny_llama):
    """One slot: the requests run one after another, lowest priority value first."""
    llm = LLM(tiny_llama, max_num_seqs=1, max_num_batched_tokens=16, max_model_len=64,
              policy="priority")
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
                           use_tqdm=False, priority=[2, 0, 1])
    order = sorted(range(3), key=lambda i: outputs[i].metrics.first_token_step)
    assert order == [1, 2, 0]


# --- the benchmark's plumbing ---------------------------------------------------------------------
def test_the_benchmark_sweeps_every_policy_and_draws_one_curve_each(tmp_path):
    from dataclasses import replace

    from minicb.bench.policies import COST_MODEL, format_rows, plot, policies, sweep

    setup = replace(COST_MODEL, num_requests=24, loads=(1.0,))
    rows = sweep(setup, progress=False)
    names = list(policies(setup))
    assert [(r["workload"], r["load"], r["policy"]) for r in rows] == \
        [(w, load, p) for w in ("chat", "long-tail") for load in (1.0, float("inf")) for p in names]
    assert all(r["completed"] == 24 for r in rows)
    assert format_rows(rows).count("\n") == len(rows) + 1
    fig = plot(rows, tmp_path / "policies.png")
    assert (tmp_path / "policies.png").stat().st_size > 0
    assert [line.get_label() for line in fig.axes[0].get_lines()] == names


def test_the_engine_runner_queues_requests_from_their_arrival_time(tiny_llama):
    from dataclasses import replace

    from minicb.bench.policies import ENGINE, run_engine

    setup = replace(ENGINE, knobs={**ENGINE.knobs, "num_kv_blocks": 16})
    workload = Workload("few",
                        [WorkloadRequest(5 + 3 * i, 2 + i, 0.02 * i, i % 2) for i in range(6)])
    requests = run_engine(setup, workload, {"policy": "priority"}, tiny_llama)
    assert [r.num_output_tokens for r in sorted(requests, key=lambda r: int(r.request_id))] == \
        workload.output_lens
    start = min(r.times.arrival for r in requests)
    for request in requests:
        spec = workload.requests[int(request.request_id)]
        assert request.times.arrival == pytest.approx(start + spec.arrival)
        assert request.times.first_scheduled >= request.times.arrival
        assert request.priority == spec.priority

"""Several GPUs in the cost model: KV transfers, prefill/decode disaggregation, tensor parallelism
and goodput, checked against cases worked by hand."""

from __future__ import annotations

import pytest

from minicb.sim import CostModel, simulate
from minicb.sim.calibrate import A100_LLAMA2_7B
from minicb.sim.cluster import (
    Pool,
    attainment_at_rate,
    max_rate_meeting,
    simulate_cluster,
    slo_attainment,
)
from minicb.sim.parallel import (
    ETHERNET_25G,
    LLAMA2_7B,
    LLAMA2_70B,
    NVLINK,
    PCIE,
    Link,
    ModelShape,
    allreduce_time,
    custom_allreduce_time,
    kv_blocks_per_gpu,
    kv_transfer_time,
    nccl_allreduce_time,
    ring_allreduce_time,
    scaled_cost_model,
    tp_cost_model,
    tp_step_parts,
)
from minicb.sim.workload import Workload, WorkloadRequest, fixed, mixed, poisson_arrivals

# one unit per step, a hundredth of a unit per prompt token: hand arithmetic stays exact
UNIT = CostModel(step_overhead=1.0, prefill_token=0.01)
TINY = ModelShape("tiny", params=1000, layers=2, hidden_size=8, kv_heads=3, head_dim=4)


def workload(*requests: tuple[int, int, float]) -> Workload:
    return Workload("hand", [WorkloadRequest(p, o, a) for p, o, a in requests])


# --- links ---------------------------------------------------------------------------------------
def test_kv_transfer_time_is_bytes_over_bandwidth_plus_latency():
    # K and V x 2 layers x 3 KV heads x 4 values x 2 bytes = 96 bytes per token
    assert TINY.kv_bytes_per_token == 96
    link = Link("slow", bandwidth=960.0, latency=0.25)
    assert kv_transfer_time(TINY, 10, link) == pytest.approx(0.25 + 1.0)
    faster = Link("faster", bandwidth=1920.0, latency=0.25)
    assert kv_transfer_time(TINY, 10, faster) == pytest.approx(0.25 + 0.5)
    assert kv_transfer_time(TINY, 20, link) == pytest.approx(0.25 + 2.0)
    # Llama-2-7B: 32 layers x 32 KV heads x 128 x 2 bytes x K and V = half a MiB per token
    assert LLAMA2_7B.kv_bytes_per_token == 512 * 1024
    with pytest.raises(ValueError, match="bandwidth > 0"):
        Link("broken", bandwidth=0.0, latency=0.0)


def test_ring_allreduce_hand_case():
    link = Link("hand", bandwidth=100.0, latency=1.0)
    # 4 GPUs: 6 hops of 1, each GPU sends 6/4 of 1000 bytes at 100 B/s, plus a base of 2
    assert ring_allreduce_time(1000, 4, link, base_latency=2.0) == pytest.approx(2 + 6 + 15)
    assert ring_allreduce_time(1000, 2, link) == pytest.approx(2 + 10)
    assert ring_allreduce_time(1000, 1, link, base_latency=2.0) == 0.0
    with pytest.raises(ValueError, match="at least one GPU"):
        ring_allreduce_time(1000, 0, link)


def test_nccl_picks_its_fastest_protocol_by_hand():
    """NCCL's own latency model (tuning.cc): LL for small messages, Simple for large ones."""
    # 2 GPUs over PCIe, 8 KiB: LL = 6.6 + 2 x 1.0 us + 8 KiB at a quarter of 32 GB/s
    assert nccl_allreduce_time(8192, 2, PCIE) == pytest.approx((8.6e-6 + 8192 / 8e9, "LL"))
    # 64 MiB over NVLink is bandwidth: Simple at the link's full speed wins
    seconds, protocol = nccl_allreduce_time(64 * 2**20, 8, NVLINK)
    assert protocol == "Simple"
    assert seconds == pytest.approx(8.4e-6 + 14 * 3.4e-6 + 14 / 8 * 64 * 2**20 / NVLINK.bandwidth)
    # LL128 runs only over NVLink
    assert {nccl_allreduce_time(b, 4, PCIE)[1] for b in (2**10, 2**16, 2**22, 2**26)} \
        <= {"LL", "Simple"}


def test_vllm_custom_allreduce_inside_an_nvlink_node():
    """Inside an NVLink node vLLM's own kernel runs (its measured times, a line in bytes between
    4 KiB and 1 MiB); over PCIe, past 1 MiB, or at a TP degree without a measurement, NCCL's."""
    assert custom_allreduce_time(4096, 8) == pytest.approx(9.3e-6)
    assert custom_allreduce_time(2**20, 2) == pytest.approx(26.6e-6)
    assert allreduce_time(8192, 4, NVLINK) == custom_allreduce_time(8192, 4)
    assert allreduce_time(8192, 4, PCIE) == nccl_allreduce_time(8192, 4, PCIE)[0]
    assert allreduce_time(4 * 2**20, 4, NVLINK) == nccl_allreduce_time(4 * 2**20, 4, NVLINK)[0]
    assert allreduce_time(8192, 6, NVLINK) == nccl_allreduce_time(8192, 6, NVLINK)[0]
    assert allreduce_time(8192, 1, NVLINK) == 0.0
    # one-shot: a decode's small message costs about the same on 2 or 8 GPUs (no chain of hops)
    assert allreduce_time(8192, 8, NVLINK) < 1.1 * allreduce_time(8192, 2, NVLINK)


# --- tensor parallelism --------------------------------------------------------------------------
SHAPES = [(0, 1, 0), (0, 32, 32 * 700), (2048, 0, 0), (512, 16, 16 * 300)]


def test_tp_of_one_is_the_single_gpu_cost_model():
    one = tp_cost_model(A100_LLAMA2_7B, LLAMA2_7B, 1, PCIE)
    for prefill, rows, keys in SHAPES:
        assert one.step_time(prefill, rows, keys) == A100_LLAMA2_7B.step_time(prefill, rows, keys)


def test_tp_step_by_hand():
    """Two GPUs over PCIe, one decode row reading 1,000 keys, from the published numbers."""
    base = A100_LLAMA2_7B
    weights = 6_738_415_616 * 2 / 2039e9                     # seconds to read fp16 weights once
    # NCCL's LL protocol: base + 2 hops + half of 8 KiB at a quarter of the link's 32 GB/s
    one_allreduce = 6.6e-6 + 2 * 1.0e-6 + 1 * 4096 * 2 / (32e9 / 4)
    expected = (base.step_overhead - weights) + weights / 2 + base.decode_seq / 2 \
        + base.context_token * 1000 / 2 + 2 * 32 * one_allreduce
    got = tp_cost_model(base, LLAMA2_7B, 2, PCIE).step_time(0, 1, 1000)
    assert got == pytest.approx(expected, rel=1e-12)
    parts = tp_step_parts(base, LLAMA2_7B, 2, PCIE, 0, 1, 1000)
    assert parts["all-reduce"] == pytest.approx(2 * 32 * one_allreduce, rel=1e-12)
    assert sum(parts.values()) == pytest.approx(got, rel=1e-12)


def test_tp_with_a_free_link_only_divides_and_a_slow_link_can_lose():
    free = lambda num_bytes, n, link: 0.0
    base = A100_LLAMA2_7B
    weights = LLAMA2_7B.weight_bytes / 2039e9
    for n in (2, 4, 8):
        got = tp_cost_model(base, LLAMA2_7B, n, NVLINK, allreduce=free).step_time(0, 32, 22400)
        expected = (base.step_overhead - weights) + (weights + 32 * base.decode_seq
                                                     + 22400 * base.context_token) / n
        assert got == pytest.approx(expected, rel=1e-9)
    # the same step keeps getting faster up to 8 GPUs in an NVLink node, gains little from 4 to 8
    # over PCIe, and gets slower with every GPU added over 25 Gb/s Ethernet
    step = {(link.name, n): tp_cost_model(base, LLAMA2_7B, n, link).step_time(0, 32, 22400)
            for link in (NVLINK, PCIE, ETHERNET_25G) for n in (1, 2, 4, 8)}
    assert step[(NVLINK.name, 8)] < 0.85 * step[(NVLINK.name, 4)]
    assert 0.9 * step[(PCIE.name, 4)] < step[(PCIE.name, 8)] < step[(PCIE.name, 4)]
    ethernet = ETHERNET_25G.name
    assert step[(ethernet, 8)] > step[(ethernet, 4)] > step[(ethernet, 2)]


def test_tp_refuses_a_cost_model_cheaper_than_its_weights():
    with pytest.raises(ValueError, match="not this model's cost model"):
        tp_cost_model(CostModel(step_overhead=1e-3), LLAMA2_7B, 2, NVLINK)


def test_kv_blocks_per_gpu_and_the_scaled_model_by_hand():
    # 90 % of 80 GB, less 13.48 GB of fp16 weights, in blocks of 16 tokens of half a MiB
    assert kv_blocks_per_gpu(LLAMA2_7B) == int((0.9 * 80e9 - 6_738_415_616 * 2)
                                               // (16 * 512 * 1024)) == 6976
    assert kv_blocks_per_gpu(LLAMA2_70B, 1) == 0               # 138 GB of weights do not fit
    # two GPUs: each holds half the weights and half of every token's KV
    half_token = 2 * 80 * 8 * 128 * 2 / 2
    assert kv_blocks_per_gpu(LLAMA2_70B, 2) == int((0.9 * 80e9 - 68_976_648_192)
                                                   // (16 * half_token))
    same = scaled_cost_model(A100_LLAMA2_7B, LLAMA2_7B, LLAMA2_7B)
    for shape in SHAPES:
        assert same.step_time(*shape) == pytest.approx(A100_LLAMA2_7B.step_time(*shape))


# --- one request, by hand ------------------------------------------------------------------------
def test_single_request_timeline_by_hand():
    """100-token prompt, 5 tokens out. Co-located: the prompt step costs 1 + 100 x 0.01 = 2, then
    a token per unit. Disaggregated: the same first token, then the transfer, then a token per
    unit on the decode instance."""
    one = workload((100, 5, 0.0))
    together = simulate_cluster(one, colocated=Pool(1, UNIT)).requests[0]
    assert together.times.token_times == [2.0, 3.0, 4.0, 5.0, 6.0]
    link = Link("hand", bandwidth=96 * 100 / 0.5, latency=0.25)     # 100 tokens in 0.5 + 0.25
    apart = simulate_cluster(one, prefill=Pool(1, UNIT), decode=Pool(1, UNIT), shape=TINY,
                             link=link)
    request = apart.requests[0]
    assert request.times.token_times == pytest.approx([2.0, 3.75, 4.75, 5.75, 6.75])
    (sent,) = apart.transfers
    assert (sent.ready, sent.start, sent.end, sent.num_tokens) == pytest.approx((2, 2, 2.75, 100))
    assert apart.finished_on["0"] == ["prefill-0", "decode-0"]


def test_prefill_no_longer_stalls_a_running_decode():
    """A decodes; B's 500-token prompt arrives at t = 3. Co-located, one of A's tokens waits for
    the 1 + 5 = 6-unit step that carries B's prompt; disaggregated, A's tokens keep a unit apart."""
    two = workload((10, 10, 0.0), (500, 2, 3.0))
    knobs = {"max_num_batched_tokens": 1024}
    together = simulate_cluster(two, colocated=Pool(1, UNIT, knobs)).metrics[0]
    assert max(together.itl) == pytest.approx(6.0)
    apart = simulate_cluster(two, prefill=Pool(1, UNIT, knobs), decode=Pool(1, UNIT, knobs),
                             transfer=lambda tokens: 0.0).metrics[0]
    assert apart.itl == pytest.approx([1.0] * 9)


# --- against the one-GPU simulator ---------------------------------------------------------------
def timed_mix(n: int = 40, rate: float = 0.08, seed: int = 0) -> Workload:
    return mixed(n, seed).with_arrivals(poisson_arrivals(n, rate, seed=seed))


def test_one_colocated_instance_is_the_one_gpu_simulator():
    w = timed_mix()
    knobs = dict(max_num_seqs=6, max_num_batched_tokens=64, num_kv_blocks=24, block_size=8)
    alone = simulate(w, cost=UNIT, **knobs)
    cluster = simulate_cluster(w, colocated=Pool(1, UNIT, knobs))
    assert sum(r.num_preemptions for r in alone.requests) > 0      # the case is not trivial
    assert [r.times.token_times for r in cluster.requests] == \
        [r.times.token_times for r in alone.requests]


def test_an_arrival_at_the_end_of_a_step_joins_the_next_step():
    """Steps end at whole units here (1 + 100 x 0.01, then 1 per decode); a request arriving at
    t = 4, the instant a step ends, is in the step that starts then, as in the one-GPU
    simulator."""
    w = workload((100, 6, 0.0), (50, 3, 4.0))
    cluster = simulate_cluster(w, colocated=Pool(1, UNIT))
    assert cluster.requests[1].times.token_times[0] == pytest.approx(4.0 + 1 + 0.5)
    assert [r.times.token_times for r in cluster.requests] == \
        [r.times.token_times for r in simulate(w, cost=UNIT).requests]


def test_free_transfers_recover_colocated_when_requests_do_not_meet():
    """Requests that never overlap: with a free transfer, disaggregation changes nothing."""
    spaced = fixed("spaced", [12, 40, 7, 90], [6, 3, 9, 2]).with_arrivals([0, 100, 200, 300])
    together = simulate(spaced, cost=UNIT)
    apart = simulate_cluster(spaced, prefill=Pool(1, UNIT), decode=Pool(1, UNIT),
                             transfer=lambda tokens: 0.0)
    assert [r.times.token_times for r in apart.requests] == \
        [r.times.token_times for r in together.requests]


# --- conservation --------------------------------------------------------------------------------
def test_every_request_finishes_once_and_every_transfer_follows_the_formula():
    w = fixed("conserve", [5, 60, 33, 8, 120, 17, 64, 2, 45, 90, 3, 30],
              [1, 7, 12, 1, 30, 4, 9, 15, 1, 6, 22, 5])
    w = w.with_arrivals(poisson_arrivals(len(w), 0.5, seed=3))
    link = Link("hand", bandwidth=480.0, latency=0.125)
    knobs = dict(max_num_seqs=3, max_num_batched_tokens=64, num_kv_blocks=20, block_size=8)
    result = simulate_cluster(w, prefill=Pool(2, UNIT, knobs), decode=Pool(2, UNIT, knobs),
                              shape=TINY, link=link)
    for spec, request in zip(w.requests, result.requests):
        where = result.finished_on[request.request_id]
        assert [name.split("-")[0] for name in where] == (["prefill"] if spec.output_len == 1
                                                          else ["prefill", "decode"])
        assert request.num_output_tokens == spec.output_len
        times = request.times.token_times
        assert times == sorted(times) and times[0] > spec.arrival
    assert len(result.transfers) == sum(o > 1 for o in w.output_lens)
    for sent in result.transfers:
        assert sent.end - sent.start == pytest.approx(0.125 + sent.num_tokens * 96 / 480.0)
        assert sent.num_tokens == w.requests[int(sent.request_id)].prompt_len
    for source in ("prefill-0", "prefill-1"):           # one KV cache at a time on each link
        mine = [t for t in result.transfers if t.source == source]
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
    for instance in result.instances:                  # nothing leaked
        assert instance.kv.num_free_blocks() == instance.kv.num_blocks


def test_a_decode_instance_admits_arrived_caches_only_into_free_slots():
    """Two decode slots, four requests prefilled together: two decode, two wait for a slot."""
    four = workload(*[(10, 6, 0.0)] * 4)
    slots = {"max_num_seqs": 2, "num_kv_blocks": 64}          # blocks for all: slots bind
    result = simulate_cluster(four, prefill=Pool(1, UNIT), decode=Pool(1, UNIT, slots),
                              transfer=lambda tokens: 0.0)
    prefill, decode = result.instances
    # one prefill step of 40 tokens ends at 1.4; the first two decode 5 steps (until 6.4), then
    # the other two
    assert [rows for *_, rows in decode.steps] == [2] * 10
    late = result.requests[3].times.token_times
    assert late[0] == pytest.approx(1.4) and late[1] == pytest.approx(7.4)


def test_the_simulators_change_scheduler_and_request_state_only_through_the_scheduler():
    """The simulators are the engine with the model swapped: no queue, KV pool, status or finish
    time is changed by hand in minicb/sim (a transfer's arrival goes through
    Scheduler.admit_transferred)."""
    import ast
    from pathlib import Path

    sim = Path(__file__).resolve().parents[2] / "minicb" / "sim"
    owned = {"status", "finished", "finished_step", "num_computed_tokens", "output_token_ids",
             "running", "waiting", "placeholders", "params", "times"}
    found = []
    for path in sorted(sim.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Attribute) and leaf.attr in owned:
                        found.append(f"{path.name}:{node.lineno} sets .{leaf.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Attribute) and (
                        owner.attr in ("running", "waiting", "placeholders", "output_token_ids")
                        or owner.attr == "kv" and node.func.attr in ("allocate", "free", "fork",
                                                                     "truncate")):
                    found.append(f"{path.name}:{node.lineno} calls .{owner.attr}."
                                 f"{node.func.attr}")
    assert not found, found


def test_admit_transferred_takes_a_slot_and_blocks_or_nothing():
    from minicb.config import EngineConfig
    from minicb.kv import make_kv_manager
    from minicb.params import SamplingParams
    from minicb.request import Request, RequestStatus
    from minicb.scheduler import make_scheduler

    config = EngineConfig(max_model_len=64, max_num_seqs=2, block_size=4,
                          num_kv_blocks=16).resolve(64)
    kv = make_kv_manager("paged", 16, 4, 64, False)
    scheduler = make_scheduler(config, kv, lambda: 5.0)

    def arrived(name: str, computed: int) -> Request:
        """A request a prefill instance finished at its first token."""
        request = Request(name, [1] * computed, SamplingParams(max_tokens=8, ignore_eos=True))
        request.num_computed_tokens, request.output_token_ids = computed, [7]
        request.status, request.times.finished = RequestStatus.FINISHED_LENGTH, 1.0
        return request

    first, second, third = arrived("a", 30), arrived("b", 32), arrived("c", 4)
    assert scheduler.admit_transferred(first)
    assert first.status is RequestStatus.RUNNING and first.times.finished is None
    assert len(kv.block_table(first)) == 8 and scheduler.running == [first]
    assert not scheduler.admit_transferred(second)     # 8 blocks left; its 32 + 1 tokens need 9
    assert second.status is RequestStatus.FINISHED_LENGTH
    assert kv.block_table(second) == [] and kv.num_free_blocks() == 8
    assert scheduler.admit_transferred(third)
    assert not scheduler.admit_transferred(arrived("d", 1))   # no slot left
    plan = scheduler.schedule()                                # they decode here
    assert [(s.request, s.is_decode, s.start) for s in plan.seqs] == [(first, True, 30),
                                                                      (third, True, 4)]


def test_bad_clusters_are_refused_with_the_fix():
    one = workload((10, 2, 0.0))
    with pytest.raises(ValueError, match="either colocated"):
        simulate_cluster(one, colocated=Pool(1, UNIT), prefill=Pool(1, UNIT))
    with pytest.raises(ValueError, match="either colocated"):
        simulate_cluster(one, prefill=Pool(1, UNIT))
    with pytest.raises(ValueError, match="shape= and link="):
        simulate_cluster(one, prefill=Pool(1, UNIT), decode=Pool(1, UNIT))
    with pytest.raises(ValueError, match="raise num_kv_blocks"):
        simulate_cluster(workload((100, 2, 0.0)),
                         colocated=Pool(1, UNIT, dict(num_kv_blocks=2, block_size=8)))


# --- goodput -------------------------------------------------------------------------------------
def test_max_rate_meeting_scans_then_refines():
    calls = []

    def attainment(rate):
        calls.append(rate)
        return 1.0 if rate <= 5.5 else 0.5

    best, tried = max_rate_meeting(attainment, [8, 1, 2, 4], goal=0.9, refine=3)
    assert best == 5.0
    assert calls == [1, 2, 4, 8, 5.0, 6.0]              # stops at the first miss, both times
    assert tried[-1] == (6.0, 0.5)
    assert max_rate_meeting(lambda rate: 0.0, [1, 2], goal=0.9)[0] == 0.0


def test_goodput_grows_with_slo_slack():
    w = timed_mix(60, rate=0.3, seed=1)
    metrics = simulate_cluster(w, colocated=Pool(1, UNIT, dict(max_num_seqs=4))).metrics
    shares = [slo_attainment(metrics, 20 * k, 1.5 * k) for k in (0.25, 0.5, 1, 2, 4, 100)]
    assert shares == sorted(shares) and shares[0] < shares[-1] == 1.0
    cluster = dict(prefill=Pool(1, UNIT, dict(max_num_seqs=4)),
                   decode=Pool(1, UNIT, dict(max_num_seqs=4)), transfer=lambda tokens: 0.5)
    best = []
    for k in (0.5, 1, 2):
        at = lambda rate, k=k: attainment_at_rate(mixed(40), rate, 10 * k, 1.5 * k, **cluster)
        best.append(max_rate_meeting(at, [0.05, 0.1, 0.2, 0.4, 0.8], goal=0.9, refine=2)[0])
    assert best == sorted(best) and best[0] < best[-1]


def test_the_benchmarks_runs_grow_by_adding_later_requests():
    """bench disagg: a higher rate serves more requests, the same ones first; a split's GPUs are
    its two pools'."""
    from minicb.sim.disagg import MIN_REQUESTS, TASKS, systems

    task = TASKS["long prompts"]
    small, large = task.workload(10, 1.0), task.workload(40, 3.0)
    assert len(small) == MIN_REQUESTS and len(large) == 120
    assert large.prompt_lens[:MIN_REQUESTS] == small.prompt_lens
    assert large.output_lens[:MIN_REQUESTS] == small.output_lens
    assert all(1024 <= p <= 3072 for p in large.prompt_lens)
    for name, (gpus, cluster) in systems("pcie").items():
        pools = [cluster[k] for k in ("colocated", "prefill", "decode") if k in cluster]
        assert gpus == sum(pool.count * pool.gpus for pool in pools), name


def test_an_instance_admits_by_the_engines_own_length_rule():
    """A request that can never fit an instance's KV pool is refused with the scheduler's
    message (Scheduler.check_fits), named for the instance."""
    from minicb.params import SamplingParams
    from minicb.request import Request
    from minicb.sim.cluster import Instance

    instance = Instance("decode-0", "decode", Pool(1, UNIT, dict(num_kv_blocks=2, block_size=4)),
                        max_model_len=64)
    instance.add(Request("fits", [1] * 4, SamplingParams(max_tokens=4)))
    with pytest.raises(ValueError, match=r"request big on decode-0: this request may reach 20 "
                                         r"tokens but the whole KV pool holds 8; raise "
                                         r"num_kv_blocks"):
        instance.add(Request("big", [1] * 12, SamplingParams(max_tokens=8)))

"""minicb.sim.parallel's gloo all-reduce and a measured fixed part; minicb.sim.plans' TP against
PP priced at equal load only where the KV fits: hand-worked cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minicb.facts import fact
from minicb.sim import CostModel
from minicb.sim.calibrate import A100_LLAMA2_7B
from minicb.sim.parallel import (
    GLOO_SIZES,
    INFINIBAND,
    LLAMA2_7B,
    LLAMA2_70B,
    NVLINK,
    ModelShape,
    gloo_allreduce_time,
    scaled_cost_model,
    tp_cost_model,
    tp_step_parts,
    transfer_time,
)
from minicb.sim.plans import kv_tokens, pp_plan, tp_plan

ROOT = Path(__file__).resolve().parents[2]
TABLE = ((100, 1.0), (200, 3.0), (400, 4.0))          # (bytes, seconds): easy hand arithmetic
BIG = scaled_cost_model(A100_LLAMA2_7B, LLAMA2_7B, LLAMA2_70B)


def test_the_gloo_facts_are_the_committed_measurement():
    record = json.loads((ROOT / "benchmarks" / "results" / "gloo_allreduce.json").read_text())
    for name in GLOO_SIZES:
        assert fact(f"gloo_allreduce_{name}").value == pytest.approx(
            record["median_us"][name], abs=0.05), f"gloo_allreduce_{name} differs from the JSON"


def test_gloo_allreduce_interpolates_its_measurements_by_hand():
    assert gloo_allreduce_time(50, table=TABLE) == 1.0            # below: the smallest's time
    assert gloo_allreduce_time(150, table=TABLE) == 2.0           # halfway between 1 and 3
    assert gloo_allreduce_time(300, table=TABLE) == 3.5
    assert gloo_allreduce_time(600, table=TABLE) == 5.0           # past: the last slope, 1/200
    assert gloo_allreduce_time(300, n=1, table=TABLE) == 0.0
    with pytest.raises(ValueError, match="between 2 processes"):
        gloo_allreduce_time(300, n=4, table=TABLE)


def test_a_measured_fixed_part_replaces_the_peak_bandwidth_assumption():
    shape = ModelShape("cpu", params=10, layers=3, hidden_size=25, kv_heads=1, head_dim=1,
                       dtype_bytes=4)
    base = CostModel(step_overhead=10.0, prefill_token=0.0)
    parts = tp_step_parts(base, shape, 2, None, 0, 2, 0,
                          allreduce=lambda b, n, link: gloo_allreduce_time(b, n, table=TABLE),
                          fixed=4.0)
    # 2 rows x 25 x 4 bytes = 200 bytes: 3 s per all-reduce, 2 per layer, 3 layers
    assert parts == {"fixed": 4.0, "weights": 3.0, "compute": 0.0, "kv read": 0.0,
                     "all-reduce": 18.0}
    with pytest.raises(ValueError, match="not this model's cost model"):
        tp_step_parts(base, shape, 2, None, 0, 2, 0, fixed=11.0)


def test_ranks_on_one_machine_split_nothing_but_add_their_all_reduces():
    shape = ModelShape("cpu", params=10, layers=3, hidden_size=25, kv_heads=1, head_dim=1,
                       dtype_bytes=4)
    base = CostModel(step_overhead=10.0, prefill_token=0.5, decode_seq=0.25, context_token=0.125)
    gloo = lambda b, n, link: gloo_allreduce_time(b, n, table=TABLE)
    split = tp_step_parts(base, shape, 2, None, 4, 2, 8, allreduce=gloo, fixed=4.0)
    shared = tp_step_parts(base, shape, 2, None, 4, 2, 8, allreduce=gloo, fixed=4.0,
                           one_machine=True)
    # two halves of one machine: the base's own terms stay whole, the all-reduces are the same
    assert shared == {"fixed": 4.0, "weights": 6.0, "compute": 2.5, "kv read": 1.0,
                      "all-reduce": split["all-reduce"]}
    assert split["weights"] == 3.0 and split["compute"] == 1.25 and split["kv read"] == 0.5


def test_plans_that_do_not_fit_their_kv_are_refused():
    holds = kv_tokens(LLAMA2_70B, 2)
    assert holds == 18_448                                  # 1,153 blocks of 16 tokens
    tp_plan(BIG, LLAMA2_70B, 2, NVLINK, holds // 1024, 1024)
    for price in (lambda: tp_plan(BIG, LLAMA2_70B, 2, NVLINK, holds // 1024 + 1, 1024),
                  lambda: pp_plan(BIG, LLAMA2_70B, 2, NVLINK, 32, 1024, 2)):
        with pytest.raises(ValueError, match="tokens of KV"):
            price()
    with pytest.raises(ValueError, match="equal micro-batches"):
        pp_plan(BIG, LLAMA2_70B, 2, NVLINK, 17, 1024, 2)


def test_pp_by_hand_and_its_bubble():
    rows, context = 8, 1024
    handoff = transfer_time(8 * 8192 * 2, NVLINK)
    stage = lambda r: BIG.step_time(0, r, r * context) / 2
    one = pp_plan(BIG, LLAMA2_70B, 2, NVLINK, rows, context, 1)
    two = pp_plan(BIG, LLAMA2_70B, 2, NVLINK, rows, context, 2)
    assert one.tpot == pytest.approx(2 * (stage(8) + handoff))       # the bubble: p steps
    assert two.tpot == pytest.approx(2 * (stage(4) + transfer_time(4 * 8192 * 2, NVLINK)))
    assert one.tokens_per_gpu == pytest.approx(rows / one.tpot / 2)
    # a stage of TP 8 x PP 2 is half of a TP 8 group's step, all-reduces included
    mixed = pp_plan(BIG, LLAMA2_70B, 2, INFINIBAND, rows, context, 2, tp=8, tp_link=NVLINK)
    group = tp_cost_model(BIG, LLAMA2_70B, 8, NVLINK)
    assert mixed.gpus == 16
    assert mixed.tpot == pytest.approx(2 * (group.step_time(0, 4, 4 * context) / 2
                                            + transfer_time(4 * 8192 * 2, INFINIBAND)))


def test_tp_across_nodes_loses_to_pp_across_them_at_equal_load():
    requests = kv_tokens(LLAMA2_70B, 8) // 1024 // 2 * 2
    across = tp_plan(BIG, LLAMA2_70B, 16, INFINIBAND, requests, 1024)
    split = pp_plan(BIG, LLAMA2_70B, 2, INFINIBAND, requests, 1024, 2, tp=8, tp_link=NVLINK)
    assert split.tpot < across.tpot

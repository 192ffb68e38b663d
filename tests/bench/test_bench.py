"""The offline benchmarks run end to end on a tiny model and write what the README promises.

Speed is never asserted here (that is what the benchmarks themselves are for); what is checked
is that every system serves every request, the results carry the machine, the greedy-agreement
check catches a disagreement, and the memory and overhead measurements obey their invariants.
"""

from __future__ import annotations

import json

import pytest
import torch

from minicb.bench import main as bench_main
from minicb.bench.agreement import agreement, compare_outputs
from minicb.bench.common import fit_to_context, load_workload
from minicb.bench.machine import machine_info
from minicb.sim.workload import get_workload
from minicb.viz.benchmarks import describe


def _check_machine(payload: dict) -> None:
    machine = payload["machine"]
    assert machine["cpu_model"] and machine["cpu_cores"] >= 1
    assert machine["versions"]["torch"] and machine["versions"]["transformers"] and machine["date"]
    assert f"{machine['cpu_cores']}-core" in describe(machine)


@pytest.fixture(scope="module")
def offline(tiny_llama, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("offline")
    code = bench_main(["offline", "--model", tiny_llama, "--workload", "seed-example",
                       "--max-num-seqs", "4", "--threads", "1", "--no-progress", "--out-dir",
                       str(out)])
    assert code == 0
    assert (out / "offline-seed-example.png").stat().st_size > 0
    return json.loads((out / "offline-seed-example.json").read_text())


def test_offline_serves_every_request_on_every_system(offline):
    workload = get_workload("seed-example")
    systems = {s["system"]: s for s in offline["systems"]}
    assert set(systems) == {"hf-generate", "hf-static", "hf-generate-batch", "naive", "static",
                            "continuous-contiguous", "continuous-paged"}
    for row in systems.values():
        assert row["requests"] == len(workload)
        assert row["output_tokens"] == sum(workload.output_lens)
        assert row["output_throughput"] > 0 and row["cpu_seconds"] > 0
        assert row["ttft_p50_s"] <= row["ttft_p95_s"]
        assert row["peak_memory_mb"] >= 0
    assert min(r["ratio_to_slowest"] for r in systems.values()) == pytest.approx(1.0)
    # the static schedulers run each batch to its longest member: 4/4/10/10 then 4/4 on four slots
    assert systems["static"]["settings"]["steps"] == 10 + 4
    assert systems["continuous-paged"]["settings"]["steps"] == 10
    assert systems["hf-static"]["settings"]["decode_rows_computed"] == 4 * 10 + 2 * 4
    assert {t["baseline"] for t in offline["targets"]} == {"hf-generate", "hf-generate-batch",
                                                           "static"}
    _check_machine(offline)


def test_offline_greedy_outputs_agree(offline):
    for row in offline["systems"]:
        assert row["agreement"]["reference"] == "hf-generate"
        assert row["agreement"]["requests_differing"] == 0, (
            row["system"], row["agreement"]["mismatches"])


def test_agreement_detects_a_corrupted_output(tiny_llama):
    from transformers import AutoModelForCausalLM

    from minicb.bench.peers import hf_one_at_a_time

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    prompts = get_workload("seed-example").prompt_token_ids(512)[:2]
    reference = hf_one_at_a_time(model, prompts, [5, 5], pad_token_id=0).outputs
    corrupted = [list(reference[0]), list(reference[1])]
    corrupted[1][3] = (corrupted[1][3] + 1) % 512
    report = agreement(reference, corrupted, prompts, lambda: model)
    assert report["requests_differing"] == 1
    (mismatch,) = report["mismatches"]
    assert (mismatch["request"], mismatch["position"]) == (1, 3)
    assert (mismatch["expected"], mismatch["got"]) == (reference[1][3], corrupted[1][3])
    # the reference is greedy, so its token has the larger logit; the margin is what a near-tie
    # would show
    assert mismatch["margin"] > 0 and mismatch["margin"] == pytest.approx(
        mismatch["expected_logit"] - mismatch["got_logit"])


def test_compare_outputs_reports_the_first_difference_and_early_ends():
    assert compare_outputs([[1, 2, 3]], [[1, 2, 3]]) == []
    (changed,) = compare_outputs([[1, 2, 3]], [[1, 9, 3]])
    assert (changed.position, changed.expected, changed.got) == (1, 2, 9)
    (short,) = compare_outputs([[1, 2, 3]], [[1, 2]])
    assert (short.position, short.expected, short.got) == (2, 3, None)
    with pytest.raises(ValueError, match="every system must answer"):
        compare_outputs([[1]], [])


def test_memory_waste_and_occupancy(tmp_path):
    assert bench_main(["memory", "--num-prompts", "48", "--num-kv-blocks", "160", "--max-num-seqs",
                       "64", "--out-dir", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "memory-long-tail.json").read_text())
    assert (tmp_path / "memory-long-tail.png").exists()
    runs = {r["kv_cache"]: r for r in payload["runs"]}
    block_size = payload["block_size"]
    reservation = -(-payload["max_model_len"] // block_size) * block_size
    for name, run in runs.items():
        for reserved, tokens in zip(run["reserved_slots"], run["kv_tokens"]):
            assert 0 <= tokens <= reserved <= payload["kv_slots"]
            if name == "contiguous":
                assert reserved % reservation == 0        # whole max_model_len runs only
        assert run["max_running"] >= run["mean_running"] > 0
    # a paged request leaves at most one partly filled block empty
    paged = runs["paged"]
    for running, reserved, tokens in zip(paged["running"], paged["reserved_slots"],
                                         paged["kv_tokens"]):
        assert reserved - tokens <= running * (block_size - 1)
    assert paged["waste_fraction"] < runs["contiguous"]["waste_fraction"]
    assert paged["mean_running"] > runs["contiguous"]["mean_running"]
    _check_machine(payload)


def test_overhead_measures_the_hosts_part_of_a_decode_step(tiny_llama, tmp_path):
    assert bench_main(["overhead", "--model", tiny_llama, "--batch-sizes", "1", "4", "--repeats",
                       "2", "--steps", "3", "--context", "8", "--out-dir", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "overhead.json").read_text())
    assert (tmp_path / "overhead.png").exists()
    assert sorted(p["batch"] for p in payload["points"]) == [1, 1, 4, 4]
    for point in payload["points"]:
        assert 0 < point["forward_us"] < point["step_us"]
        assert point["host_us"] > 0 and len(point["load_average"]) == 3
        assert set(point["phases_mean_us"]) == {"schedule", "prepare", "forward", "sample",
                                                "update", "rest"}
    summary = {row["batch"]: row for row in payload["summary"]}
    assert summary[1]["target_us"] == 60.0 and summary[4]["target_us"] is None
    assert summary[1]["host_us_min"] <= summary[1]["host_us_median"] <= summary[1]["host_us_max"]
    _check_machine(payload)


@pytest.mark.slow
def test_overhead_baseline_runs_the_commits_own_benchmark_alternated(tiny_llama, tmp_path):
    """--baseline COMMIT: each repeat runs this tree's benchmark and the commit's own (git
    archive), each in a fresh process, the first of the two alternating; both in the record."""
    import subprocess

    from minicb.bench import overhead

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=overhead.ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert bench_main(["overhead", "--model", tiny_llama, "--batch-sizes", "1", "2", "--repeats",
                       "2", "--steps", "2", "--context", "8", "--baseline", head,
                       "--out-dir", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "overhead.json").read_text())
    baseline = payload["baseline"]
    assert baseline["commit"] == head and baseline["clock"]
    for points in (payload["points"], baseline["points"]):
        assert [(p["repeat"], p["batch"]) for p in points] == [(0, 1), (0, 2), (1, 2), (1, 1)]
        assert all(0 < p["forward_us"] < p["step_us"] for p in points)
    assert [r["batch"] for r in baseline["summary"]] == [1, 2]


def test_overhead_baseline_names_a_commit_it_cannot_find(tmp_path):
    from minicb.bench.overhead import unpack

    with pytest.raises(ValueError, match="--baseline no-such-commit: git archive failed"):
        unpack("no-such-commit", tmp_path)


def test_workload_helpers():
    assert len(load_workload("long-tail", 10)) == 10
    assert len(load_workload("seed-example", 3)) == 3
    with pytest.raises(ValueError, match="num-prompts"):
        load_workload("chat", 0)
    workload, factor = fit_to_context(get_workload("long-tail", n=64), 512)
    assert factor < 1 and max(r.prompt_len + r.output_len for r in workload.requests) <= 512
    same, one = fit_to_context(get_workload("seed-example"), 512)
    assert one == 1.0 and same.prompt_lens == get_workload("seed-example").prompt_lens


def test_peak_memory_sees_an_allocation():
    """In a process of its own: in a test worker, memory other tests' threads free while the block
    runs would shrink the resident set under the probe."""
    import subprocess
    import sys

    code = ("import torch; from minicb.bench.common import PeakMemory\n"
            "with PeakMemory('cpu') as probe:\n"
            "    block = torch.ones(16 * 2**20)      # 64 MiB, written, so resident\n"
            "print(float(block.sum()) > 0, probe.peak_bytes)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    written, peak_bytes = done.stdout.split()
    assert written == "True" and int(peak_bytes) >= 48 * 2**20, done.stdout


def test_machine_info_names_the_machine():
    info = machine_info()
    assert info["cpu_cores"] >= 1 and info["cpu_model"] and info["versions"]["minicb"]
    assert isinstance(info["gpus"], list)

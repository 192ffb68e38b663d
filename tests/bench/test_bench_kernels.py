"""The kernel benchmark's code path, through its dry run (tiny grid, Triton interpreter on CPU)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton defines the kernels

import json  # noqa: E402

from minicb.bench import kernels as bench_kernels  # noqa: E402


def test_dry_run_writes_results(tmp_path, capsys):
    assert bench_kernels.main(["--dry-run", "--out-dir", str(tmp_path)]) == 0
    [json_path] = tmp_path.glob("kernels-*.json")
    assert json_path.name.endswith("-dry-run.json")
    assert json_path.with_suffix(".png").stat().st_size > 0
    results = json.loads(json_path.read_text())
    for field in ("device", "device_slug", "date", "torch_version", "triton_version", "dtype",
                  "num_q_heads", "num_kv_heads", "head_dim", "block_size", "copy_bandwidth_gbps",
                  "points"):
        assert field in results, field
    assert results["dry_run"] is True and results["copy_bandwidth_gbps"] > 0
    grid = bench_kernels.DRY_RUN_GRID
    assert [(p["batch"], p["context"]) for p in results["points"]] == [
        (b, c) for b in grid["batch_sizes"] for c in grid["contexts"]
    ]
    for point in results["points"]:
        assert point["skipped"] is None
        assert point["max_abs_diff"] < 1e-4  # the kernel agrees with gather + SDPA
        for method in bench_kernels.METHODS:
            timing = point["methods"][method]
            assert timing["time_ms"] > 0 and timing["bandwidth_gbps"] > 0
    assert "GB/s" in capsys.readouterr().out


def test_without_cuda_it_explains_and_fails(capsys):
    if torch.cuda.is_available():
        return
    assert bench_kernels.main([]) == 2
    assert "needs CUDA" in capsys.readouterr().err

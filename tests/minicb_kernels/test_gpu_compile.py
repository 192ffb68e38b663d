"""The Triton kernels compiled ahead of time for seven GPUs, on a machine without one.

The interpreter (how the other kernel tests run here) forgives what a GPU does not: shared memory
past the per-block limit, a dtype the GPU lacks. These tests compile a lean subset of the
engine's launches (LEAN: every kernel, each on some of the seven targets; the full matrix is
``python -m minicb bench gpu-compile``, committed as benchmarks/results/gpu-targets.json),
refuse a planted tile that a T4 cannot hold, and hold the tile choice, the dtype fallback and
the committed table to what the code does now.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402
import warnings  # noqa: E402
from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402
from minicb.kernels import aot, paged_attention, paged_attention_reference  # noqa: E402
from minicb.kernels import launches as launch_matrix  # noqa: E402
from minicb.kernels.paged_attention import attention_launch  # noqa: E402
from minicb.kernels.targets import (  # noqa: E402
    TARGETS,
    DoesNotFit,
    check_fits,
    occupancy,
    resolve_dtype,
)

from minicb.bench import gpu_compile  # noqa: E402

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
T4 = TARGETS["sm_75"]


# What the default test compiles on each target: every kernel on at least one NVIDIA and one
# AMD part, the attention's largest tiles wherever the limits differ (sm_89 has sm_86's, so it
# compiles only its FP8 path), the split decode and the FP8 cache on the 64 KiB parts (a T4 has
# no FP8 instructions: its cache is read by integer arithmetic). About as many compiles as
# before the FP8 cache and the quantized products, which the full matrix
# (python -m minicb bench gpu-compile) compiles everywhere.
LEAN = {
    "sm_75": ("attention float32", "attention fp8", "split", "merge", "write", "int8_matmul",
              "fused_moe"),
    "sm_80": ("attention float32", "attention 2-byte", "int4_matmul", "write fp8"),
    "sm_86": ("attention float32", "attention 2-byte"),
    "sm_89": ("attention fp8",),
    "sm_90": ("attention float32", "attention 2-byte", "int8_matmul", "fused_moe"),
    "gfx90a": ("attention float32", "attention 2-byte", "merge", "int4_matmul"),
    "gfx942": ("attention float32", "attention fp8", "split", "write fp8", "int8_matmul",
               "fused_moe"),
}


def _pick(launches: list, name: str):
    def kv(la) -> str:
        return la.params.get("kv", "")

    two_byte = [la for la in launches if la.dtype != "float32"]
    largest = {"attention float32": [la for la in launches if la.kernel == "attention"
                                     and la.dtype == "float32" and kv(la) != "fp8"],
               "attention 2-byte": [la for la in two_byte if la.kernel == "attention"
                                    and kv(la) != "fp8"],
               "attention fp8": [la for la in two_byte if la.kernel == "attention"
                                 and kv(la) == "fp8"],
               "int8_matmul": [la for la in two_byte if la.kernel == "int8_matmul"],
               "int4_matmul": [la for la in two_byte if la.kernel == "int4_matmul"]}
    if name in largest:
        return max(largest[name], key=lambda la: la.shared_estimate)
    if name == "split":
        return next(la for la in launches if la.kernel == "attention" and la.dtype == "float32"
                    and la.params["split"] and kv(la) != "fp8")
    if name == "merge":
        return max((la for la in launches if la.kernel == "merge"),
                   key=lambda la: la.params["splits"])
    if name.startswith("write"):
        return next(la for la in two_byte if la.kernel == "write"
                    and (kv(la) == "fp8") == name.endswith("fp8"))
    return next(la for la in two_byte if la.kernel == name)


def lean_subset() -> list:
    """The launches of LEAN, taken from each target's quick list."""
    picked = []
    for key, names in LEAN.items():
        quick = launch_matrix.launches_for(TARGETS[key], quick=True)
        picked += [_pick(quick, name) for name in names]
    return picked


@pytest.mark.slow   # compiles for seven GPUs: make test runs it, make test-fast does not
def test_every_target_compiles_and_fits():
    """A kernel change that breaks a GPU target (does not compile, or needs more shared memory
    than the device has, or more than the tile choice expects) fails here."""
    launches = lean_subset()
    assert {la.kernel for la in launches} == set(launch_matrix.KERNELS)
    results = aot.compile_all(launches, jobs=2)
    rows = [aot.row_of(r) for r in results]
    assert len(rows) == len(launches)
    assert {row["target"] for row in rows} == set(TARGETS)
    assert aot.problems(rows) == []
    # the numbers are read from the compiler, not made up: a real kernel uses shared memory
    # for tl.dot and has registers on every target
    for row in rows:
        if row["kernel"] == "attention":
            assert row["shared"] > 0 and row["registers"] > 0, row


@pytest.mark.slow
def test_a_tile_too_big_for_a_t4_is_refused_naming_the_device_and_limit():
    """A planted configuration: 128 keys per step of float32 with head_dim 128 needs more than
    a T4's 64 KiB of shared memory per block."""
    good = next(la for la in launch_matrix.launches_for(T4) if la.kernel == "attention"
                and la.dtype == "float32" and la.params["head_dim"] == 128
                and la.params["tile"] == "decode" and not la.params["split"])
    planted = replace(good, constexprs={**good.constexprs, "BLOCK_N": 128}, shared_estimate=None)
    result, = aot.compile_all([planted], jobs=1)
    assert result.compiled, result.error
    assert result.shared > T4.shared_per_block
    row = aot.row_of(result)
    assert not row["fits"]
    # the compile check itself refuses it, naming the device, the limit and what it needs
    defect, = aot.problems([row])
    assert "T4 (sm_75) allows 65,536 (shared memory per block)" in defect, defect
    assert f"needs {result.shared:,} bytes" in defect, defect
    with pytest.raises(DoesNotFit, match=r"T4 \(sm_75\) allows 65,536 \(shared memory per block\)"):
        check_fits(T4, "paged attention", result.shared, result.registers)


def test_tile_choice_stays_within_every_device():
    """Every launch the engine can choose, on every target, is estimated within the device's
    shared memory; and the smaller parts really get smaller tiles than an H100."""
    for limits in TARGETS.values():
        for launch in launch_matrix.launches_for(limits):
            if launch.shared_estimate is not None:
                assert launch.shared_estimate <= limits.shared_per_block, (limits.key, launch)
    # head_dim 256 in a 2-byte dtype: 64 keys per step fit an H100's 227 KiB, not a T4's 64 KiB
    t4 = attention_launch(torch.float16, 256, 4, 128, 16, False, T4)
    h100 = attention_launch(torch.bfloat16, 256, 4, 128, 16, False, TARGETS["sm_90"])
    assert t4["shared_estimate"] <= T4.shared_per_block < h100["shared_estimate"]
    assert t4["BLOCK_N"] < h100["BLOCK_N"]
    # head_dim 128 in float16, pipelined in two stages: a T4 takes half the keys per step
    t4 = attention_launch(torch.float16, 128, 4, 128, 16, False, T4)
    a100 = attention_launch(torch.float16, 128, 4, 128, 16, False, TARGETS["sm_80"])
    assert t4["shared_estimate"] <= T4.shared_per_block < a100["shared_estimate"]
    assert t4["BLOCK_N"] < a100["BLOCK_N"]


def test_the_estimate_counts_the_accumulator_tensor_cores_pass_through_shared_memory():
    """float16 with head size 256 and 64 query rows: Triton allocated 98,304 bytes on sm_75 (the
    float32 accumulator converted beside the query tile), where the tiles alone come to 54,272.
    The estimate must cover it, so the T4 gets a smaller tile that fits."""
    from minicb.kernels.paged_attention import shared_estimate

    assert shared_estimate(64, 32, 256, 2, 1) >= 98_304
    assert shared_estimate(64, 32, 256, 2, 1, nvidia=False) < 98_304   # AMD took 32,768
    t4 = attention_launch(torch.float16, 256, 8, 128, 16, False, T4)
    assert t4["BLOCK_M"] * t4["GROUP_PAD"] < 64
    assert t4["shared_estimate"] <= T4.shared_per_block


def test_head_sizes_below_64_get_the_tiles_of_64():
    """Why the matrix compiles 64 for every smaller head size: the same tiles, over a narrower
    DIM_PAD, so no more shared memory or registers than 64's."""
    for limits in TARGETS.values():
        for dtype in (torch.float32, torch.float16):
            for group in launch_matrix.GROUPS:
                for rows in launch_matrix.QUERY_LENGTHS:
                    at_64 = attention_launch(dtype, 64, group, rows, 16, False, limits)
                    for head_dim in (16, 32, 48):
                        small = attention_launch(dtype, head_dim, group, rows, 16, False, limits)
                        assert small["DIM_PAD"] <= at_64["DIM_PAD"]
                        for name in ("BLOCK_M", "BLOCK_N", "num_stages", "num_warps"):
                            assert small[name] == at_64[name], (limits.key, dtype, head_dim, name)


def test_a_head_size_no_tile_can_hold_is_refused_with_the_device_named():
    """Past 256 (the largest head size the matrix compiles), a 64 KiB part holds no float32
    tile, whatever the group; an H100 still does."""
    for head_dim in (512, 1024):
        with pytest.raises(DoesNotFit, match=r"T4 \(sm_75\) allows 65,536"):
            attention_launch(torch.float32, head_dim, 1, 128, 16, False, T4)
    attention_launch(torch.float32, 512, 1, 128, 16, False, TARGETS["sm_90"])


def test_bfloat16_on_a_t4_runs_as_float16_and_says_so():
    with pytest.warns(UserWarning, match=r"compute capability 7\.5.*float16 instead"):
        assert resolve_dtype("bfloat16", "cuda", capability=(7, 5)) == "float16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_dtype("bfloat16", "cuda", capability=(8, 0)) == "bfloat16"
        assert resolve_dtype("bfloat16", "cuda", capability=(9, 0)) == "bfloat16"
        assert resolve_dtype("float32", "cuda", capability=(7, 5)) == "float32"
        assert resolve_dtype("bfloat16", "cpu") == "bfloat16"


def test_occupancy_follows_the_tightest_resource():
    # 64 KiB per block on a T4 (64 KiB per SM): one block; 100 registers x 128 threads: 5
    fat = occupancy(T4, 60 * 1024, 100, 4)
    assert (fat["blocks_per_sm"], fat["limited_by"]) == (1, "shared memory")
    # 255 registers x 128 threads = 32,768 (rounded per warp) of 65,536: two blocks
    regs = occupancy(T4, 1024, 255, 4)
    assert (regs["blocks_per_sm"], regs["limited_by"]) == (2, "registers")
    assert regs["occupancy"] == pytest.approx(2 * 128 / 1024)


@pytest.mark.skipif(not INTERPRETING, reason="compares through the Triton interpreter on a CPU")
def test_the_t4_tiles_compute_the_same_attention():
    """The smaller tiles a T4 gets (16 keys per step for float32 with head_dim 256) are still
    exact: the interpreter runs them against the torch reference."""
    torch.manual_seed(0)
    head_dim, group, num_kv_heads, block_size = 256, 2, 1, 16
    q_lens, seq_lens = [20, 1], [45, 33]
    t4 = attention_launch(torch.float32, head_dim, group, max(q_lens), block_size, False, T4)
    assert t4["BLOCK_N"] < 64
    blocks = sum(-(-n // block_size) for n in seq_lens)
    k_cache = torch.randn(blocks, block_size, num_kv_heads, head_dim)
    v_cache = torch.randn_like(k_cache)
    order = torch.randperm(blocks).int()
    tables, start = [], 0
    for n in seq_lens:
        need = -(-n // block_size)
        tables.append(order[start:start + need].tolist() + [0] * (5 - need))
        start += need
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim)
    args = (q, k_cache, v_cache, torch.tensor([0, q_lens[0], sum(q_lens)]).int(),
            torch.tensor(seq_lens).int(), torch.tensor(tables).int(), head_dim ** -0.5,
            max(q_lens), max(seq_lens))
    got = paged_attention(*args, limits=T4)
    torch.testing.assert_close(got, paged_attention_reference(*args), atol=1e-4, rtol=1e-4)


def test_the_committed_table_is_the_current_code_and_clean():
    """The committed matrix covers exactly the launches the code chooses now (in its scope: all
    of them, or the corners of every dimension), on all seven targets, with no defect: a tile
    change without re-running the benchmark fails here."""
    data = json.loads(gpu_compile.RESULTS.read_text())
    rows = data["rows"]
    assert not data["quick"]
    assert aot.problems(rows) == []
    committed = {aot.identity(r) for r in rows}
    now = {aot.launch_identity(la) for limits in TARGETS.values()
           for la in launch_matrix.launches_for(limits, corners=data["corners"])}
    assert committed == now, ("benchmarks/results/gpu-targets.json is stale: run python -m "
                              "minicb bench gpu-compile (--add-missing for a new kernel)")
    # the quantized products and the FP8 cache are in it, on every target
    for kernel in ("int8_matmul", "int4_matmul"):
        assert {r["target"] for r in rows if r["kernel"] == kernel} == set(TARGETS), kernel
    assert {r["target"] for r in rows if r.get("kv") == "fp8"} == set(TARGETS)
    table = launch_matrix.table_markdown(gpu_compile.RESULTS)
    for limits in TARGETS.values():
        assert f"| {limits.name} | {limits.key} |" in table

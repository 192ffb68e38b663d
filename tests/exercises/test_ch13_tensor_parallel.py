"""Chapter 13: the row-parallel linear, checked by its worked examples, then graded in two real
processes joined by gloo against the unsplit layer (with a bias and without); in the same two
processes, the shared-memory all-reduce against the exact sum."""

from __future__ import annotations

import json
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from adapter import chapter, run_docstring_examples

ch13 = chapter("13")


def test_ch13_worked_examples():
    run_docstring_examples(ch13)


SHM_CALLS = 40


def _shared_memory_error(rank: int, slots: torch.Tensor, flags: torch.Tensor) -> float:
    """The largest difference from the exact sum over SHM_CALLS shared-memory all-reduces of
    fresh tensors. Rank 1 arrives late, so rank 0's first call must wait for its slot."""
    if rank == 1:
        time.sleep(0.3)
    worst = 0.0
    for call in range(1, SHM_CALLS + 1):
        mine, *both = (torch.randn(48, generator=torch.Generator().manual_seed(100 * call + r))
                       for r in (rank, 0, 1))
        ch13.shared_memory_all_reduce(mine, rank, slots, flags, call)
        worst = max(worst, (mine - (both[0] + both[1])).abs().max().item())
    return worst


def _rank(rank: int, port: int, out: str, slots: torch.Tensor, flags: torch.Tensor) -> None:
    """One rank: the unsplit layer and the split one from the same seed, both biases, then the
    shared-memory all-reduce. What it raises is written down for the test to raise again (a
    stub's NotImplementedError too)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.manual_seed(0)
    x, weight, bias = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    report: dict = {}
    try:
        start, stop = ch13.feature_range(8, rank, 2)
        for name, b in (("bias", bias), ("no bias", None)):
            y = ch13.row_parallel_linear(x[:, start:stop], ch13.shard_columns(weight, rank, 2), b,
                                         dist.all_reduce)
            report[name] = (y - F.linear(x, weight, b)).abs().max().item()
        report["shared memory"] = _shared_memory_error(rank, slots, flags)
    except Exception as error:       # reported by the test, whatever it is
        report = {"raised": type(error).__name__, "message": str(error)}
    with open(f"{out}.{rank}", "w") as file:
        json.dump(report, file)


def test_ch13_two_processes_equal_the_unsplit_linear(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # On Linux the ranks are forked: they start with torch and the graded file already imported
    # (a spawned rank imports torch again, about 2 s of CPU each). Elsewhere they are spawned, as
    # the chapter starts its workers: macOS does not allow fork in a process that uses its
    # system frameworks.
    context = mp.get_context("fork" if sys.platform == "linux" else "spawn")
    slots, flags = torch.zeros(2, 2, 48).share_memory_(), torch.zeros(2, dtype=torch.int64)
    flags.share_memory_()
    ranks = [context.Process(target=_rank,
                             args=(rank, port, str(tmp_path / "out"), slots, flags))
             for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=50)
        if process.is_alive():
            process.kill()
    for rank in range(2):
        assert (tmp_path / f"out.{rank}").exists(), (
            f"rank {rank} did not finish in 50 s: does a wait never end (a flag never raised, or "
            "compared with == where a rank may be a call ahead)?")
    reports = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(2)]
    for report in reports:
        if report.get("raised") == "NotImplementedError":
            raise NotImplementedError(report["message"])
    for rank, report in enumerate(reports):
        assert "raised" not in report, f"rank {rank} raised {report['raised']}: {report['message']}"
        for case, difference in report.items():
            assert difference < 1e-5, (f"rank {rank} ({case}): off from the unsplit layer by "
                                       f"{difference:.3g}")

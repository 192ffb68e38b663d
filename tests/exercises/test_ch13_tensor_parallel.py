"""Chapter 13: the row-parallel linear, checked by its worked examples, then graded in two real
processes joined by gloo against the unsplit layer (with a bias and without)."""

from __future__ import annotations

import json
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from adapter import chapter, run_docstring_examples

ch13 = chapter("13")


def test_ch13_worked_examples():
    run_docstring_examples(ch13)


def _rank(rank: int, port: int, out: str) -> None:
    """One rank: the unsplit layer and the split one from the same seed, both biases. What it
    raises is written down for the test to raise again (a stub's NotImplementedError too)."""
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
    except Exception as error:       # reported by the test, whatever it is
        report = {"raised": type(error).__name__, "message": str(error)}
    with open(f"{out}.{rank}", "w") as file:
        json.dump(report, file)


def test_ch13_two_processes_equal_the_unsplit_linear(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    ranks = [context.Process(target=_rank, args=(rank, port, str(tmp_path / "out")))
             for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=50)
        if process.is_alive():
            process.kill()
    reports = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(2)]
    for report in reports:
        if report.get("raised") == "NotImplementedError":
            raise NotImplementedError(report["message"])
    for rank, report in enumerate(reports):
        assert "raised" not in report, f"rank {rank} raised {report['raised']}: {report['message']}"
        for case, difference in report.items():
            assert difference < 1e-5, (f"rank {rank} ({case}): off from the unsplit layer by "
                                       f"{difference:.3g}")

"""`python -m minicb bench neighbour`: each system quiet, then beside a busy neighbour.

    python -m minicb bench neighbour                         # chat workload, default model
    python -m minicb bench neighbour --workload long-tail --num-prompts 128 --repeats 3
    python -m minicb bench neighbour --random-model llama-100m --num-prompts 32

A server rarely has the machine to itself. This benchmark runs every system twice in a row on
the same requests: once on a quiet machine, once while a busy loop it starts itself (a separate
process pinned to the last core, stopped when the run ends and never allowed to outlive a
deadline) keeps one core busy. It reports each system's throughput both ways and the slowdown,
1 - loaded / quiet, over several alternating repetitions (pooled: all tokens over all seconds).
`continuous-paged` uses minicb's default thread policy (the cores other programs leave free,
minicb/runner/threads.py); `continuous-paged-all-cores` pins every core, as torch does by
default, to show what the policy saves. The load average is recorded beside every run.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from minicb.bench.common import display_path, workload_facts
from minicb.bench.harness import (
    add_flags,
    alternate,
    announce,
    bench_parser,
    format_table,
    load_average,
    turn_order,
    write_results,
)
from minicb.bench.offline import ENGINE_FLAGS, PEERS, SYSTEMS, load_hf_model, prepare, run_system
from minicb.config import EngineConfig
from minicb.metrics import summarize
from minicb.runner.threads import usable_cores

VARIANTS = {"continuous-paged-all-cores": "continuous-paged"}
ALL_SYSTEMS = [*SYSTEMS, *VARIANTS, *PEERS]
OURS = ("naive", "static", "continuous-contiguous", "continuous-paged")
# the busy loop: spins until told to stop, until its deadline, or until the benchmark that
# started it is gone (its parent changes), whichever comes first: it can never outlive the run
BUSY_LOOP = ("import os, sys, time\nparent = os.getppid()\nend = time.time() + float(sys.argv[1])\n"
             "while time.time() < end and os.getppid() == parent:\n    pass\n")


class BusyNeighbour:
    """A process that keeps one core busy while the `with` block runs (at most `deadline` s)."""

    def __init__(self, core: int | None = None, deadline: float = 900.0):
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self.core = core if core is not None else (cores[-1] if cores else None)
        self.deadline = deadline
        self.process: subprocess.Popen | None = None

    def _pin(self) -> None:
        if self.core is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {self.core})

    def __enter__(self) -> BusyNeighbour:
        self.process = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(self.deadline)],
                                        preexec_fn=self._pin)
        time.sleep(0.3)        # let it start spinning before the measurement does
        return self

    def cpu_seconds(self) -> float:
        """CPU time the neighbour has used so far (Linux), else 0."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, AttributeError):
            return 0.0

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser("neighbour", __doc__)
    add_flags(p, "model", "random_model", "num_prompts", "repeats", "seed", "out_dir",
              workload="chat")
    p.add_argument("--systems", nargs="+", choices=ALL_SYSTEMS,
                   default=["hf-generate", "hf-generate-batch", "static", "continuous-paged",
                            "continuous-paged-all-cores"])
    p.add_argument("--hf-page-size", type=int, default=256)
    p.add_argument("--hf-max-batch-tokens", type=int, default=512)
    EngineConfig.add_cli_args(p, only=ENGINE_FLAGS,
                              defaults={"max_num_seqs": 64, "max_num_batched_tokens": None})
    return p.parse_args(argv)


def one_run(name: str, model_path: str, get_hf_model, args, prompts, output_lens,
            threads: int, loaded: bool) -> dict:
    torch.set_num_threads(threads)     # an earlier run's policy may have lowered it
    run_args = copy.copy(args)
    base = VARIANTS.get(name, name)
    if name in VARIANTS:
        run_args.cpu_threads = threads
    hf_model = get_hf_model() if base.startswith("hf-") else None
    load_before = load_average()[0]
    if loaded:
        with BusyNeighbour() as neighbour:
            run, _ = run_system(base, model_path, hf_model, run_args, prompts, output_lens, False)
            neighbour_cpu = neighbour.cpu_seconds()
    else:
        run, _ = run_system(base, model_path, hf_model, run_args, prompts, output_lens, False)
        neighbour_cpu = 0.0
    s = summarize(run.metrics)
    return {"system": name, "loaded": loaded, "output_tokens": s.output_tokens,
            "duration_s": s.duration, "output_throughput": s.output_throughput,
            "neighbour_cpu_s": neighbour_cpu, "load_before": load_before,
            "load_after": load_average()[0], "outputs": run.outputs}


def pooled(runs: list[dict], name: str, loaded: bool) -> float:
    mine = [r for r in runs if r["system"] == name and r["loaded"] == loaded]
    return sum(r["output_tokens"] for r in mine) / sum(r["duration_s"] for r in mine)


def summarize_runs(runs: list[dict], systems: list[str]) -> list[dict]:
    rows = []
    for name in systems:
        quiet, loaded = pooled(runs, name, False), pooled(runs, name, True)
        mine = [r for r in runs if r["system"] == name]
        rows.append({"system": name, "quiet_tok_s": quiet, "loaded_tok_s": loaded,
                     "slowdown": 1 - loaded / quiet, "repeats": len(mine) // 2,
                     "load_min": min(r["load_before"] for r in mine),
                     "load_max": max(r["load_after"] for r in mine),
                     "greedy_equal": all(r["outputs"] == mine[0]["outputs"] for r in mine)})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    if "vllm" in args.systems:
        from minicb.bench.vllm_peer import check_available

        check_available()
    threads = torch.get_num_threads()
    model_path, model_label, workload, scale, prompts = prepare(args)
    output_lens = workload.output_lens
    announce(f"{model_label}: {workload.description}; {len(workload)} requests; "
             f"{usable_cores()} cores, torch threads {threads}")
    get_hf_model = functools.cache(lambda: load_hf_model(model_path, args.device, args.dtype))
    runs = []
    for repeat, name in alternate(args.repeats, args.systems):
        for loaded in turn_order((False, True), repeat):   # quiet first in even repeats
            row = one_run(name, model_path, get_hf_model, args, prompts, output_lens, threads,
                          loaded)
            runs.append(row)
            print(f"  [{repeat + 1}/{args.repeats}] {name:<27} "
                  f"{'busy neighbour' if loaded else 'quiet':<14} "
                  f"{row['output_throughput']:8.1f} tok/s   load {row['load_before']:.2f}",
                  flush=True)
    torch.set_num_threads(threads)
    rows = summarize_runs(runs, args.systems)
    print(format_table(rows, [("system", "system", ""), ("quiet_tok_s", "quiet tok/s", ".1f"),
                              ("loaded_tok_s", "busy-neighbour tok/s", ".1f"),
                              ("slowdown", "slowdown", ".0%"),
                              ("greedy_equal", "same tokens", "")]))
    worst = max((r for r in rows if VARIANTS.get(r["system"], r["system"]) in OURS
                 and r["system"] not in VARIANTS), key=lambda r: r["slowdown"], default=None)
    if worst is not None:
        verdict = "met" if worst["slowdown"] <= 0.3 else "NOT met"
        print(f"largest slowdown of minicb's systems (default policy): {worst['slowdown']:.0%} "
              f"({worst['system']}; target <= 30%: {verdict})")
    for r in runs:
        r.pop("outputs")
    payload = {"benchmark": "neighbour",
               "model": {"label": model_label, "path": display_path(model_path),
                         "dtype": args.dtype, "device": args.device},
               "workload": workload_facts(workload, scale),
               "settings": {"max_num_seqs": args.max_num_seqs, "repeats": args.repeats,
                            "torch_threads": threads, "cores": usable_cores(),
                            "neighbour": "a Python busy loop pinned to the last core"},
               "systems": rows, "runs": runs}
    from minicb.viz.benchmarks import plot_neighbour

    stem = "-".join(["neighbour", workload.name]
                    + ([args.random_model] if args.random_model else []))
    json_path, png_path = write_results(args.out_dir, stem, payload, plot_neighbour)
    print(f"results: {json_path}, {png_path}")
    return 0

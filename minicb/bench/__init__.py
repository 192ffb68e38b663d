"""Benchmarks: `python -m minicb bench NAME [options]`, one module per benchmark.

Each writes its results (JSON with the machine recorded, and a PNG) under benchmarks/results/.
What they share lives in three modules: `harness` (how a benchmark runs and records itself: its
flags, the load, alternated repeats, the verdict, results, tables, server processes), `common`
(what it runs: random checkpoints, workloads, peak memory, kernel timers) and `machine` (what ran
it).
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one line for the usage message)
BENCHMARKS = {
    "offline": ("minicb.bench.offline",
                "one workload through transformers and minicb's schedulers, side by side"),
    "serve": ("minicb.serving.loadgen",
              "load-test any OpenAI-compatible server (minicb, vLLM, ...)"),
    "load-study": ("minicb.bench.load_study",
                   "sweep request rates against servers, one per scheduler"),
    "serve-peers": ("minicb.bench.serve_peers",
                    "naive, continuous and vLLM's server under one Poisson load, alternated"),
    "kernels": ("minicb.bench.kernels",
                "the attention kernels against the device's copy bandwidth"),
    "gpu-compile": ("minicb.bench.gpu_compile",
                    "every launch the engine can choose, compiled for seven GPUs, against "
                    "each one's limits"),
    "graphs": ("minicb.bench.graphs",
               "decode steps through CUDA graphs against eager steps and transformers (a GPU)"),
    "memory": ("minicb.bench.memory", "requests that fit one KV budget, contiguous against paged"),
    "overhead": ("minicb.bench.overhead",
                 "the host's part of a decode step (schedule, pack, sample, update)"),
    "timeline": ("minicb.bench.timeline",
                 "the device's busy share of wall time, synchronous steps against overlapped"),
    "policies": ("minicb.bench.policies", "admission policies and their latency trade-offs"),
    "prefix": ("minicb.bench.prefix", "prefix caching on shared-prefix traffic"),
    "calibrate": ("minicb.bench.calibrate",
                  "fit the cost model's four terms to this machine's real step times"),
    "step-cost": ("minicb.bench.step_cost",
                  "one decode step of 1, 16 and 64 rows on the wall clock and in CPU time"),
    "routing": ("minicb.bench.routing",
                "replicas behind vllm-router: scaling, routing policies, a replica killed"),
    "neighbour": ("minicb.bench.neighbour",
                  "each system quiet and beside a busy loop on one core: the slowdown"),
    "speculative": ("minicb.bench.speculative",
                    "speculative decoding against none: tokens/s and TPOT by batch size"),
    "disagg": ("minicb.bench.disagg",
               "prefill/decode disaggregation and tensor parallelism on a GPU's cost model"),
    "lm-eval": ("minicb.bench.lm_eval",
                "lm-evaluation-harness through minicb serve against its hf model, item by item"),
    "structured": ("minicb.bench.structured",
                   "the per-step cost of grammar masks and penalties, and tokens/s with them"),
    "moe": ("minicb.bench.moe",
            "experts touched and weights read per decode step against batch size; MoE vs dense"),
    "quant": ("minicb.bench.quant",
              "float32, bfloat16, int8 and int4 weights, and int8 KV, also under KV pressure"),
}


def usage() -> str:
    lines = ["usage: python -m minicb bench NAME [options]   (NAME --help for each)", ""]
    lines += [f"  {name:<11} {line}" for name, (_, line) in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """argv[0] names the benchmark, the rest are its options."""
    if not argv or argv[0] not in BENCHMARKS:
        print(usage(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import matplotlib

    matplotlib.use("Agg")   # the benchmarks draw into files: they run in terminals and CI
    module = importlib.import_module(BENCHMARKS[argv[0]][0])
    return module.main(argv[1:])

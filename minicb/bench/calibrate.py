"""`python -m minicb bench calibrate`: fit the cost model to this machine's real step times.

    python -m minicb bench calibrate                  # the default model, one torch thread
    python -m minicb bench calibrate --threads 2 --repeats 9 --clock wall

Runs the real engine through steps of known shapes (decode rows x context length x a prompt
joining), times each, and fits `step_overhead + prefill_token * P + decode_seq * R +
context_token * C` (minicb.sim.calibrate) twice: once for the decode-only steps the fused C decode
layer runs, once for every other step (`fit_piecewise`). Writes the samples, the fit and how
well it fits, with the machine, to benchmarks/results/calibration.json, and a picture of
measured against fitted.
The book's chapters 03 and 06 run their knob and goodput experiments under this fit (the
committed one, `minicb.sim.calibrate.REFERENCE_CPU`) and under a GPU's published numbers.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from minicb.bench.harness import add_flags, announce, bench_parser, write_results
from minicb.config import FUSED_DECODE_ROWS_PER_THREAD
from minicb.runner.threads import ceiling
from minicb.sim.calibrate import (
    A100_LLAMA2_7B,
    PIECEWISE_TERMS,
    fit_piecewise,
    fused_rows_of,
    measure_steps,
)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("calibrate", __doc__)
    add_flags(p, threads=dict(default=1,
                              help="torch CPU threads (default 1, as the notebooks run)"),
              repeats=dict(default=7, help="timed steps per shape (the least of them: on a shared "
                                           "machine other programs only ever add time)"))
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="time each step by the stepping thread's CPU time (default: on a shared "
                        "machine it leaves out the time spent waiting for a core; needs "
                        "--threads 1) or by the wall clock")
    p.add_argument("--max-fused-decode-rows", type=int, default=None,
                   help="the fused decode layer's row limit (default: the engine's default on "
                        "this machine, whatever --threads says)")
    add_flags(p, "out_dir")
    args = p.parse_args(argv or [])
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu times the stepping thread alone: it needs --threads 1 "
                "(or use --clock wall)")
    default_fused_rows = FUSED_DECODE_ROWS_PER_THREAD * ceiling()   # before the threads change
    torch.set_num_threads(args.threads)
    from minicb import LLM

    rows, contexts = (1, 2, 4, 8, 16, 32, 64), (16, 128, 384)
    # the fused layer takes the decode-only steps an engine with the default thread policy would
    # give it on this machine (its row limit follows the cores at start), timed on --threads
    fused_rows = args.max_fused_decode_rows or default_fused_rows
    llm = LLM(max_num_seqs=max(rows) + 1, max_num_batched_tokens=max(rows) * max(contexts),
              cpu_threads=args.threads, max_fused_decode_rows=fused_rows)
    result = fit_piecewise(measure_steps(llm, rows=rows, contexts=contexts, repeats=args.repeats,
                                         clock=time.thread_time if args.clock == "cpu"
                                         else time.perf_counter, reduce=min),
                           fused_rows_of(llm))
    announce(f"torch threads {args.threads}")
    for row in result.table():
        print("  ", row)
    cost = result.cost
    print("fit: " + ", ".join(f"{t} = {getattr(cost, t):.3g}" for t in PIECEWISE_TERMS)
          + f"  (R^2 {result.r2:.3f}, worst error {result.worst_error:.0%})")
    payload = {"benchmark": "calibrate", "threads": args.threads, "repeats": args.repeats,
               "clock": "thread CPU time" if args.clock == "cpu" else "wall clock",
               "statistic": "the least of the repeats",
               "model": "minicb default model",
               "samples": [dataclasses.asdict(s) for s in result.samples],
               "predicted": result.predicted,
               "fit": {t: getattr(cost, t) for t in PIECEWISE_TERMS}, "r2": result.r2,
               "worst_error": result.worst_error,
               "gpu_published": {t: getattr(A100_LLAMA2_7B, t) for t in PIECEWISE_TERMS[:4]}}
    from minicb.viz.benchmarks import plot_calibration

    json_path, png_path = write_results(args.out_dir, "calibration", payload, plot_calibration)
    print(f"results: {json_path}, {png_path}")
    return 0

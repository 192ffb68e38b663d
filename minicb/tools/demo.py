"""python -m minicb demo: one workload through naive, static and continuous batching.

The terminal tour of the book: the same prompts, the same model, the same greedy outputs, and a
table of what each scheduler did with the time. The step counts, rows per step and KV blocks
come from the schedulers and do not move between runs; the timings do, with whatever else the
machine is doing, so they are given as ratios to naive serving measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import time

from minicb.bench.machine import machine_line
from minicb.config import EngineConfig
from minicb.engine.llm import LLM
from minicb.metrics import summarize
from minicb.params import SamplingParams
from minicb.sim.workload import Workload, fixed, get_workload, long_tail_lengths, uniform_lengths

SYSTEMS = [("naive", "paged"), ("static", "paged"), ("continuous", "contiguous"),
           ("continuous", "paged")]


def demo_workload(num_prompts: int = 48, seed: int = 0) -> Workload:
    """The demo's traffic: prompts of 8-64 tokens, answers of 16-96 with a long tail. Long
    enough that batching pays on two CPU cores, spread enough that a static batch waits."""
    return fixed("demo", uniform_lengths(num_prompts, 8, 64, seed),
                 long_tail_lengths(num_prompts, 16, 96, seed + 1),
                 "prompts 8-64, answers long-tailed 16-96")


def run(model: str | None, workload: Workload, max_num_seqs: int, seed: int,
        progress: bool = True) -> list[dict]:
    rows, reference = [], None
    for number, (scheduler, kv_cache) in enumerate(SYSTEMS, 1):
        name = f"{scheduler}+{kv_cache}"
        if progress:
            print(f"[{number}/{len(SYSTEMS)}] {name:<22}", end="", flush=True)
        llm = LLM(model, scheduler=scheduler, kv_cache=kv_cache, max_num_seqs=max_num_seqs)
        engine = llm.llm_engine
        prompts = workload.prompt_token_ids(engine.vocab_size, seed=seed)
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                  for n in workload.output_lens]
        # warm-up
        llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
        llm.step_stats.reset()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = [o.outputs[0].token_ids for o in outputs]
        reference = reference or tokens
        summary = summarize([o.metrics for o in outputs])
        steps = llm.step_stats
        rows.append({"system": name, "seconds": elapsed,
                     "tok_per_s": summary.output_tokens / elapsed, "steps": steps.num_steps,
                     "rows_per_step": steps.summary().mean_running,
                     "peak_kv_blocks": steps.peak_reserved_slots // engine.config.block_size,
                     "ttft_p50": summary.ttft["p50"], "tpot_p50": summary.tpot["p50"],
                     "same_tokens": tokens == reference})
        if progress:
            print(f" {elapsed:6.1f} s, {steps.num_steps} steps", flush=True)
    naive = rows[0]["tok_per_s"]
    for row in rows:
        row["vs_naive"] = row["tok_per_s"] / naive
    return rows


def format_rows(rows: list[dict]) -> str:
    header = (f"{'system':<24}{'steps':>7}{'rows/step':>10}{'peak KV blocks':>15}"
              f"{'seconds':>9}{'tok/s':>8}"
              f"{'vs naive':>9}{'TTFT p50':>10}{'TPOT p50':>10}  same tokens")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['system']:<24}{r['steps']:>7}{r['rows_per_step']:>10.1f}{r['peak_kv_blocks']:>15}"
                     f"{r['seconds']:>9.2f}{r['tok_per_s']:>8.0f}{r['vs_naive']:>8.1f}x"
                     f"{r['ttft_p50']:>9.2f}s{r['tpot_p50'] * 1000:>8.1f}ms  {r['same_tokens']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicb demo",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="demo",
                        help="demo (the default) | mixed | chat | seed-example | three-answers")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    EngineConfig.add_cli_args(parser, only=("model", "max_num_seqs"), defaults={"max_num_seqs": 16})
    args = parser.parse_args(argv)
    if args.workload == "demo":
        workload = demo_workload(args.num_prompts, args.seed)
    elif args.workload in ("mixed", "chat"):
        workload = get_workload(args.workload, n=args.num_prompts, seed=args.seed)
    else:
        workload = get_workload(args.workload)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {machine_line()}, load average {load:.2f}")
    print(f"workload: {len(workload)} requests, {workload.description}; {args.max_num_seqs} slots; "
          "the shipped model, greedy\n")
    rows = run(args.model, workload, args.max_num_seqs, args.seed)
    print("\n" + format_rows(rows))
    print("\nSteps, rows per step and KV blocks come from the schedulers and are the same every "
          "run. Seconds move\nwith whatever else this machine is doing, so compare the ratios to "
          "naive serving measured just now.\nSame prompts, same greedy tokens in every system; "
          "only the schedule differs.")
    return 0 if all(r["same_tokens"] for r in rows) else 1

"""`python -m minicb bench overhead`: is the CPU side of the loop small next to the model?

    python -m minicb bench overhead [--running 1 4 16 64 256 1024] [--batch-sizes 1 16 64 256]

Two measurements, one plot:

- schedule() + update() per step against the number of running requests, on the cost-model
  runner (minicb.sim: the real scheduler and KV managers, no model), for both KV managers;
- the model's decode step at a few batch sizes, on the real engine, split into its phases:
  schedule, prepare (packing the batch), forward + sample, update, and the rest of step().

Next to them, the floor of a decode step: the weights must be read once per step, so it cannot
take less than weight bytes / memory bandwidth (a plain copy's, measured here).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from minicb.bench.common import (
    RESULTS_DIR,
    copy_bandwidth_gbps,
    display_path,
    format_table,
    make_timer,
    resolve_model,
    weight_bytes,
    write_results,
)
from minicb.sim import simulate
from minicb.workload import fixed

TARGET_RUNNING, TARGET_SHARE = 256, 0.10


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m minicb bench overhead",
                                description=__doc__.split("\n")[0])
    p.add_argument("--running", type=int, nargs="+",
                   default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 16, 64, 256],
                   help="decode batch sizes at which the real model's step is timed (none given: "
                        "skip the model)")
    p.add_argument("--context", type=int, default=128, help="prompt tokens of every request")
    p.add_argument("--steps", type=int, default=20, help="decode steps measured per point")
    p.add_argument("--model", default=None)
    p.add_argument("--random-model", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out-dir", default=str(RESULTS_DIR))
    return p.parse_args(argv)


def scheduler_cost(running: int, kv_cache: str, context: int, steps: int) -> float:
    """Median microseconds of schedule() + update() over the decode steps of `running` requests."""
    workload = fixed("overhead", [context] * running, [steps + 1] * running)
    result = simulate(workload, scheduler="continuous", kv_cache=kv_cache, max_num_seqs=running,
                      max_num_batched_tokens=running * context)
    decode_steps = result.steps[1:]   # the first step is everyone's prefill
    return statistics.median(s.scheduler_seconds for s in decode_steps) * 1e6


class PhaseClock:
    """Wraps methods of live objects so every call adds its CPU time to a named phase.

    CPU time of the whole process (every torch thread), not wall-clock: on a machine shared with
    other work the wall clock also counts the time the neighbours held the cores.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner, method: str, phase: str) -> None:
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.process_time() - start

        setattr(owner, method, timed)


def model_step(model_path: str, batch: int, context: int, steps: int, device: str,
               dtype: str) -> dict:
    """CPU milliseconds per decode step with `batch` running requests, split into phases (on a
    GPU the forward runs asynchronously, so there the step is timed by the wall clock)."""
    from minicb import LLM, SamplingParams

    llm = LLM(model_path, scheduler="continuous", kv_cache="paged", max_num_seqs=batch,
              max_num_batched_tokens=max(2048, batch), max_model_len=context + steps + 8,
              device=device, dtype=dtype)
    engine = llm.llm_engine
    vocab = engine.vocab_size
    for index in range(batch):
        prompt = [(7 * index + 3 * j) % (vocab - 3) + 3 for j in range(context)]
        engine.add_request(str(index), prompt,
                           SamplingParams(max_tokens=steps + 4, temperature=0, ignore_eos=True))
    while any(r.is_prefilling for r in engine.scheduler.waiting + engine.scheduler.running):
        engine.step()
    engine.step()   # one decode step to warm up
    clock = PhaseClock()
    clock.wrap(engine.scheduler, "schedule", "schedule")
    clock.wrap(engine.scheduler, "update", "update")
    clock.wrap(engine.runner, "prepare", "prepare")
    clock.wrap(engine.runner, "execute", "execute")
    cpu, wall = [], []
    on_gpu = device.startswith("cuda")
    for _ in range(steps):
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        engine.step()
        if on_gpu:
            torch.cuda.synchronize()
        cpu.append(time.process_time() - cpu_start)
        wall.append(time.perf_counter() - wall_start)
    ms = {phase: 1e3 * seconds / steps for phase, seconds in clock.seconds.items()}
    mean_ms = 1e3 * sum(wall if on_gpu else cpu) / steps
    return {"batch": batch, "step_ms": 1e3 * statistics.median(wall if on_gpu else cpu),
            "mean_step_ms": mean_ms, "wall_step_ms": 1e3 * statistics.median(wall),
            "schedule_ms": ms["schedule"], "prepare_ms": ms["prepare"],
            "forward_sample_ms": ms["execute"] - ms["prepare"], "update_ms": ms["update"],
            "other_ms": mean_ms - ms["schedule"] - ms["execute"] - ms["update"]}


def decode_floor(model_path: str, device: str, dtype: str) -> dict:
    """Weight bytes / copy bandwidth: no decode step can be faster than reading the weights once."""
    from minicb.model.loader import load_model

    weights = weight_bytes(load_model(Path(model_path), device, dtype))
    bandwidth = copy_bandwidth_gbps(device, make_timer(device, 100))
    return {"weight_bytes": weights, "copy_bandwidth_gbps": bandwidth,
            "floor_ms": weights / (bandwidth * 1e9) * 1e3}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    if args.threads:
        torch.set_num_threads(args.threads)
    scheduler = {kv: [{"running": n, "us_per_step": scheduler_cost(n, kv, args.context, args.steps)}
                      for n in args.running] for kv in ("paged", "contiguous")}
    print(format_table([
        {"running": p["running"], "paged": p["us_per_step"], "contiguous": c["us_per_step"]}
        for p, c in zip(scheduler["paged"], scheduler["contiguous"])],
                       [("running", "running requests", "d"), ("paged", "paged: us / step", ".0f"),
                        ("contiguous", "contiguous: us / step", ".0f")]))
    model_steps, floor, model = [], None, None
    if args.batch_sizes:
        model_path, label = resolve_model(args.model, args.random_model, args.dtype)
        model = {"label": label, "path": display_path(model_path), "device": args.device,
                 "dtype": args.dtype, "context": args.context}
        for batch in args.batch_sizes:
            model_steps.append(model_step(model_path, batch, args.context, args.steps, args.device,
                                          args.dtype))
        floor = decode_floor(model_path, args.device, args.dtype)
        print()
        print(format_table(model_steps, [("batch", "decode batch", "d"),
                                         ("step_ms", "step ms (median)", ".2f"),
                                         ("schedule_ms", "schedule", ".2f"),
                                         ("prepare_ms", "prepare", ".2f"),
                                         ("forward_sample_ms", "forward+sample", ".2f"),
                                         ("update_ms", "update", ".2f"),
                                         ("other_ms", "rest of step()", ".2f")]))
        print(f"floor: {floor['weight_bytes'] / 2**20:.1f} MiB of weights / "
              f"{floor['copy_bandwidth_gbps']:.1f} GB/s copy bandwidth = {floor['floor_ms']:.3f} "
              "ms per decode step")
    target = overhead_share(scheduler["paged"], model_steps)
    if target:
        print(f"schedule+update at {target['running']} running: {target['scheduler_us']:.0f} us on "
              f"the cost model, {target['in_engine_us']:.0f} us in the engine = "
              f"{100 * target['share']:.1f}% of the {target['step_ms']:.1f} ms step (target < "
              f"{100 * TARGET_SHARE:.0f}%: {'met' if target['met'] else 'NOT met'})")
    payload = {"benchmark": "overhead", "runner": "minicb.sim cost model for the scheduler; the "
               "real engine for "
               "the model", "context": args.context, "steps": args.steps, "scheduler": scheduler,
               "model": model, "model_steps": model_steps, "floor": floor, "target": target}
    from minicb.bench.plots import plot_overhead

    stem = "overhead" + (f"-{args.device}" if args.device != "cpu" else "") + \
        (f"-{args.random_model}" if args.random_model else "")
    json_path, png_path = write_results(args.out_dir, stem, payload, plot_overhead)
    print(f"results: {json_path}, {png_path}")
    return 0


def overhead_share(scheduler: list[dict], model_steps: list[dict]) -> dict | None:
    """schedule+update against the model's step at the largest measured batch up to 256 running."""
    candidates = [m for m in model_steps if m["batch"] <= TARGET_RUNNING]
    if not candidates:
        return None
    step = max(candidates, key=lambda m: m["batch"])
    cost = min(scheduler, key=lambda p: abs(p["running"] - step["batch"]))
    in_engine_us = 1e3 * (step["schedule_ms"] + step["update_ms"])
    share = max(cost["us_per_step"], in_engine_us) / (1e3 * step["step_ms"])
    return {"running": step["batch"], "scheduler_us": cost["us_per_step"],
            "in_engine_us": in_engine_us, "step_ms": step["step_ms"], "share": share,
            "target": TARGET_SHARE, "met": share < TARGET_SHARE}

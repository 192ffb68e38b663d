"""`python -m minicb bench timeline`: how much of the time is the device busy, sync vs overlapped?

    python -m minicb bench timeline [--batch-sizes 8 64] [--steps 40] [--repeats 3]

Two pictures of the same loop, one lane for the host and one for the device:

- measured, on the real engine in steady decode: per step, the host's phases (schedule, pack,
  launch, wait, update) and the device's busy intervals, with synchronous steps and overlapped
  ones (async_scheduling), alternated, `--repeats` times each, with the load average and each
  step's thread count beside them. On a GPU the device's intervals are CUDA events recorded on
  the stream around each step and read back without a synchronisation per step; on a CPU "the
  device" is the thread that runs the model, its intervals the runner's step, wall clock
  (minicb.bench.device_lane).
- in virtual time, from the cost model: the simulator's step costs on the book's reference CPU
  (minicb.sim.calibrate.REFERENCE_CPU; --cost a100 for the A100's) as the device's lane, and a host
  cost per step (schedule + pack + update, read from `bench overhead`'s JSON at the nearest batch
  size, or --host-ms), laid out as the two loops run them: one after the other, or the host
  planning step n + 1 while the device runs step n.

The reading is the device's busy share of wall time over the steady decode steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from minicb.bench.common import display_path, resolve_model
from minicb.bench.device_lane import CudaEvents, HostClock, Recorder, event_source
from minicb.bench.harness import (
    RESULTS_DIR,
    add_flags,
    alternate,
    bench_parser,
    format_table,
    load_average,
    reading,
    spread,
    verdict,
    write_results,
)
from minicb.viz.lanes import busy_fraction, lane_chart

OVERHEAD_JSON = RESULTS_DIR / "overhead.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser("timeline", __doc__)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 64])
    p.add_argument("--context", type=int, default=64, help="prompt tokens of every request")
    p.add_argument("--steps", type=int, default=40, help="decode steps recorded per run")
    add_flags(p, repeats=dict(help="runs of each loop, alternated"))
    p.add_argument("--cost", choices=["cpu", "a100"], default="cpu",
                   help="the simulator's step costs: the reference CPU's or the A100's")
    p.add_argument("--host-ms", type=float, default=None,
                   help="the simulator's host cost per step (default: bench overhead's JSON)")
    add_flags(p, "model", "random_model", "device", "dtype")
    p.add_argument("--skip-engine", action="store_true", help="only the simulator's lanes")
    add_flags(p, "out_dir")
    return p.parse_args(argv)


def engine_run(model_path: str, overlap: bool, batch: int, context: int, steps: int,
               device: str, dtype: str) -> dict:
    """One run in steady decode: `steps` steps of `batch` decoding requests, recorded."""
    from minicb import LLM, SamplingParams

    llm = LLM(model_path, async_scheduling=overlap, max_num_seqs=batch,
              max_num_batched_tokens=max(2048, batch), max_model_len=context + steps + 16,
              device=device, dtype=dtype)
    engine = llm.llm_engine
    vocab = engine.vocab_size
    for index in range(batch):
        prompt = [(7 * index + 3 * j) % (vocab - 3) + 3 for j in range(context)]
        engine.add_request(str(index), prompt,
                           SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True))
    while any(r.is_prefilling for r in engine.scheduler.waiting + engine.scheduler.running):
        engine.step()
    for _ in range(2):                    # warm: the overlapped loop has a step in flight now
        engine.step()
    recorder = Recorder(engine, event_source(device))
    load = load_average()
    start = time.perf_counter()
    tokens = sum(len(output.new_token_ids) for _ in range(steps) for output in engine.step())
    end = time.perf_counter()
    device_lane = recorder.device.finish()      # the device's marks, read once they are passed
    while engine.has_unfinished_requests():
        engine.step()
    return {"overlap": overlap, "batch": batch, "wall_s": end - start, "tokens": tokens,
            "tokens_per_s": tokens / (end - start),
            "device_busy": busy_fraction(device_lane, start, end),
            "host_busy": busy_fraction([i for i in recorder.host if i[2] != "wait"], start, end),
            "threads": sorted(set(recorder.threads)), "load_average": load,
            "lanes": {"host": _relative(recorder.host, start, end),
                      "device": _relative(device_lane, start, end)},
            "window": [0.0, end - start]}


def device_facts(device: str) -> dict:
    """What the device lane measured, and on what: the source of its intervals and the device's
    name (a GPU run's JSON names its GPU)."""
    import torch

    cuda = str(device).startswith("cuda")
    return {"clock": CudaEvents.name if cuda else HostClock.name,
            "device_name": torch.cuda.get_device_name(device) if cuda else "cpu"}


def _relative(intervals, start: float, end: float) -> list[tuple[float, float, str]]:
    return sorted((a - start, b - start, phase) for a, b, phase in intervals
                  if b >= start and a <= end)


def host_costs(batch: int, host_ms: float | None) -> dict:
    """The host's milliseconds per decode step by phase: --host-ms as all of it, or bench
    overhead's measurement at the nearest batch size."""
    if host_ms is not None:
        return {"schedule": host_ms / 3, "pack": host_ms / 3, "update": host_ms / 3,
                "source": "--host-ms"}
    rows = json.loads(OVERHEAD_JSON.read_text())["summary"]
    row = min(rows, key=lambda r: abs(r["batch"] - batch))
    us = row["phases_mean_us"]      # sampling runs with the forward, on the device's lane
    return {"schedule": us["schedule"] / 1e3, "pack": us["prepare"] / 1e3,
            "update": (us["update"] + us["rest"]) / 1e3,
            "source": f"{display_path(OVERHEAD_JSON)} at batch {row['batch']}"}


def virtual_lanes(device_seconds: list[float], host: dict, overlap: bool) -> dict:
    """Lay out the steps as each loop runs them, in virtual seconds. Synchronous: schedule, pack,
    the device's step (the host waits), update. Overlapped: the host plans step n + 1 while the
    device runs step n, then waits for step n and applies it; the device starts a step when it
    is packed and the step before it is done."""
    phases = [(name, host[name] / 1e3) for name in ("schedule", "pack")]
    update = host["update"] / 1e3
    lanes: dict[str, list] = {"host": [], "device": []}
    t = device_free = 0.0

    def collect(until: float) -> float:         # wait for a step's tokens, then apply them
        if until > t:
            lanes["host"].append((t, until, "wait"))
        start = max(t, until)
        lanes["host"].append((start, start + update, "update"))
        return start + update

    for n, d in enumerate(device_seconds):
        for name, cost in phases:
            lanes["host"].append((t, t + cost, name))
            t += cost
        start = max(t, device_free)
        lanes["device"].append((start, start + d, "busy"))
        if not overlap:
            t = collect(start + d)
        elif n > 0:                             # step n is queued: now collect step n - 1
            t = collect(device_free)
        device_free = start + d
    if overlap:
        collect(device_free)
    return lanes


def simulated(batch: int, context: int, steps: int, host: dict, cost_name: str = "cpu") -> dict:
    """The cost model's decode steps for `batch` requests, sync and overlapped lanes."""
    from minicb.sim import simulate
    from minicb.sim.calibrate import A100_LLAMA2_7B, REFERENCE_CPU
    from minicb.sim.workload import fixed

    cost = {"cpu": REFERENCE_CPU, "a100": A100_LLAMA2_7B}[cost_name]
    result = simulate(fixed("timeline", [context] * batch, [steps + 1] * batch), cost=cost,
                      scheduler="continuous", kv_cache="paged", max_num_seqs=batch,
                      max_num_batched_tokens=max(2048, batch * context))
    device = [s.end - s.start for s in result.steps[1:steps + 1]]    # after everyone's prefill
    out = {"batch": batch, "cost_model": cost.name, "host_ms": host,
           "device_ms": 1e3 * statistics.mean(device)}
    for name, overlap in (("sync", False), ("overlapped", True)):
        lanes = virtual_lanes(device, host, overlap)
        end = max(b for _, b, _ in lanes["host"] + lanes["device"])
        out[name] = {"lanes": lanes, "window": [0.0, end],
                     "device_busy": busy_fraction(lanes["device"], 0.0, end),
                     "tokens_per_s": batch * len(device) / end}
    return out


def summarise(runs: list[dict]) -> list[dict]:
    """Per batch size and loop: device busy share and tokens/s over the repeats (median, range);
    the overlapped row also reads its tokens/s against the synchronous run of the same repeat
    (the runs alternate), by the book's one rule."""
    rows = []
    for batch in sorted({r["batch"] for r in runs}):
        loops = {o: [r for r in runs if r["batch"] == batch and r["overlap"] == o]
                 for o in (False, True)}
        for overlap, mine in loops.items():
            busy, speed = (spread(r[key] for r in mine) for key in ("device_busy", "tokens_per_s"))
            rows.append({"batch": batch, "loop": "overlapped" if overlap else "sync",
                         **{f"busy_{k}": v for k, v in busy.items()},
                         **{f"tps_{k}": v for k, v in speed.items()}})
        ratios = [o["tokens_per_s"] / s["tokens_per_s"] for s, o in zip(*loops.values())]
        rows[-1].update(tps_ratio_to_sync=spread(ratios)["median"],
                        verdict=verdict(ratios, "faster", "slower"),
                        reading=reading(ratios, "faster", "slower"))
    return rows


def plot_timeline(payload: dict):
    """The lanes of the largest batch: the simulator's (virtual time) when no engine ran, else
    the engine's median-speed run of each loop."""
    timelines = {}
    if payload.get("runs"):
        batch = max(r["batch"] for r in payload["runs"])
        for overlap, name in ((False, "sync"), (True, "overlapped")):
            mine = sorted((r for r in payload["runs"] if r["batch"] == batch
                           and r["overlap"] == overlap), key=lambda r: r["tokens_per_s"])
            run = mine[len(mine) // 2]
            timelines[f"{name}, {batch} rows (measured)"] = run["lanes"]
        window = min(run["window"][1] for run in payload["runs"] if run["batch"] == batch)
        return lane_chart(timelines, window=(0.0, window / 4))
    sim = max(payload["simulated"], key=lambda s: s["batch"])
    for name in ("sync", "overlapped"):
        timelines[f"{name}, {sim['batch']} rows (cost model)"] = sim[name]["lanes"]
    return lane_chart(timelines, window=(0.0, sim["sync"]["window"][1] / 4))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    simulated_runs = [simulated(b, args.context, args.steps, host_costs(b, args.host_ms),
                                args.cost) for b in args.batch_sizes]
    print(format_table([{"batch": s["batch"], "device_ms": s["device_ms"],
                         "host_ms": sum(v for k, v in s["host_ms"].items() if k != "source"),
                         "sync": s["sync"]["device_busy"],
                         "overlapped": s["overlapped"]["device_busy"]} for s in simulated_runs],
                       [("batch", "rows", "d"), ("device_ms", "device ms / step", ".2f"),
                        ("host_ms", "host ms / step", ".2f"),
                        ("sync", "busy, sync (virtual)", ".3f"),
                        ("overlapped", "busy, overlapped (virtual)", ".3f")]))
    sim_stem = "timeline-sim" + ("" if args.cost == "cpu" else f"-{args.cost}")
    write_results(args.out_dir, sim_stem, {"benchmark": "timeline", "runner": "minicb.sim "
                  "cost model, virtual time", "steps": args.steps, "context": args.context,
                  "simulated": simulated_runs}, plot_timeline)
    if args.skip_engine:
        return 0
    model_path, label = resolve_model(args.model, args.random_model, args.dtype)
    runs = [engine_run(model_path, overlap, batch, args.context, args.steps, args.device,
                       args.dtype)            # alternated, so drift hits both loops alike
            for _, (batch, overlap) in alternate(args.repeats, [(b, o) for b in args.batch_sizes
                                                                for o in (False, True)])]
    rows = summarise(runs)
    print(format_table(rows, [("batch", "rows", "d"), ("loop", "loop", "s"),
                              ("busy_median", "device busy (median)", ".3f"),
                              ("busy_min", "min", ".3f"), ("busy_max", "max", ".3f"),
                              ("tps_median", "tokens/s (median)", ".0f"),
                              ("tps_min", "min", ".0f"), ("tps_max", "max", ".0f"),
                              ("tps_ratio_to_sync", "÷ sync", ".2f"),
                              ("verdict", "overlap is", "s")]))
    print("load averages:", [r["load_average"] for r in runs])
    stem = "timeline" + (f"-{args.device}" if args.device != "cpu" else "")
    json_path, png_path = write_results(
        args.out_dir, stem, {"benchmark": "timeline", "runner": "the real engine",
                             "model": {"label": label, "path": display_path(model_path),
                                       "device": args.device, "dtype": args.dtype},
                             "device_lane": device_facts(args.device),
                             "steps": args.steps, "context": args.context,
                             "repeats": args.repeats, "summary": rows, "runs": runs},
        plot_timeline)
    print(f"results: {json_path}, {png_path}")
    return 0

"""`python -m minicb bench step-cost`: what one decode step costs, by its rows, on two clocks.

    python -m minicb bench step-cost                  # 1, 16 and 64 rows, 5 alternated repeats
    python -m minicb bench step-cost --rows 1 16 --repeats 7 --steps 40

The one figure the simulator's CPU cost model rests on, measured the two ways a step can be
timed: the wall clock (what a user waits for) and the stepping thread's CPU time (what the step
costs when it has a core to itself: other programs on a shared machine add wall time while the
step waits for a core, never CPU time). One torch thread (as the notebooks run), so the forward
runs on the stepping thread and its CPU time is the whole step's.

Engines are built before any timing; each repeat steps them in a rotating order, with the load
before and after, and reads each row count against one row by the book's rule (minicb.repeats).
Writes benchmarks/results/step-cost.json.
"""

from __future__ import annotations

import statistics
import time

import torch

from minicb.bench.harness import add_flags, announce, bench_parser, turn_order, write_results
from minicb.bench.machine import load_average
from minicb.config import FUSED_DECODE_ROWS_PER_THREAD
from minicb.repeats import Repeats
from minicb.runner.threads import ceiling
from minicb.sim.calibrate import REFERENCE_CPU

ROWS = (1, 16, 64)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def decoding_engine(rows: int, context: int, fused_rows: int, seed: int = 0):
    """An engine with `rows` requests past their prompts, decoding for as long as it is
    stepped (greedy, no stop); decode steps of up to `fused_rows` rows take the fused layer."""
    import numpy as np

    from minicb import LLM, SamplingParams

    llm = LLM(max_num_seqs=rows, max_num_batched_tokens=max(2048, rows * context),
              cpu_threads=1, max_fused_decode_rows=fused_rows)
    engine = llm.llm_engine
    rng = np.random.default_rng(seed)
    forever = SamplingParams(max_tokens=100_000, temperature=0, ignore_eos=True)
    for index in range(rows):
        engine.add_request(f"step-cost-{index}", rng.integers(3, engine.vocab_size,
                                                              size=context).tolist(), forever)
    for _ in range(5):      # the prompts, then a few decodes: cold caches are not a step's cost
        engine.step()
    return engine


def timed_steps(engine, steps: int) -> dict:
    """`steps` decode steps, each on both clocks: the median and the least of each, and the
    keys (cached tokens) the rows read on average."""
    wall, cpu, keys = [], [], []
    rows = len(engine.scheduler.running)
    for _ in range(steps):
        if len(engine.scheduler.running) != rows:
            raise RuntimeError("a request reached the model's length: use fewer --steps or "
                               "--repeats, or a shorter --context.")
        keys.append(sum(r.num_computed_tokens + 1 for r in engine.scheduler.running))
        w0, c0 = time.perf_counter(), time.thread_time()
        engine.step()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"wall_ms": statistics.median(wall) * 1e3, "wall_min_ms": min(wall) * 1e3,
            "cpu_ms": statistics.median(cpu) * 1e3, "cpu_min_ms": min(cpu) * 1e3,
            "keys": statistics.mean(keys)}


def measure(rows: tuple[int, ...], repeats: int, steps: int, context: int,
            fused_rows: int) -> list[dict]:
    """Every repeat, every engine in turn (rotating), with the load average around each."""
    engines = {r: decoding_engine(r, context, fused_rows) for r in rows}
    runs = []
    for repeat in range(repeats):
        for r in turn_order(list(rows), repeat):
            before = load_average()[0]
            point = timed_steps(engines[r], steps)
            runs.append({"repeat": repeat, "rows": r, **point, "load_before": before,
                         "load_after": load_average()[0],
                         "model_ms": REFERENCE_CPU.step_time(0, r, point["keys"]) * 1e3})
    return runs


def summarize(runs: list[dict], rows: tuple[int, ...]) -> dict:
    """Per row count: the median over repeats of each clock's figure and the cost model's;
    per row count past the first: its ratio to the first on each clock, repeat by repeat."""
    by = {(r["rows"], r["repeat"]): r for r in runs}
    repeats = sorted({r["repeat"] for r in runs})
    per_rows = {}
    for n in rows:
        mine = [by[n, k] for k in repeats]
        per_rows[str(n)] = {key: statistics.median(r[key] for r in mine)
                            for key in ("wall_ms", "wall_min_ms", "cpu_ms", "cpu_min_ms",
                                        "model_ms", "keys")}
        per_rows[str(n)]["wall_over_cpu"] = statistics.median(r["wall_ms"] / r["cpu_ms"]
                                                              for r in mine)
    ratios = {}
    for n in rows[1:]:
        for clock in CLOCKS:
            values = [by[n, k][f"{clock}_ms"] / by[rows[0], k][f"{clock}_ms"] for k in repeats]
            ratios[f"{n}_over_{rows[0]}_{clock}"] = {
                "values": values, "median": Repeats.of(values).median,
                "reading": Repeats.of(values).describe("dearer", "cheaper")}
    return {"per_rows": per_rows, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("step-cost", __doc__)
    p.add_argument("--rows", nargs="+", type=int, default=list(ROWS),
                   help="decode rows per step, the first the reference (default: 1 16 64)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per engine and repeat")
    p.add_argument("--context", type=int, default=16, help="prompt tokens per request")
    add_flags(p, "repeats", "out_dir")
    args = p.parse_args(argv or [])
    if args.repeats < 1 or args.steps < 1 or min(args.rows) < 1:
        p.error("--repeats, --steps and every --rows take at least 1.")
    # the fused layer's row limit an engine with the default thread policy takes on this machine
    # (as the calibration's), fixed before the one torch thread lowers the engine's ceiling
    fused_rows = FUSED_DECODE_ROWS_PER_THREAD * ceiling()
    torch.set_num_threads(1)
    rows = tuple(args.rows)
    announce(f"decode steps of {', '.join(map(str, rows))} rows, one torch thread, "
             f"{args.repeats} repeats of {args.steps} steps")
    runs = measure(rows, args.repeats, args.steps, args.context, fused_rows)
    summary = summarize(runs, rows)
    for n, point in summary["per_rows"].items():
        print(f"{n:>4} rows: wall {point['wall_ms']:.3f} ms, thread CPU {point['cpu_ms']:.3f} ms "
              f"(wall/CPU {point['wall_over_cpu']:.2f}), cost model {point['model_ms']:.3f} ms")
    for name, ratio in summary["ratios"].items():
        print(f"{name}: {ratio['reading']}")
    payload = {"benchmark": "step-cost", "threads": 1, "fused_rows": fused_rows,
               "repeats": args.repeats,
               "steps": args.steps, "context": args.context, "rows": list(rows),
               "statistic": "per repeat the median of its steps; per row count the median of "
                            "the repeats; ratios paired repeat by repeat",
               "runs": runs, **summary}
    json_path, _ = write_results(args.out_dir, "step-cost", payload)
    print(f"results: {json_path}")
    return 0

"""Tensor parallelism on this CPU: gloo's all-reduce at a decode step's and a prefill's sizes,
then a two-rank engine's decode step against one rank's, beside minicb.sim.parallel's prediction.

Expected before measuring: on a 2-core machine, TP = 2 is not faster. One rank with two threads
and two ranks with one thread each split the same arithmetic over the same two cores, and the
split adds 2 x layers all-reduces and one broadcast of the plan per step (vLLM measured TP = 2
through torch.distributed on a CPU at 196% of TP = 1's time per token).

The prediction is `minicb.sim.parallel.tp_step_parts` twice. The GPU model, with a "device" of
one core and memory of its own: the one-thread step is the base, the part outside the decoder
layers (timed here with hooks on the layers: scheduling, the embedding, the LM head and
sampling, which rank 0 does alone) plus the plan's broadcast stays, and the layers' time halves.
The corrected model, `one_machine=True`: two ranks are two halves of one machine, sharing its
cores and its one memory bus, so the base is the one-rank step on both cores and its layers'
time stays whole. Both add 2 x layers all-reduces at this run's measured gloo times. The engines run the torch modules with the
small-batch kernel (no fused decode layer), the path both ranks of a TP group take.

    .venv/bin/python scripts/bench_tensor_parallel.py --random-model llama-100m --repeats 5
    .venv/bin/python scripts/bench_tensor_parallel.py --collectives-only --repeats 5
    .venv/bin/python scripts/bench_tensor_parallel.py --markdown   (the committed runs' tables)

(A script beside the package rather than a `minicb bench` command: minicb/bench is capped.)
"""

from __future__ import annotations

import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import torch.multiprocessing as mp

from minicb.bench.harness import (
    add_flags,
    alternate,
    announce,
    bench_parser,
    format_table,
    reading,
    spread,
    write_results,
)
from minicb.bench.machine import load_average
from minicb.engine.shm_allreduce import SharedMemoryAllReduce
from minicb.sim.cost_model import CostModel
from minicb.sim.parallel import GLOO_SIZES, ModelShape, gloo_allreduce_time, tp_step_parts

ROWS = (1, 8, 32)
ITERATIONS = 200          # all-reduces per size and repeat
STEPS = 24                # decode steps timed per engine, rows and repeat
PLAN_BYTES = 2048         # a decode step's pickled plan at tens of rows (minicb.engine.tp_group)


def _collectives(group, sizes: list[int], iterations: int) -> dict[str, float]:
    """Median seconds of one all-reduce per message size (bytes of float32), and of one plan
    broadcast; the peer process runs the same calls in the same order."""
    medians = {}
    for size in sizes:
        tensor = torch.ones(size // 4)
        times = []
        for _ in range(iterations + 10):
            start = time.perf_counter()
            group.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        medians[f"allreduce {size}"] = statistics.median(times[10:])
    if not hasattr(group, "send"):           # a shared-memory group carries no plan
        return medians
    times = []
    plan = bytes(PLAN_BYTES)
    for _ in range(iterations + 10):
        start = time.perf_counter()
        if group.rank == 0:
            group.send(plan)
        else:
            group.receive()
        times.append(time.perf_counter() - start)
    medians["broadcast"] = statistics.median(times[10:])
    return medians


def _peer(kind: str, link, sizes: list[int], iterations: int, repeats: int) -> None:
    torch.set_num_threads(1)
    if kind == "gloo":
        from minicb.engine.tp_group import TPGroup

        group = TPGroup(1, 2, link, "cpu")
        group.connect()
    else:
        group = SharedMemoryAllReduce(1, *link)
    for _ in range(repeats):
        _collectives(group, sizes, iterations)


def measure_collectives(sizes: list[int], repeats: int,
                        kind: str = "gloo") -> list[dict[str, float]]:
    """gloo (or shared memory) between this process and a spawned one: per repeat, each size's
    median time and the load average when it ended."""
    from minicb.engine.tp_group import TPGroup, master_store

    if kind == "gloo":
        store = master_store(2)
        link = store.port
    else:
        link = SharedMemoryAllReduce.buffers(2, max(sizes) // 4)
    peer = mp.get_context("spawn").Process(target=_peer, daemon=True,
                                           args=(kind, link, sizes, ITERATIONS, repeats))
    peer.start()
    if kind == "gloo":
        group = TPGroup(0, 2, store.port, "cpu", store)
        group.connect()
    else:
        group = SharedMemoryAllReduce(0, *link)
    # one thread, like the peer: the sum of a large message would otherwise run on a team of
    # threads, which on a busy machine waits for its slowest member at the end of every call
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = [{**_collectives(group, sizes, ITERATIONS), "load_average": load_average()}
                   for _ in range(repeats)]
    finally:
        torch.set_num_threads(threads)
    peer.join(timeout=60)
    return results


def gloo_record(sizes: list[int], repeats: int, out_dir: str) -> tuple[tuple, float]:
    """Measure gloo, write gloo_allreduce.json, return its table ((bytes, seconds) by size, as
    `gloo_allreduce_time` takes it) and the broadcast's median seconds."""
    runs = measure_collectives(sizes, repeats)
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]
              if key != "load_average"}
    table = tuple((size, median[f"allreduce {size}"]) for size in sizes)
    (_, second_last), (largest, last) = table[-2], table[-1]
    write_results(out_dir, "gloo_allreduce", {
        "what": "gloo all-reduce of float32 between two processes on one host, median of "
                f"{ITERATIONS} calls per size and repeat; broadcast: a {PLAN_BYTES}-byte plan",
        "sizes": sizes, "runs": runs,
        "median_us": {name: median[f"allreduce {size}"] * 1e6 for name, size in GLOO_SIZES.items()},
        "broadcast_us": median["broadcast"] * 1e6,
        "bandwidth_GBps": (largest - table[-2][0]) / (last - second_last) / 1e9})
    return table, median["broadcast"]


def compare_collectives(sizes: list[int], repeats: int, out_dir: str) -> None:
    """gloo's all-reduce against the shared-memory one, a run of each per repeat, alternated."""
    runs = {"gloo": [], "shared memory": []}
    for _, kind in alternate(repeats, list(runs)):
        runs[kind] += measure_collectives(sizes, 1, "gloo" if kind == "gloo" else "shm")
    table = []
    for size in sizes:
        key = f"allreduce {size}"
        gains = [g[key] / s[key] for g, s in zip(runs["gloo"], runs["shared memory"])]
        table.append({"bytes": size, **{kind: statistics.median(r[key] for r in results) * 1e6
                                        for kind, results in runs.items()},
                      "gains": gains, "gain": statistics.median(gains),
                      "reading": reading(gains, "shared memory faster", "gloo faster")})
    print(format_table(table, [("bytes", "message bytes", "d"), ("gloo", "gloo us", ".0f"),
                               ("shared memory", "shared memory us", ".1f"),
                               ("gain", "gloo / shared memory", ".1f")]))
    for row in table:
        print(f"{row['bytes']} bytes: {row['reading']}")
    write_results(out_dir, "tensor_parallel_allreduce", {"runs": runs, "table": table})


class CollectiveClock:
    """The seconds rank 0 spends inside its all-reduces, summed since the last `take`: the
    all-reduce as it runs inside a step (its wait includes the other rank's lateness), against
    the prediction's all-reduce measured alone."""

    def __init__(self) -> None:
        from minicb.engine.tp_group import TPGroup

        self.total, original = 0.0, TPGroup.all_reduce

        def timed(group, tensor) -> None:
            start = time.perf_counter()
            original(group, tensor)
            self.total += time.perf_counter() - start

        TPGroup.all_reduce = timed           # rank 0 runs in this process; its workers do not

    def take(self) -> float:
        total, self.total = self.total, 0.0
        return total


class LayerClock:
    """The seconds a model's decoder layers take, summed since the last `take` (forward hooks)."""

    def __init__(self, layers) -> None:
        self.total, self._start = 0.0, 0.0
        for layer in layers:
            layer.register_forward_pre_hook(self._begin)
            layer.register_forward_hook(self._end)

    def _begin(self, module, args) -> None:
        self._start = time.perf_counter()

    def _end(self, module, args, output) -> None:
        self.total += time.perf_counter() - self._start

    def take(self) -> float:
        total, self.total = self.total, 0.0
        return total


def decode_steps(llm, rows: int, clock: LayerClock | CollectiveClock | None = None,
                 steps: int = STEPS) -> tuple[float, float | None]:
    """Median seconds of a decode step of `rows` rows (every row decoding, prompts done), and
    with a clock, the median seconds of each step the clock does not count (a LayerClock: the
    part outside the decoder layers; a CollectiveClock: the part outside the all-reduces)."""
    from minicb import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    for row in range(rows):
        engine.add_request(f"{time.monotonic_ns()}-{row}", [5 + row, 6, 7, 8], params)
    engine.step()                                     # the prompts
    times, outside = [], []
    while engine.has_unfinished_requests():
        if clock:
            clock.take()
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
        if clock:
            outside.append(times[-1] - clock.take())
    return (statistics.median(times[1:-1]),
            statistics.median(outside[1:-1]) if clock else None)


def predict(step: float, outside: float, broadcast: float, shape: ModelShape, rows: int,
            gloo: tuple, one_machine: bool = True) -> dict[str, float]:
    """minicb.sim.parallel's TP = 2 step on this CPU. With `one_machine` (the corrected model):
    the ranks are two halves of one machine, so the base is the one-rank step on both cores, its
    part outside the layers plus the plan's broadcast stays, the layers' time stays too (each
    rank's half runs on half the cores and half the shared memory bus), and 2 x layers
    all-reduces are added. Without it (the GPU model, each device its own memory): the base is
    the one-thread step, a core standing in for a GPU, and the layers' time halves."""
    base = CostModel(step_overhead=step, prefill_token=0.0, name="one rank", unit="s")
    return tp_step_parts(base, shape, 2, None, 0, rows, 0,
                         allreduce=partial(gloo_allreduce_time, table=gloo),
                         fixed=outside + broadcast, one_machine=one_machine)


SYSTEMS = ("TP=1", "TP=1 1 thread", "TP=2")


def markdown(out_dir: str) -> str:
    """benchmarks/tensor_parallel.md's tables, from the committed JSON records."""
    read = lambda stem: json.loads((Path(out_dir) / f"{stem}.json").read_text())
    gloo, tp, shm = read("gloo_allreduce"), read("tensor_parallel"), read(
        "tensor_parallel_allreduce")
    loads = lambda runs: f"{min(r[0] for r in runs):.1f} to {max(r[0] for r in runs):.1f}"
    lines = [f"gloo, load average {loads([r['load_average'] for r in gloo['runs']])}:", "",
             "| message | all-reduce (median of the repeats' medians) |", "|---|---|"]
    lines += [f"| {size // 1024:,} KiB | {us:,.0f} us |"
              for size, us in zip(gloo["sizes"], gloo["median_us"].values())]
    lines += [f"| plan broadcast ({PLAN_BYTES:,} bytes) | {gloo['broadcast_us']:,.0f} us |",
              f"| bandwidth, 1 to 8 MiB | {gloo['bandwidth_GBps']:.2f} GB/s |", "",
              f"Decode steps, load average {loads([s['load_average'] for s in tp['steps']])}:",
              "", "| rows | TP=1, 2 threads | TP=1, 1 thread | outside the layers (2 threads) "
              "| TP=2 | rank 0's all-reduces in it | predicted, one machine (its all-reduces) | "
              "TP=2 against it | predicted, GPU model | TP=2 against it | TP=2 / TP=1, paired |",
              "|---" * 11 + "|"]
    lines += [f"| {r['rows']} | {r['TP=1']:.1f} ms | {r['TP=1 1 thread']:.1f} ms | "
              f"{r['outside_ms']:.1f} ms | {r['TP=2']:.1f} ms | {r['allreduce_in_step_ms']:.1f} ms "
              f"| {r['predicted']:.1f} ms ({r['parts_ms']['all-reduce']:.1f} ms) | "
              f"{r['error']:+.0%} | {r['predicted_own_memory']:.1f} ms | "
              f"{r['error_own_memory']:+.0%} | {r['reading']} |" for r in tp["table"]]
    shm_loads = [run["load_average"] for runs in shm["runs"].values() for run in runs]
    lines += ["", f"gloo against shared memory, load average {loads(shm_loads)}:", "",
              "| message | gloo | shared memory | gloo / shared memory, paired |", "|---" * 4 + "|"]
    lines += [f"| {r['bytes'] // 1024:,} KiB | {r['gloo']:,.0f} us | {r['shared memory']:,.1f} us "
              f"| {r['reading']} |" for r in shm["table"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("tensor-parallel", __doc__)
    parser.prog = "scripts/bench_tensor_parallel.py"
    add_flags(parser, "model", "random_model", "repeats", "out_dir", random_model="llama-100m")
    parser.add_argument("--collectives-only", action="store_true",
                        help="only gloo's all-reduce against a shared-memory one, at decode sizes")
    parser.add_argument("--markdown", action="store_true",
                        help="print the committed runs' tables for benchmarks/tensor_parallel.md")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(args.out_dir))
        return 0
    if args.collectives_only:
        announce("gloo's all-reduce against a shared-memory one between two processes")
        compare_collectives([rows * 1024 * 4 for rows in ROWS] + [1 << 20], args.repeats,
                            args.out_dir)
        return 0
    from minicb import LLM
    from minicb.bench.common import resolve_model

    path, label = resolve_model(args.model, args.random_model, "float32")
    announce(f"tensor parallelism on {label}: gloo, then TP=2 against TP=1 at {ROWS} rows")
    knobs = dict(max_model_len=256, max_num_seqs=max(ROWS), max_fused_decode_rows=0)
    engines = {"TP=1": LLM(path, cpu_threads=2, **knobs),
               "TP=1 1 thread": LLM(path, cpu_threads=1, **knobs),
               "TP=2": LLM(path, tensor_parallel_size=2, cpu_threads=1, **knobs)}
    model = engines["TP=1"].llm_engine.model
    a = model.args
    shape = ModelShape(label, sum(p.numel() for p in model.parameters()), a.num_layers,
                       a.hidden_size, a.num_kv_heads, a.head_dim, dtype_bytes=4)
    clocks = {name: LayerClock(engines[name].llm_engine.model.model.layers)
              for name in ("TP=1", "TP=1 1 thread")}
    clocks["TP=2"] = CollectiveClock()
    gloo, broadcast = gloo_record(list(GLOO_SIZES.values()), args.repeats, args.out_dir)
    steps = []
    for repeat, (name, llm) in alternate(args.repeats, list(engines.items())):
        for rows in ROWS:
            seconds, outside = decode_steps(llm, rows, clocks.get(name))
            steps.append({"repeat": repeat, "system": name, "rows": rows, "seconds": seconds,
                          "outside_clock": outside, "load_average": load_average()})
    engines["TP=2"].llm_engine.runner.shutdown()
    table = summarise(steps, shape, gloo, broadcast, args.repeats)
    print(format_table(table, COLUMNS))
    for row in table:
        print(f"{row['rows']} rows, TP=2 / TP=1: {row['reading']}")
    write_results(args.out_dir, "tensor_parallel",
                  {"model": label, "shape": shape.__dict__, "rows": ROWS, "gloo": gloo,
                   "broadcast": broadcast, "steps": steps, "table": table})
    return 0


def summarise(steps: list[dict], shape: ModelShape, gloo: tuple, broadcast: float,
              repeats: int) -> list[dict]:
    """Per row count: each system's median step (ms), the prediction and its error, and TP=2
    against TP=1 read by the book's rule (paired repeat by repeat)."""
    def of(system: str, rows: int, key: str = "seconds") -> list[float]:
        return [s[key] for s in steps if s["system"] == system and s["rows"] == rows]

    table = []
    for rows in ROWS:
        row = {"rows": rows, **{system: spread(of(system, rows))["median"] * 1e3
                                for system in SYSTEMS}}
        outside = statistics.median(of("TP=1", rows, "outside_clock"))
        parts = predict(row["TP=1"] / 1e3, outside, broadcast, shape, rows, gloo)
        outside_one = statistics.median(of("TP=1 1 thread", rows, "outside_clock"))
        gpu_like = predict(row["TP=1 1 thread"] / 1e3, outside_one, broadcast, shape, rows, gloo,
                           one_machine=False)
        in_step = row["TP=2"] - statistics.median(of("TP=2", rows, "outside_clock")) * 1e3
        row.update({"outside_ms": outside * 1e3, "parts_ms": {k: v * 1e3 for k, v in parts.items()},
                    "predicted": sum(parts.values()) * 1e3, "allreduce_in_step_ms": in_step,
                    "predicted_own_memory": sum(gpu_like.values()) * 1e3,
                    "parts_own_memory_ms": {k: v * 1e3 for k, v in gpu_like.items()}})
        row["error"] = row["TP=2"] / row["predicted"] - 1
        row["error_own_memory"] = row["TP=2"] / row["predicted_own_memory"] - 1
        ratios = [a / b for a, b in zip(of("TP=2", rows), of("TP=1", rows))]
        row.update({"ratios": ratios, "ratio": statistics.median(ratios),
                    "reading": reading(ratios, "TP=2 slower", "TP=2 faster")})
        table.append(row)
    return table


COLUMNS = [("rows", "rows", "d"), ("TP=1", "TP=1 ms", ".1f"),
           ("TP=1 1 thread", "1 thread ms", ".1f"), ("outside_ms", "outside layers ms", ".1f"),
           ("TP=2", "TP=2 ms", ".1f"), ("allreduce_in_step_ms", "its all-reduces ms", ".1f"),
           ("predicted", "predicted ms", ".1f"), ("error", "TP=2 vs prediction", "+.0%"),
           ("predicted_own_memory", "GPU model ms", ".1f"),
           ("error_own_memory", "TP=2 vs GPU model", "+.0%"), ("ratio", "TP=2 / TP=1", ".2f")]


if __name__ == "__main__":
    raise SystemExit(main())

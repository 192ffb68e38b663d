"""Tensor parallelism on this CPU: gloo's all-reduce at a decode step's sizes, then a two-rank
engine's decode step against one rank's, beside the prediction from the measured gloo figures.

Expected before measuring: on a 2-core machine, TP = 2 is not faster. One rank with two threads
and two ranks with one thread each split the same arithmetic over the same two cores, and the
split adds 2 x layers all-reduces and one broadcast of the plan per step (vLLM measured TP = 2
through torch.distributed on a CPU at 196% of TP = 1's time per token).

Two predictions, each a one-rank step on the same path (the torch modules with the small-batch
kernel, no fused decode layer) plus 2 x layers all-reduces of rows x hidden_size float32 values
and one plan broadcast, each at its measured median:

* "same cores": the one-rank step with two threads. Two ranks of one thread each do the same
  arithmetic on the same two cores, so the split can only add its communication.
* "per rank": half the one-rank step with one thread: each rank computes half the layers' work
  on a core of its own. It holds where two threads of one process lose to two processes (a busy
  machine: a thread descheduled at a barrier stalls its partner, minicb/runner/threads.py).

The default one-rank engine (the fused decode layer, two threads) is measured beside them.

    .venv/bin/python scripts/bench_tensor_parallel.py --random-model llama-100m --repeats 5

(A script beside the package rather than a `minicb bench` command: minicb/bench is capped.)
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.multiprocessing as mp

from minicb.bench.harness import (
    add_flags,
    alternate,
    announce,
    bench_parser,
    format_table,
    spread,
    write_results,
)
from minicb.bench.machine import load_average

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


def _peer(port: int, sizes: list[int], iterations: int, repeats: int) -> None:
    from minicb.engine.tp_group import TPGroup

    torch.set_num_threads(1)
    group = TPGroup(1, 2, port, "cpu")
    group.connect()
    for _ in range(repeats):
        _collectives(group, sizes, iterations)


def measure_collectives(sizes: list[int], repeats: int) -> list[dict[str, float]]:
    """gloo between this process and a spawned one: per repeat, each size's median time."""
    from minicb.engine.tp_group import TPGroup, master_store

    store = master_store(2)
    peer = mp.get_context("spawn").Process(target=_peer, daemon=True,
                                           args=(store.port, sizes, ITERATIONS, repeats))
    peer.start()
    group = TPGroup(0, 2, store.port, "cpu", store)
    group.connect()
    results = [_collectives(group, sizes, ITERATIONS) for _ in range(repeats)]
    peer.join(timeout=60)
    return results


def decode_step_seconds(llm, rows: int, steps: int = STEPS) -> float:
    """Median seconds of a decode step of `rows` rows (every row decoding, prompts done)."""
    from minicb import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    for row in range(rows):
        engine.add_request(f"{time.monotonic_ns()}-{row}", [5 + row, 6, 7, 8], params)
    engine.step()                                     # the prompts
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:-1])


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("tensor-parallel", __doc__)
    parser.prog = "scripts/bench_tensor_parallel.py"
    add_flags(parser, "model", "random_model", "repeats", "out_dir", random_model="llama-100m")
    args = parser.parse_args(argv)
    from minicb import LLM
    from minicb.bench.common import resolve_model

    path, label = resolve_model(args.model, args.random_model, "float32")
    announce(f"tensor parallelism on {label}: gloo, then TP=2 against TP=1 at {ROWS} rows")
    knobs = dict(max_model_len=256, max_num_seqs=max(ROWS), cpu_threads=2)
    one_thread = {**knobs, "cpu_threads": 1}
    engines = {"TP=1 fused": LLM(path, **knobs),
               "TP=1 torch": LLM(path, max_fused_decode_rows=0, **knobs),
               "TP=1 torch 1 thread": LLM(path, max_fused_decode_rows=0, **one_thread),
               "TP=2": LLM(path, tensor_parallel_size=2, **one_thread)}
    hidden = engines["TP=1 torch"].llm_engine.model.args.hidden_size
    layers = engines["TP=1 torch"].llm_engine.model.args.num_layers
    sizes = [rows * hidden * 4 for rows in ROWS] + [1 << 20, 8 << 20]
    collectives = measure_collectives(sizes, args.repeats)
    steps = []
    for repeat, (name, llm) in alternate(args.repeats, list(engines.items())):
        for rows in ROWS:
            steps.append({"repeat": repeat, "system": name, "rows": rows,
                          "seconds": decode_step_seconds(llm, rows),
                          "load_average": load_average()})
    engines["TP=2"].llm_engine.runner.shutdown()
    table = summarise(steps, collectives, sizes, hidden, layers)
    print(format_table(table, COLUMNS))
    write_results(args.out_dir, "tensor_parallel",
                  {"model": label, "rows": ROWS, "collectives": collectives, "sizes": sizes,
                   "steps": steps, "table": table})
    return 0


def summarise(steps: list[dict], collectives: list[dict], sizes: list[int], hidden: int,
              layers: int) -> list[dict]:
    """Per row count: each system's median step (ms), the prediction and its error."""
    def collective(key: str) -> float:
        return statistics.median(r[key] for r in collectives)

    table = []
    for rows in ROWS:
        row = {"rows": rows}
        for system in SYSTEMS:
            row[system] = spread(s["seconds"] for s in steps
                                 if s["system"] == system and s["rows"] == rows)["median"] * 1e3
        allreduce = collective(f"allreduce {rows * hidden * 4}")
        row["allreduce_us"] = allreduce * 1e6
        communication = (2 * layers * allreduce + collective("broadcast")) * 1e3
        row["same cores"] = row["TP=1 torch"] + communication
        row["per rank"] = row["TP=1 torch 1 thread"] / 2 + communication
        for name in ("same cores", "per rank"):
            row[f"{name} error"] = row["TP=2"] / row[name] - 1
        row["ratio"] = row["TP=2"] / row["TP=1 torch"]
        table.append(row)
    return table


SYSTEMS = ("TP=1 fused", "TP=1 torch", "TP=1 torch 1 thread", "TP=2")
COLUMNS = [("rows", "rows", "d"), ("TP=1 fused", "TP=1 fused ms", ".1f"),
           ("TP=1 torch", "TP=1 torch ms", ".1f"), ("TP=1 torch 1 thread", "1 thread ms", ".1f"),
           ("TP=2", "TP=2 ms", ".1f"), ("allreduce_us", "all-reduce us", ".0f"),
           ("same cores", "same cores ms", ".1f"), ("same cores error", "TP=2 vs it", "+.0%"),
           ("per rank", "per rank ms", ".1f"), ("per rank error", "TP=2 vs it", "+.0%"),
           ("ratio", "TP=2 / TP=1 torch", ".2f")]


if __name__ == "__main__":
    raise SystemExit(main())

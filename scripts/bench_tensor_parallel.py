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


class SharedMemoryAllReduce:
    """Two ranks on one host summing through shared memory (the idea of vLLM's CPU all-reduce):
    each rank copies its tensor into its own slot, raises its flag to the call's number, waits
    (spinning) for the other's flag, then adds the two slots in rank order, the same sum on both
    ranks. Slots alternate between two buffers, so a fast rank never overwrites a slot that the
    other is still reading: it waits for the other's next flag before it writes that buffer
    again."""

    def __init__(self, rank: int, slots: torch.Tensor, flags: torch.Tensor):
        self.rank, self.slots, self.flags = rank, slots, flags.numpy()
        self.calls = 0

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self.calls += 1
        buffer, n = self.slots[self.calls % 2], tensor.numel()
        buffer[self.rank, :n].copy_(tensor)
        self.flags[self.rank] = self.calls              # after the data: x86 keeps store order
        while self.flags[1 - self.rank] < self.calls:
            pass
        torch.add(buffer[0, :n], buffer[1, :n], out=tensor)


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
    median time."""
    from minicb.engine.tp_group import TPGroup, master_store

    if kind == "gloo":
        store = master_store(2)
        link = store.port
    else:
        link = (torch.zeros(2, 2, max(sizes) // 4).share_memory_(),
                torch.zeros(2, dtype=torch.int64).share_memory_())
    peer = mp.get_context("spawn").Process(target=_peer, daemon=True,
                                           args=(kind, link, sizes, ITERATIONS, repeats))
    peer.start()
    if kind == "gloo":
        group = TPGroup(0, 2, store.port, "cpu", store)
        group.connect()
    else:
        group = SharedMemoryAllReduce(0, *link)
    results = [_collectives(group, sizes, ITERATIONS) for _ in range(repeats)]
    peer.join(timeout=60)
    return results


def compare_collectives(sizes: list[int], repeats: int, out_dir: str) -> None:
    """gloo's all-reduce against the shared-memory one, a run of each per repeat, alternated."""
    runs = {"gloo": [], "shared memory": []}
    for _, kind in alternate(repeats, list(runs)):
        runs[kind] += measure_collectives(sizes, 1, "gloo" if kind == "gloo" else "shm")
    table = []
    for size in sizes:
        key = f"allreduce {size}"
        row = {"bytes": size, **{kind: statistics.median(r[key] for r in results) * 1e6
                                 for kind, results in runs.items()}}
        row["gain"] = row["gloo"] / row["shared memory"]
        table.append(row)
    print(format_table(table, [("bytes", "message bytes", "d"), ("gloo", "gloo us", ".0f"),
                               ("shared memory", "shared memory us", ".1f"),
                               ("gain", "gloo / shared memory", ".1f")]))
    write_results(out_dir, "tensor_parallel_allreduce", {"runs": runs, "table": table,
                                                          "load_average": load_average()})


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
    parser.add_argument("--collectives-only", action="store_true",
                        help="only gloo's all-reduce against a shared-memory one, at decode sizes")
    args = parser.parse_args(argv)
    if args.collectives_only:
        announce("gloo's all-reduce against a shared-memory one between two processes")
        compare_collectives([rows * 1024 * 4 for rows in ROWS] + [1 << 20], args.repeats,
                            args.out_dir)
        return 0
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

"""Expert parallelism on this CPU: an MoE model's decode step split over two ranks (half the
experts each, attention and the dense parts tensor-parallel) against one rank with two threads.

Expected before measuring: on a 2-core machine, EP = 2 is not faster. Both runs spread the same
arithmetic over the same two cores, and the split adds two all-reduces a layer and the plan's
broadcast every step, over gloo (about a third of a millisecond each at a decode step's sizes on
this machine: benchmarks/tensor_parallel.md). A rank reads only its half of the experts, which
pays where a step is bound by reading weights: not here, where a small model's experts sit in
the caches. What the split is for is memory and bandwidth across devices, which one host lacks.

Both engines run the torch experts (the path a rank of an expert-parallel group takes) on the
random Qwen3-MoE of `python -m minicb bench moe` (64 experts, top-8, hidden 256, 4 layers).
Both are built first and stay up; each repeat decodes `--steps` steps of each at every row
count, the order alternating between repeats, the load average beside each run; the ratios are
read by the book's rule (minicb.repeats).

    .venv/bin/python scripts/bench_expert_parallel.py --repeats 5 --rows 1 8

(A script beside the package rather than a `minicb bench` command: minicb/bench is capped.)
"""

from __future__ import annotations

import argparse
import tempfile

from minicb.bench.harness import alternate, announce, write_results
from minicb.bench.machine import load_average
from minicb.bench.moe import build, decode
from minicb.repeats import Repeats

SETTINGS = dict(attention="torch", max_model_len=256, max_num_batched_tokens=512)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--out-dir", default="benchmarks/results")
    args = p.parse_args()
    model = argparse.Namespace(experts=64, top_k=8, hidden=256, layers=4, seed=0)
    announce(f"expert parallelism: EP=2 against EP=1, rows {args.rows}, {args.repeats} repeats")

    from minicb import LLM

    path = build(tempfile.mkdtemp(prefix="minicb-ep-"), model)
    seqs = max(args.rows)
    engines = {"ep1": LLM(path, max_num_seqs=seqs, cpu_threads=2, **SETTINGS),
               "ep2": LLM(path, max_num_seqs=seqs, tensor_parallel_size=2, **SETTINGS)}
    runs = []
    try:
        for repeat, name in alternate(args.repeats, list(engines)):
            for rows in args.rows:
                before = load_average()[0]
                seconds = decode(engines[name], rows, args.steps, seed=repeat)
                runs.append({"system": name, "repeat": repeat, "rows": rows,
                             "step_ms": 1e3 * seconds / args.steps,
                             "load": [before, load_average()[0]]})
                print(f"repeat {repeat} {name} {rows:>2} rows: {runs[-1]['step_ms']:.2f} ms/step "
                      f"(load {before:.1f})", flush=True)
    finally:
        engines["ep2"].llm_engine.runner.shutdown()
    summary = []
    for rows in args.rows:
        mine = {name: [r["step_ms"] for r in runs if r["system"] == name and r["rows"] == rows]
                for name in engines}
        ratio = Repeats.of(two / one for one, two in zip(mine["ep1"], mine["ep2"], strict=True))
        summary.append({"rows": rows, "ep1_step_ms": sorted(mine["ep1"]),
                        "ep2_step_ms": sorted(mine["ep2"]), "ep2_over_ep1": ratio.values,
                        "reading": ratio.describe("EP=2 slower", "EP=2 faster")})
        print(f"{rows} rows, EP=2 / EP=1 time per step: {summary[-1]['reading']}")
    loads = [x for r in runs for x in r["load"]]
    write_results(args.out_dir, "expert-parallel", {
        "benchmark": "expert-parallel", "model": vars(model), "settings": SETTINGS,
        "steps": args.steps, "repeats": args.repeats, "load_range": [min(loads), max(loads)],
        "runs": runs, "summary": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

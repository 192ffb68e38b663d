"""The Python around a decode step: everything `LLMEngine.step()` does besides the model's forward.

    python scripts/bench_step_python.py [--rows 1 16] [--steps 200] [--repeats 5]

For each decode batch size, the default model's engine serves that many greedy requests past
their prefill, then times `steps` decode steps: the whole step and, inside it, the model's
forward, both in CPU time of this process (every thread), so a neighbour holding a core does not
inflate them. The difference is the per-step Python: scheduling, packing the batch, sampling,
applying the results and building the outputs. Prints one JSON line per (rows, repeat).

Run it twice side by side on two versions of minicb (PYTHONPATH=<other checkout>), alternating,
to compare them in one run on one machine (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def measure(rows: int, steps: int, context: int = 20) -> dict:
    from minicb import LLM, SamplingParams

    llm = LLM(scheduler="continuous", max_num_seqs=max(rows, 1), max_model_len=context + steps + 8,
              cpu_threads=1)
    engine = llm.llm_engine
    forward = engine.runner.forward     # the model's forward, or the fused decode layer's
    spent = [0.0]

    def timed_forward(*args, **kwargs):
        start = time.process_time()
        try:
            return forward(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - start

    engine.runner.forward = timed_forward
    vocab = engine.vocab_size
    for index in range(rows):
        prompt = [(7 * index + 3 * j) % (vocab - 3) + 3 for j in range(context)]
        engine.add_request(str(index), prompt,
                           SamplingParams(max_tokens=steps + 4, temperature=0, ignore_eos=True))
    for _ in range(3):      # the prefill, then two decode steps to warm up
        engine.step()
    step_times, python_times = [], []
    for _ in range(steps):
        spent[0] = 0.0
        start = time.process_time()
        engine.step()
        total = time.process_time() - start
        step_times.append(total)
        python_times.append(total - spent[0])
    return {"rows": rows, "step_us": 1e6 * statistics.median(step_times),
            "python_us": 1e6 * statistics.median(python_times),
            "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for rows in args.rows:
        print(json.dumps({"label": args.label, **measure(rows, args.steps)}), flush=True)


if __name__ == "__main__":
    main()

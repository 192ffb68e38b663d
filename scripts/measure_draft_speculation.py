#!/usr/bin/env python
"""Batch-1 speed of the shipped model with each proposer, on held-out code prompts.

One request at a time (max_num_seqs=1), greedy, so the three systems emit the same tokens:
no speculation, prompt lookup (`ngram`) and the shipped draft (`draft_model`). The systems take
turns, round after round, and each is timed over the whole prompt set per round; the output is
tokens/s per system, its ratio to no speculation, the acceptance rate and the mean accepted
length, with the machine's load average before and after.

Usage::

    python scripts/measure_draft_speculation.py --prompts 12 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS.parent))
import evaluate_default_model as E  # noqa: E402  (the held-out docstring prompts)

from minicb import LLM, SamplingParams  # noqa: E402

SYSTEMS = {"none": {}, "ngram": dict(speculative_method="ngram"),
           "draft_model": dict(speculative_method="draft_model")}


def code_prompts(count: int) -> list[str]:
    log = json.loads((Path(E.DEFAULT_MODEL) / "training_log.json").read_text())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = {rel: (stdlib / rel).read_text(encoding="utf-8")
             for rel in log["data"]["val_file_list"] if (stdlib / rel).exists()}
    return [q["text"] for q in E.spread(E.docstring_prompts(files), count)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens of both proposers")
    args = p.parse_args(argv)
    prompts = code_prompts(args.prompts)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    llms = {name: LLM(max_num_seqs=1, **knobs, **({"num_speculative_tokens": args.k}
                                                   if knobs else {}))
            for name, knobs in SYSTEMS.items()}
    for llm in llms.values():                      # warm-up: kernels compiled, caches touched
        llm.generate(prompts[:1], params, use_tqdm=False)
    load_before = os.getloadavg()
    seconds = {name: [] for name in llms}
    outputs = {}
    for _ in range(args.rounds):
        for name, llm in llms.items():
            start = time.perf_counter()
            outputs[name] = llm.generate(prompts, params, use_tqdm=False)
            seconds[name].append(time.perf_counter() - start)
    load_after = os.getloadavg()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs["none"])
    same = all([o.outputs[0].token_ids for o in outputs[name]] ==
               [o.outputs[0].token_ids for o in outputs["none"]] for name in llms)
    base = tokens / min(seconds["none"])
    print(f"{len(prompts)} prompts, {tokens} output tokens per round, best of {args.rounds} "
          f"rounds, k={args.k}; identical outputs: {same}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(f"{'system':<12} {'tokens/s':>9} {'vs none':>8} {'accept':>7} {'tokens/step':>12}")
    for name in llms:
        rate = tokens / min(seconds[name])
        proposed = sum(o.metrics.num_proposed_tokens for o in outputs[name])
        accepted = sum(o.metrics.num_accepted_tokens for o in outputs[name])
        steps = sum(o.metrics.num_verify_steps for o in outputs[name])
        accept = f"{accepted / proposed:.2f}" if proposed else "-"
        per_step = f"{(accepted + steps) / steps:.2f}" if steps else "-"
        print(f"{name:<12} {rate:>9.1f} {rate / base:>8.2f} {accept:>7} {per_step:>12}")


if __name__ == "__main__":
    main()

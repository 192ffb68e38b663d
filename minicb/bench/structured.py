"""`python -m minicb bench structured`: what grammar masks and penalties cost per step, and what
they do to tokens/s, on the shipped model and this CPU.

    python -m minicb bench structured              # batch 1, 16, 64; 5 repeats
    python -m minicb bench structured --quick      # one repeat, fewer tokens

1. Per step, at B rows: the time of the logits processors' hook (minicb.runner.logits_process) on
   [B, vocab] float32 logits, for each kind alone, beside the sampler without them and the
   model's own decode step at B (the engine has no overlapped scheduling: everything here is on
   the critical path between two forwards). Kinds: `mask` (every row under a JSON schema, its
   matcher inside the document, as xgrammar fills the bitmask and the hook applies it),
   `penalties` (presence, frequency and repetition, 32 output tokens counted), `bias_min_p`
   (a logit_bias of 8 tokens and min_p at temperature 1).
2. End to end: LLM.generate of B requests at once, greedy, 64 tokens at most: `plain`,
   `json_schema` (the same prompts under a JSON schema, whitespace limited, stopping where the
   document ends) and `penalties`; output tokens/s, and its ratio to `plain` within each repeat.

Each repeat measures every kind (and method) in a rotated order, so a change in the machine's
load falls on all of them; the summary is the median over repeats and the spread (min, max).

The JSON's fields are listed in benchmarks/structured.md ("The JSON").
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from minicb import LLM, SamplingParams, default_model_path
from minicb.bench.harness import (
    add_flags,
    alternate,
    bench_parser,
    load_average,
    reading,
    spread,
    turn_order,
    verdict,
    write_results,
)
from minicb.params import StructuredOutputsParams
from minicb.runner.logits_process import LogitsState, apply_logits_processors
from minicb.runner.sampler import Sampler

SCHEMA = {"type": "object", "properties": {
    "module": {"type": "string", "enum": ["os", "sys", "json", "re", "math"]},
    "version": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"enum": ["io", "text", "math"]}, "maxItems": 3},
    "stable": {"type": "boolean"}},
    "required": ["module", "version", "tags", "stable"], "additionalProperties": False}
PREFIX = '{"module": "os", "version": 1, "tags": ["io", '     # where each row's matcher stands
PROMPTS = ["import os\n", "def main(", "class Config:\n", "import json\nvalue = ",
           "for name in ", "with open(path) as f:\n", "from typing import ", "try:\n    import "]
KINDS = {"mask": dict(structured_outputs=StructuredOutputsParams(json=SCHEMA)),
         "penalties": dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2),
         "bias_min_p": dict(logit_bias={t: 5.0 for t in range(100, 108)}, min_p=0.05,
                            temperature=1.0)}
METHODS = {"plain": {}, "json_schema": dict(structured_outputs=StructuredOutputsParams(
    json=SCHEMA, disable_any_whitespace=True)),
    "penalties": KINDS["penalties"]}


def _states(llm: LLM, params: SamplingParams, rows: int) -> list[LogitsState]:
    """Each row's state as the engine keeps it, part way through an output."""
    engine = llm.llm_engine
    states = []
    for row in range(rows):
        matcher = (engine.structured.matcher(params.structured_outputs)
                   if params.structured_outputs is not None else None)
        state = LogitsState(params, engine.tokenizer.encode(PROMPTS[row % len(PROMPTS)]),
                            engine.vocab_size, engine.eos_token_ids, matcher)
        tokens = (engine.tokenizer.encode(PREFIX) if state.matcher is not None
                  else [(row * 37 + i * 11) % engine.vocab_size for i in range(32)])
        for token in tokens:
            assert state.accept(token)
        states.append(state)
    return states


def _time_ms(call, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def step_costs(llm: LLM, rows: int, calls: int) -> dict[str, float]:
    """ms per call at `rows` rows: each kind's hook, the sampler alone, and the model's decode."""
    engine = llm.llm_engine
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, engine.vocab_size, generator=generator)
    costs = {}
    for kind, fields in KINDS.items():
        params = [SamplingParams(max_tokens=64, **fields)] * rows
        states = _states(llm, params[0], rows)
        costs[kind] = _time_ms(lambda p=params, s=states: apply_logits_processors(logits, p, s),
                               calls)
    plain = [SamplingParams(temperature=1.0)] * rows
    generators = [torch.Generator().manual_seed(i) for i in range(rows)]
    costs["sampler"] = _time_ms(lambda: Sampler()(logits, plain, generators), calls)
    costs["decode_step"] = decode_step_ms(llm, rows)
    return costs


def decode_step_ms(llm: LLM, rows: int) -> float:
    """The median engine step (model and all) while `rows` requests decode together."""
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    for row in range(rows):
        engine.add_request(f"step-{row}", PROMPTS[row % len(PROMPTS)], params)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[len(times) // 3:])   # past the prefills


def generate_run(llm: LLM, method: str, rows: int, max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, **METHODS[method])
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(rows)]
    load = load_average()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    duration = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    stopped = [o.outputs[0].text for o in outputs if o.outputs[0].finish_reason == "stop"]
    return {"output_tokens": tokens, "duration_s": duration, "tokens_per_s": tokens / duration,
            "load_average": load, "stopped": len(stopped),
            # under the schema, every output that stopped by itself is a JSON document
            "stopped_and_parsed": sum(_parses(text) for text in stopped)}


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def summarise(steps: list[dict], runs: list[dict], batch_sizes: list[int]) -> dict:
    summary = {}
    for rows in batch_sizes:
        at = [s for s in steps if s["batch_size"] == rows]
        ms = {kind: statistics.median(s["ms"] for s in at if s["kind"] == kind)
              for kind in [*KINDS, "sampler", "decode_step"]}
        entry = {"ms": ms, "share_of_decode_step": {
            kind: ms[kind] / ms["decode_step"] for kind in [*KINDS, "sampler"]}, "ratio": {}}
        repeats = sorted({r["repeat"] for r in runs})
        for method in METHODS:
            if method == "plain":
                continue
            ratios = []
            for repeat in repeats:
                by = {r["method"]: r for r in runs if r["repeat"] == repeat
                      and r["batch_size"] == rows}
                ratios.append(by[method]["tokens_per_s"] / by["plain"]["tokens_per_s"])
            entry["ratio"][method] = {**spread(ratios), "ratios": ratios,
                                      "verdict": verdict(ratios, "faster", "slower"),
                                      "reading": reading(ratios, "faster", "slower")}
        summary[str(rows)] = entry
    return summary


def main(argv: list[str]) -> int:
    parser = bench_parser("structured", __doc__)
    parser.add_argument("--batch-sizes", default="1,16,64")
    add_flags(parser, "repeats")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=50, help="timed calls per step cost")
    parser.add_argument("--quick", action="store_true", help="one repeat, 16 tokens")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.max_tokens, args.calls = 1, 16, 10
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    llm = LLM(default_model_path(), max_num_seqs=max(batch_sizes), max_model_len=256)
    llm.generate(PROMPTS[:2], SamplingParams(max_tokens=4, **METHODS["json_schema"]),
                 use_tqdm=False)                       # compile the schema, warm everything
    steps, runs = [], []
    for repeat, rows in alternate(args.repeats, batch_sizes):
        costs = step_costs(llm, rows, args.calls)
        steps += [{"repeat": repeat, "batch_size": rows, "kind": kind, "ms": ms,
                   "calls": args.calls} for kind, ms in costs.items()]
        for method in turn_order(list(METHODS), repeat):     # a rotated order in each repeat
            runs.append({"repeat": repeat, "batch_size": rows, "method": method,
                         **generate_run(llm, method, rows, args.max_tokens)})
        print(f"repeat {repeat} B={rows}: " + ", ".join(
            f"{k} {v:.3f} ms" for k, v in costs.items()), flush=True)
    summary = summarise(steps, runs, batch_sizes)
    settings = {"batch_sizes": batch_sizes, "repeats": args.repeats,
                "max_tokens": args.max_tokens, "calls": args.calls, "schema": SCHEMA,
                "matcher_prefix": PREFIX, "kinds": {k: repr(v) for k, v in KINDS.items()},
                "threads": torch.get_num_threads(), "overlap": False}
    path, _ = write_results(args.out, "structured-quick" if args.quick else "structured",
                            {"settings": settings, "steps": steps, "generate": runs,
                             "summary": summary})
    for rows, entry in summary.items():
        shares = ", ".join(f"{k} {v:.1%}" for k, v in entry["share_of_decode_step"].items())
        ratios = ", ".join(f"{m} x{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}] {r['verdict']}"
                           for m, r in entry["ratio"].items())
        print(f"B={rows}: decode step {entry['ms']['decode_step']:.2f} ms; share: {shares}; "
              f"tokens/s vs plain: {ratios}")
    print(f"wrote {path}")
    return 0

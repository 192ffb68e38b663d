"""`python -m minicb bench speculative`: tokens/s and TPOT with and without speculative decoding.

    python -m minicb bench speculative                  # both workloads, batch 1-64, 3 repeats
    python -m minicb bench speculative --quick          # one repeat, shorter answers
    python -m minicb bench speculative --peers vllm     # vLLM's CPU build beside it (n-gram)

Each proposer (`ngram`, `draft_model`) is run against no speculation (`none`) on the same
prompts, at each batch size B (B requests at once, all with the same output length, in waves of
B until at least `--min-requests` are served), taking the methods in a rotated order in each
repeat. Greedy, end-of-sequence ignored, so every run does the same work and every output can be
compared token for token: with no speculation, and with transformers' `generate` on the first
few prompts of each workload. The A100 curve is a PREDICTION (`minicb.bench.spec_model`).

The JSON (`benchmarks/results/speculative.json`; `--quick` adds `-quick` to the name):

- `machine`, `model` (`path`, `draft_path`), `settings` (k, n-gram sizes, output length,
  batch sizes, repeats, threads), `workloads` (per name: requests drawn, prompt token range);
- `runs`: one row per system x workload x method x batch size x repeat: `system` ("minicb" |
  "vllm"), `workload` ("code" | "random"), `method` ("none" | "ngram" | "draft_model"),
  `batch_size`, `repeat`, `requests`, `output_tokens`, `duration_s`, `output_throughput`
  (tokens/s), `tpot_p50_ms`, `tpot_mean_ms`, `steps` (minicb: model steps, of which
  `decode_steps` held decodes only and `other_steps` prompt or verification tokens, with the
  median CPU ms of each, `decode_step_ms` and `other_step_ms`), `proposed_tokens`,
  `accepted_tokens`, `verify_steps`, `acceptance_rate`, `mean_accepted_length` (tokens a
  verification step emitted, the target's own included), `tokens_per_step` (minicb: {tokens a
  request gained in one step: how often}, its first token left out), `load_average` (1, 5, 15
  minutes, read before the run), `differs_from_none` (requests whose tokens differ from the same
  system's `none` run of that repeat; null for `none` itself), `differs_from_transformers`;
- `summary`: per system x workload x method (not none) x batch size: `speedup` (median over
  repeats of tokens/s with / without, each ratio within one repeat), `speedups`, `tpot_ratio`,
  `acceptance_rate`, `mean_accepted_length`, `greedy_equal` (no request differed, any repeat);
- `break_even`: per system x workload x method, `stops_paying_at`: the batch size from which the
  speedup stays below 1 (0 when it never paid; null when it still paid at the largest size
  measured), and `paid_at`: the sizes where it paid;
- `predictions`: a list, the A100 first, then this book's reference CPU: `label` (starts with
  "PREDICTION"), `cost_model`, `terms`, `draft_weight_share`, `context_tokens`, `rows`
  (workload, method, batch_size, speedup, `extrapolated`, and the measured rates priced:
  `tokens_per_step`, `verify_share`, `proposed_per_verify`) and `break_even` as above.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

from minicb.bench.agreement import compare_outputs
from minicb.bench.common import display_path, load_hf_model, log_model_steps
from minicb.bench.harness import RESULTS_DIR, format_table, write_results
from minicb.bench.machine import describe, machine_info
from minicb.bench.spec_model import break_even, markdown_tables, predictions, summarize_runs
from minicb.config import SPECULATIVE_METHODS
from minicb.workload import code_completion, fixed

METHODS = ("none", "ngram", "draft_model")
WORKLOADS = ("code", "random")
# vLLM's knobs for the same proposer, as it is run here (vLLM names; minicb's are the same)
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
              "prompt_lookup_min": 2}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m minicb bench speculative",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="target checkpoint (default: the shipped model)")
    p.add_argument("--methods", nargs="+", default=list(METHODS[1:]), choices=METHODS[1:])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 16, 64])
    p.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--output-len", type=int, default=None, help="default 128 (64 with --quick)")
    p.add_argument("--min-requests", type=int, default=None,
                   help="requests served at each batch size, at least (default 8, 4 with --quick)")
    p.add_argument("--reference-prompts", type=int, default=4,
                   help="prompts per workload also generated by transformers (0: none)")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--peers", nargs="+", default=[], choices=["vllm"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--quick", action="store_true", help="one repeat, shorter answers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=str(RESULTS_DIR))
    p.add_argument("--table", metavar="JSON", default=None,
                   help="run nothing: print the markdown tables of an earlier run's JSON")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.output_len = args.output_len or (64 if args.quick else 128)
    args.min_requests = args.min_requests or (4 if args.quick else 8)
    if min(args.batch_sizes) < 1:
        p.error(f"--batch-sizes must be >= 1 (got {args.batch_sizes})")
    return args


def make_prompts(name: str, tokenizer, vocab_size: int, n: int, seed: int) -> list[list[int]]:
    """n prompts as token ids: standard-library functions to continue, or random tokens."""
    if name == "code":
        return [tokenizer.encode(t) for t in code_completion(n, seed).extra["texts"]]
    return fixed("random", [64] * n, [1] * n).prompt_token_ids(vocab_size, seed=seed)


def engine_knobs(method: str, args) -> dict:
    knobs = dict(scheduler="continuous", kv_cache="paged", max_num_seqs=max(args.batch_sizes),
                 cpu_threads=args.threads)
    if method != "none":
        knobs.update(speculative_method=method,
                     num_speculative_tokens=args.num_speculative_tokens)
    return knobs


def requests_at(batch_size: int, min_requests: int) -> int:
    """Whole waves of batch_size requests, at least min_requests in all."""
    return batch_size * -(-min_requests // batch_size)


def serve(llm, steps: list, prompts: list[list[int]], output_len: int, batch_size: int) -> tuple:
    """Serve `prompts` in waves of `batch_size`; return (outputs, row of measurements)."""
    from minicb import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    steps.clear()
    load = list(Path("/proc/loadavg").read_text().split()[:3])
    results, start = [], time.perf_counter()
    for first in range(0, len(prompts), batch_size):
        results += llm.generate(prompts[first:first + batch_size], params, use_tqdm=False)
    duration = time.perf_counter() - start
    metrics = [r.metrics for r in results]
    row = measurements(metrics, duration)
    # a step of decodes only runs the fused C decode layer on a CPU; a step with prompt or
    # verification tokens runs the torch modules: their CPU times, apart
    decode = [cpu for cpu, tokens, _ in steps if tokens == 0]
    other = [cpu for cpu, tokens, _ in steps if tokens > 0]
    row.update(steps=len(steps), decode_steps=len(decode), other_steps=len(other),
               decode_step_ms=statistics.median(decode) * 1e3 if decode else None,
               other_step_ms=statistics.median(other) * 1e3 if other else None,
               load_average=[float(x) for x in load], tokens_per_step=tokens_per_step(metrics))
    return [r.outputs[0].token_ids for r in results], row


def measurements(metrics: list, duration: float) -> dict:
    """What every system's run reports: throughput, TPOT, and what speculation proposed and kept."""
    from minicb.metrics import summarize

    s = summarize(metrics)
    proposed = sum(m.num_proposed_tokens for m in metrics)
    accepted = sum(m.num_accepted_tokens for m in metrics)
    verify = sum(m.num_verify_steps for m in metrics)
    tpots = [m.tpot for m in metrics if m.tpot is not None]
    return {"requests": len(metrics), "output_tokens": s.output_tokens, "duration_s": duration,
            "output_throughput": s.output_tokens / duration, "tpot_p50_ms": s.tpot["p50"] * 1e3,
            "tpot_mean_ms": statistics.fmean(tpots) * 1e3 if tpots else None,
            "proposed_tokens": proposed, "accepted_tokens": accepted, "verify_steps": verify,
            "acceptance_rate": accepted / proposed if proposed else None,
            "mean_accepted_length": (accepted + verify) / verify if verify else None}


def tokens_per_step(metrics: list) -> dict[str, int]:
    """How many tokens a request gained in each step it gained any (its first token, from the
    prompt's step, left out): 1 is a plain decode or a verification that kept no proposal."""
    counts: Counter = Counter()
    for m in metrics:
        counts.update(Counter(Counter(m.token_steps[1:]).values()))
    return {str(k): counts[k] for k in sorted(counts)}


def start_minicb(args, model_path: str, prompts: dict, methods: list[str]) -> dict:
    """One warmed-up engine per method, with its model steps logged: {method: (llm, log)}."""
    from minicb import LLM, SamplingParams

    engines = {}
    # warm-up: a few steps of each kind (prefill, decode, verification) before anything is timed
    warm = [p[i] for p in prompts.values() for i in range(2)]
    for method in methods:
        llm = LLM(model_path, **engine_knobs(method, args))
        llm.generate(warm, SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)
        engines[method] = (llm, log_model_steps(llm.llm_engine))
    return engines


def run_minicb(args, engines: dict, prompts: dict, repeat: int, reference: dict) -> list:
    """One repeat: every workload and batch size, the methods in an order rotated by repeat."""
    methods = list(engines)
    order = methods[repeat % len(methods):] + methods[:repeat % len(methods)]
    rows = []
    for workload in args.workloads:
        for batch_size in args.batch_sizes:
            chosen = prompts[workload][:requests_at(batch_size, args.min_requests)]
            outs = {}
            for method in order:
                outs[method], row = serve(*engines[method], chosen, args.output_len, batch_size)
                rows.append(dict(system="minicb", workload=workload, method=method,
                                 batch_size=batch_size, repeat=repeat, **row))
                print(progress_line(rows[-1]), flush=True)
            add_agreement(rows[-len(order):], outs, reference.get(workload))
    return rows


def add_agreement(rows: list[dict], outputs: dict, reference: list[list[int]] | None) -> None:
    """Mark each row with the requests whose tokens differ from no speculation and from
    transformers (on the prompts it generated)."""
    for row in rows:
        mine = outputs[row["method"]]
        row["differs_from_none"] = (None if row["method"] == "none" else
                                    len(compare_outputs(outputs["none"], mine)))
        if reference:
            n = min(len(reference), len(mine))
            row["differs_from_transformers"] = len(compare_outputs(reference[:n], mine[:n]))


def transformers_reference(model_path: str, prompts: dict, n: int, output_len: int) -> dict:
    """transformers' greedy `generate`, one request at a time, on the first n prompts."""
    if n <= 0:
        return {}
    from minicb.bench.peers import hf_one_at_a_time

    model = load_hf_model(model_path, "cpu", "float32")
    pad = model.generation_config.pad_token_id or 0
    return {w: hf_one_at_a_time(model, p[:n], [output_len] * len(p[:n]), pad).outputs
            for w, p in prompts.items()}


def run_vllm(args, model_path: str, prompts: dict, repeat: int, reference: dict) -> list:
    """vLLM's CPU build, one engine without and one with n-gram speculation (in an order that
    alternates by repeat), each serving every workload at every batch size (one start-up each:
    it takes tens of seconds)."""
    from minicb.bench.vllm_peer import run_vllm_runs

    rows = []
    jobs = [(w, b, prompts[w][:requests_at(b, args.min_requests)])
            for w in args.workloads for b in args.batch_sizes]
    outs: dict = {}
    for method in (("none", "ngram") if repeat % 2 == 0 else ("ngram", "none")):
        settings = {"max_num_seqs": max(args.batch_sizes)}
        if method == "ngram":
            settings["speculative_config"] = dict(
                VLLM_NGRAM, num_speculative_tokens=args.num_speculative_tokens)
        runs = run_vllm_runs(model_path, [(p, [args.output_len] * len(p), b)
                                          for _, b, p in jobs], settings)
        for (workload, batch_size, _), run in zip(jobs, runs):
            row = dict(system="vllm", workload=workload, method=method,
                       batch_size=batch_size, repeat=repeat,
                       **measurements(run.metrics, run.settings["wall_s"]),
                       load_average=run.settings["load_average"]["before"])
            spec = run.settings.get("spec_decode")
            if spec:            # vLLM's own counts: drafts, tokens proposed and accepted
                row.update(spec)
                row["acceptance_rate"] = spec["accepted_tokens"] / max(
                    spec["proposed_tokens"], 1)
                row["mean_accepted_length"] = ((spec["accepted_tokens"] + spec["verify_steps"])
                                               / max(spec["verify_steps"], 1))
            rows.append(row)
            outs[workload, batch_size, method] = run.outputs
            print(progress_line(row), flush=True)
    for workload, batch_size, _ in jobs:
        pair = [r for r in rows if (r["workload"], r["batch_size"]) == (workload, batch_size)]
        add_agreement(pair, {m: outs[workload, batch_size, m] for m in ("none", "ngram")},
                      reference.get(workload))
    return rows


def progress_line(row: dict) -> str:
    extra = (f", accepted {row['acceptance_rate']:.0%}, {row['mean_accepted_length']:.2f} "
             "tokens/verify" if row.get("mean_accepted_length") else "")
    return (f"  {row['system']} {row['workload']} B={row['batch_size']} {row['method']}: "
            f"{row['output_throughput']:.0f} tok/s, TPOT p50 {row['tpot_p50_ms']:.2f} ms{extra} "
            f"(load {row['load_average'][0]})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    if args.table:
        print(markdown_tables(json.loads(Path(args.table).read_text())), end="")
        return 0
    if args.peers:
        from minicb.bench.vllm_peer import check_available

        check_available()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from minicb.model.default import draft_model_path
    from minicb.model.loader import load_tokenizer, resolve_model_path

    model_path = resolve_model_path(args.model)
    methods = ["none"] + [m for m in args.methods if m in SPECULATIVE_METHODS]
    skipped = [m for m in args.methods if m not in SPECULATIVE_METHODS]
    tokenizer = load_tokenizer(model_path)
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    n = requests_at(max(args.batch_sizes), args.min_requests)
    prompts = {w: make_prompts(w, tokenizer, vocab, n, args.seed) for w in args.workloads}
    print(f"machine: {describe(machine_info())}\nmethods: {methods}"
          + (f" (not in this engine: {skipped})" if skipped else ""))
    reference = transformers_reference(str(model_path), prompts, args.reference_prompts,
                                       args.output_len)
    engines = start_minicb(args, str(model_path), prompts, methods)
    rows = []
    for repeat in range(args.repeats):        # the systems take turns, repeat by repeat
        rows += run_minicb(args, engines, prompts, repeat, reference)
        if args.peers:
            rows += run_vllm(args, str(model_path), prompts, repeat, reference)
    summary = summarize_runs(rows)
    # a request's mean context while it decodes: its prompt and half its answer
    contexts = {w: statistics.fmean(map(len, p)) + args.output_len / 2
                for w, p in prompts.items()}
    payload = {
        "benchmark": "speculative",
        "model": {"path": display_path(model_path),
                  "draft_path": display_path(draft_model_path())},
        "settings": {"num_speculative_tokens": args.num_speculative_tokens,
                     "prompt_lookup_min": 2, "prompt_lookup_max": 4,
                     "output_len": args.output_len, "batch_sizes": args.batch_sizes,
                     "min_requests": args.min_requests, "repeats": args.repeats,
                     "threads": args.threads, "quick": args.quick, "seed": args.seed,
                     "methods_not_in_engine": skipped, "vllm_speculative_config": VLLM_NGRAM,
                     "reference_prompts": args.reference_prompts},
        "workloads": {w: {"requests": len(p), "prompt_len_range": [min(map(len, p)),
                                                                   max(map(len, p))]}
                      for w, p in prompts.items()},
        "runs": rows, "summary": summary, "break_even": break_even(summary),
        "predictions": predictions(rows, args.num_speculative_tokens, contexts, model_path,
                                   Path(draft_model_path()))}
    from minicb.bench.plots import plot_speculative

    stem = "speculative-quick" if args.quick else "speculative"
    json_path, png_path = write_results(args.out_dir, stem, payload, plot_speculative)
    print(report(payload))
    print(f"results: {json_path}, {png_path}")
    return 0


def report(payload: dict) -> str:
    columns = [("system", "system", ""), ("workload", "workload", ""), ("method", "method", ""),
               ("batch_size", "B", "d"), ("speedup", "tok/s with / without", ".2f"),
               ("tpot_ratio", "TPOT with / without", ".2f"),
               ("acceptance_rate", "accepted", ".0%"),
               ("mean_accepted_length", "tokens/verify", ".2f"), ("equal", "greedy =", "")]
    rows = [dict(s, equal="yes" if s["greedy_equal"] else "NO") for s in payload["summary"]]
    return format_table(rows, columns)

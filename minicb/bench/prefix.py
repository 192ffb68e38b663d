"""`python -m minicb bench prefix`: prefix caching off and on, side by side in one run.

    python -m minicb bench prefix                        # the default model, both workloads
    python -m minicb bench prefix --num-prompts 16 --model path/to/checkpoint

Two shared-prefix workloads, every request queued at once:
  system-prompt  one long system prompt, then a short question of its own per request
  few-shot       one prompt of worked examples, then a short query of its own per request
Prompts are token ids from a seeded generator (the cache sees only token ids, so the words do not
matter); output lengths are enforced with max_tokens and EOS ignored, so both runs do the same
work. Off and on alternate, each run on a fresh engine (an empty cache), and the medians are
reported, since a shared machine's load drifts: TTFT p50/p95, output and total throughput, the
hit rate, and how many requests' greedy outputs agree across every run.

Then parallel sampling: the KV blocks held at peak when n=4 samples of each prompt share its
blocks (forked after the prompt's prefill) against four independent requests per prompt.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from minicb.bench.common import display_path, resolve_model
from minicb.bench.harness import (
    add_flags,
    alternate,
    announce,
    bench_parser,
    format_table,
    write_results,
)
from minicb.metrics import summarize

N_SAMPLES = 4
TIMINGS = ("ttft_p50_s", "ttft_p95_s", "duration_s", "output_throughput", "total_throughput")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser("prefix", __doc__)
    add_flags(p, "model", num_prompts=dict(default=32, help="requests per workload"))
    p.add_argument("--system-len", type=int, default=384, help="tokens of the shared system prompt")
    p.add_argument("--question-len", type=int, nargs=2, default=[16, 48], metavar=("MIN", "MAX"))
    p.add_argument("--examples", type=int, nargs=2, default=[6, 64], metavar=("COUNT", "LEN"),
                   help="few-shot examples and tokens per example")
    p.add_argument("--query-len", type=int, nargs=2, default=[8, 24], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, default=16, help="tokens generated per request")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    add_flags(p, "threads", "seed", "out_dir",
              repeats=dict(help="runs of each setting, alternating off and on"))
    return p.parse_args(argv)


def shared_prefix_prompts(prefix_len: int, suffix_range: list[int], n: int, vocab: int,
                          seed: int) -> list[list[int]]:
    """`n` prompts: one shared prefix of `prefix_len` tokens, then a suffix of their own."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(3, vocab, prefix_len).tolist()
    low, high = suffix_range
    return [prefix + rng.integers(3, vocab, int(rng.integers(low, high + 1))).tolist()
            for _ in range(n)]


def run_once(model_path: str, knobs: dict, caching: bool, prompts: list[list[int]],
             output_len: int) -> dict:
    """One run on a fresh engine (an empty cache), warmed up on prompts that share no block."""
    from minicb import LLM, SamplingParams

    llm = LLM(model_path, enable_prefix_caching=caching, **knobs)
    llm.generate([[5] * 8, [6] * 8], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                 use_tqdm=False)
    before = llm.llm_engine.kv.prefix_stats()
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    results = llm.generate(prompts, params, use_tqdm=False)
    s, stats = summarize([r.metrics for r in results]), llm.llm_engine.kv.prefix_stats()
    return {"ttft_p50_s": s.ttft["p50"], "ttft_p95_s": s.ttft["p95"], "duration_s": s.duration,
            "output_throughput": s.output_throughput, "total_throughput": s.total_token_throughput,
            "hit_tokens": stats.hit_tokens - before.hit_tokens,
            "queried_tokens": stats.queried_tokens - before.queried_tokens,
            "evictions": stats.evictions - before.evictions,
            "outputs": [r.outputs[0].token_ids for r in results]}


def compare_caching(model_path: str, name: str, prompts: list[list[int]], args) -> list[dict]:
    """The same prompts with prefix caching off and on, alternating, `args.repeats` times each;
    timings are the runs' medians (the counters are the same in every run)."""
    knobs = dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                 block_size=args.block_size, max_model_len=args.max_model_len)
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for _, caching in alternate(args.repeats, (False, True)):
        runs[caching].append(run_once(model_path, knobs, caching, prompts, args.output_len))
    rows = []
    for caching, group in runs.items():
        row = {key: float(np.median([run[key] for run in group])) for key in TIMINGS}
        first = group[0]
        row.update(workload=name, caching="on" if caching else "off", runs=len(group),
                   hit_tokens=first["hit_tokens"], queried_tokens=first["queried_tokens"],
                   hit_rate=first["hit_tokens"] / max(first["queried_tokens"], 1),
                   evictions=first["evictions"])
        rows.append(row)
    off, on = rows
    on["ttft_p50_speedup"] = off["ttft_p50_s"] / on["ttft_p50_s"]
    on["throughput_ratio"] = on["output_throughput"] / off["output_throughput"]
    outputs = [run["outputs"] for group in runs.values() for run in group]
    equal = sum(all(o[i] == outputs[0][i] for o in outputs) for i in range(len(prompts)))
    on["outputs_equal"] = f"{equal}/{len(prompts)}"
    return rows


def peak_blocks_with_samples(model_path: str, prompts: list[list[int]], args, share: bool) -> dict:
    """Serve N_SAMPLES samples of every prompt at once; return the peak number of KV blocks in
    use."""
    from minicb import LLM, SamplingParams

    engine = LLM(model_path, max_num_seqs=len(prompts) * N_SAMPLES, block_size=args.block_size,
                 max_num_batched_tokens=args.max_num_batched_tokens,
                 max_model_len=args.max_model_len).llm_engine
    for index, prompt in enumerate(prompts):
        if share:   # one request of N_SAMPLES samples: they share the prompt's blocks
            engine.add_request(str(index), prompt, SamplingParams(
                n=N_SAMPLES, temperature=0.8, seed=args.seed, max_tokens=args.output_len,
                ignore_eos=True))
            continue
        for sample in range(N_SAMPLES):     # the same samples as separate requests
            params = SamplingParams(temperature=0.8, seed=args.seed + sample,
                                    max_tokens=args.output_len, ignore_eos=True)
            engine.add_request(f"{index}.{sample}", prompt, params)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.kv.num_used_blocks())
    return {"sharing": "on" if share else "off", "prompts": len(prompts),
            "samples_per_prompt": N_SAMPLES, "prompt_tokens": sum(len(p) for p in prompts),
            "peak_blocks": peak}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    if args.threads:
        torch.set_num_threads(args.threads)
    model_path, model_label = resolve_model(args.model, None, "float32")
    from minicb.model.loader import model_args_from_config

    model_args = model_args_from_config(json.loads((Path(model_path) / "config.json").read_text()))
    longest_prompt = max(args.system_len + args.question_len[1],
                         args.examples[0] * args.examples[1] + args.query_len[1])
    args.max_model_len = longest_prompt + args.output_len
    if args.max_model_len > model_args.max_position_embeddings:
        raise SystemExit(f"the workloads need {args.max_model_len} tokens but the model's context "
                         f"is {model_args.max_position_embeddings}; lower --system-len or "
                         "--examples.")
    vocab = model_args.vocab_size
    workloads = {
        "system-prompt": shared_prefix_prompts(args.system_len, args.question_len, args.num_prompts,
                                               vocab, args.seed),
        "few-shot": shared_prefix_prompts(args.examples[0] * args.examples[1], args.query_len,
                                          args.num_prompts, vocab, args.seed + 1),
    }
    announce(f"{model_label}; {args.num_prompts} requests per workload, {args.output_len} output "
             "tokens each")
    rows = [row for name, prompts in workloads.items()
            for row in compare_caching(model_path, name, prompts, args)]
    sampling_prompts = workloads["system-prompt"][:max(1, args.max_num_seqs // N_SAMPLES)]
    sampling = [peak_blocks_with_samples(model_path, sampling_prompts, args, share)
                for share in (False, True)]
    print(report(rows, sampling))
    payload = {"benchmark": "prefix",
               "model": {"label": model_label, "path": display_path(model_path)},
               "settings": {k: v for k, v in vars(args).items() if k != "out_dir"}, "caching": rows,
               "sampling": sampling}
    json_path, _ = write_results(args.out_dir, "prefix-caching", payload)
    print(f"results: {json_path}")
    return 0


def report(rows: list[dict], sampling: list[dict]) -> str:
    table = format_table(rows, [("workload", "workload", ""), ("caching", "caching", ""),
                                ("ttft_p50_s", "TTFT p50 s", ".3f"),
                                ("ttft_p95_s", "TTFT p95 s", ".3f"),
                                ("output_throughput", "out tok/s", ".1f"),
                                ("total_throughput", "total tok/s", ".1f"),
                                ("hit_rate", "hit rate", ".1%"),
                                ("ttft_p50_speedup", "TTFT p50 x", ".2f"),
                                ("throughput_ratio", "tok/s x", ".2f"),
                                ("outputs_equal", "greedy equal", "")])
    blocks = format_table(sampling, [("sharing", "n=4 sharing", ""), ("prompts", "prompts", ""),
                                     ("prompt_tokens", "prompt tokens", ""),
                                     ("peak_blocks", "peak blocks", "")])
    return f"{table}\n\n{blocks}"

"""`python -m minicb bench quant`: fewer bytes per token on a CPU, measured. One linear layer
in float32, bfloat16, int8 and int4 (minicb's C kernels and torch's), then whole-engine tokens/s
with float32, bfloat16, int8 or int4 weights and the int8 KV cache, each against float32 in
alternated repeats; one decode step's attention over a long context with the cache in each
format; and the engine where float32's KV pool preempts and int8's, in the same bytes, does not.

    python -m minicb bench quant [--rows 1 16 48] [--requests 24] [--repeats 5]
                                 [--parts linear engine attention pressure]

The linear is the 100M Llama's MLP up-projection (1024 -> 2816); the engine runs the shipped
model (or --model). The build of the C kernels (kernels/isa.py) is recorded with the load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from minicb.bench.harness import (
    add_flags,
    alternate,
    announce,
    bench_parser,
    reading,
    spread,
    write_results,
)
from minicb.bench.machine import load_average

ENGINE = {"float32": {}, "bfloat16": {"dtype": "bfloat16"}, "int8 weights": {
    "quantization": "int8"}, "int8 KV": {"kv_cache_dtype": "int8"},
    "bfloat16 + int8 weights": {"dtype": "bfloat16", "quantization": "int8"},
    "int4 weights": {"quantization": "int4"}}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser("quant", __doc__)
    add_flags(p, "model", "repeats", "threads", "seed", "out_dir")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 48])
    p.add_argument("--in-features", type=int, default=1024)
    p.add_argument("--out-features", type=int, default=2816)
    p.add_argument("--calls", type=int, default=20, help="calls timed per repeat (the median)")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--context", type=int, default=4096, help="keys per row (attention)")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                   help="what to measure (a subset is written to quant-PART.json)")
    return p.parse_args(argv)


def linear_variants(x, n: int, seed: int) -> dict:
    """name -> a call computing x W^T with W stored as the name says."""
    import torch
    import torch.nn.functional as F

    from minicb.kernels.cpu import linear_cpu
    from minicb.model.int4 import pack_int4, quantize_int4
    from minicb.model.quant import quantize_int8

    w = torch.randn(n, x.shape[1], generator=torch.Generator().manual_seed(seed)) * 0.02
    wb, (q, scale), xb = w.bfloat16(), quantize_int8(w), x.bfloat16()
    q4, pairs = quantize_int4(w)
    q4 = pack_int4(q4)
    return {"C float32": lambda: linear_cpu(x, w), "C bfloat16": lambda: linear_cpu(x, wb),
            "C int8": lambda: linear_cpu(x, q, scale=scale),
            "C int4 (groups of 32)": lambda: linear_cpu(x, q4, scale=pairs),
            "torch float32": lambda: F.linear(x, w),
            "torch bfloat16 (oneDNN)": lambda: F.linear(xb, wb),
            "torch int8 (_weight_int8pack_mm)":
                lambda: torch.ops.aten._weight_int8pack_mm(x, q, scale)}


def time_call(call, calls: int) -> float:
    call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def linear_table(args) -> dict:
    import torch

    table = {}
    for rows in args.rows:
        x = torch.randn(rows, args.in_features)
        variants = linear_variants(x, args.out_features, args.seed)
        micros = {name: [] for name in variants}
        for _, name in alternate(args.repeats, list(variants), rotate=True):
            micros[name].append(time_call(variants[name], args.calls))
        base = micros["C float32"]
        table[rows] = {name: {"us": spread(v), "vs C float32": reading(
            [b / t for b, t in zip(base, v)], "faster", "slower")} for name, v in micros.items()}
        print(rows, "rows:", {name: round(statistics.median(v)) for name, v in micros.items()},
              flush=True)
    return table


def engine_table(args, engine: dict[str, dict] = ENGINE, base: str = "float32",
                 **common) -> dict:
    """Tokens/s of each of `engine`'s LLM settings (over `common`), alternated and rotated, each
    read against `base`'s by the book's rule; scripts/bench_gpu_quant.py runs it on a GPU."""
    from minicb import LLM

    prompts, params = workload(args)
    engines = {name: LLM(args.model, max_num_seqs=args.requests, **{**common, **knobs})
               for name, knobs in engine.items()}
    rates = {name: [] for name in engines}
    for _, name in alternate(args.repeats, list(engines), rotate=True):
        start = time.perf_counter()
        outputs = engines[name].generate(prompts, params, use_tqdm=False)
        tokens = sum(len(out.outputs[0].token_ids) for out in outputs)
        rates[name].append(tokens / (time.perf_counter() - start))
    return {name: {"tokens_per_s": spread(v), f"vs {base}": reading(
        [r / b for r, b in zip(v, rates[base])], "faster", "slower")} for name, v in rates.items()}


def attention_table(args) -> dict:
    """One decode step of the 100M Llama's attention (16 query heads on 8 KV heads of 64): each
    of `rows` rows attends over `context` keys, the cache float32, bfloat16 or int8 (C kernel)."""
    import torch

    from minicb.kernels.cpu import paged_attention_cpu
    from minicb.model.quant import pack_kv_int8

    rows, block = 8, 16
    blocks = rows * args.context // block
    gen = torch.Generator().manual_seed(args.seed)
    k, v = (torch.randn(blocks, block, 8, 64, generator=gen) for _ in range(2))
    caches = {"float32": (k, v), "bfloat16": (k.bfloat16(), v.bfloat16()),
              "int8": (pack_kv_int8(k), pack_kv_int8(v))}
    q = torch.randn(rows, 16, 64, generator=gen)
    cu = torch.arange(rows + 1, dtype=torch.int32)
    lens = torch.full((rows,), args.context, dtype=torch.int32)
    tables = torch.randperm(blocks, generator=gen).int().view(rows, -1)
    micros = {name: [] for name in caches}
    for _, name in alternate(args.repeats, list(caches), rotate=True):
        micros[name].append(time_call(
            lambda kv=caches[name]: paged_attention_cpu(q, *kv, cu, lens, tables, 0.125),
            args.calls))
    base = micros["float32"]
    return {"rows": rows, "context": args.context, **{
        name: {"us": spread(t), "vs float32": reading([b / x for b, x in zip(base, t)],
                                                      "faster", "slower")}
        for name, t in micros.items()}}


def pressure_table(args) -> dict:
    """Where float32's KV pool is too small: `requests` requests of `prompt_len` + `max_tokens`
    tokens on a pool that holds them all in int8 (about 3.8x the tokens per byte), and float32 in
    the same bytes, which runs fewer at once and preempts; tokens/s and preemptions, alternated."""
    import torch

    from minicb import LLM
    from minicb.config import blocks_for
    from minicb.model.loader import model_args_from_config, resolve_model_path
    from minicb.model.quant import kv_bytes_per_token

    config = resolve_model_path(args.model) / "config.json"
    shape = model_args_from_config(json.loads(config.read_text()), str(config))
    per_token = {kind: kv_bytes_per_token(shape, torch.float32, kind) for kind in ("auto", "int8")}
    tokens, block = args.prompt_len + args.max_tokens, 16
    needed = args.requests * blocks_for(tokens, block)
    float32 = max(blocks_for(tokens, block), -(-needed * per_token["int8"] // per_token["auto"]))
    pools = {"float32": ("auto", float32),
             "int8 KV": ("int8", float32 * per_token["auto"] // per_token["int8"])}
    prompts, params = workload(args)
    engines = {name: LLM(args.model, max_num_seqs=args.requests, max_model_len=tokens,
                         block_size=block, num_kv_blocks=blocks, kv_cache_dtype=kind)
               for name, (kind, blocks) in pools.items()}
    rates, preempted = {name: [] for name in engines}, {name: [] for name in engines}
    for _, name in alternate(args.repeats, list(engines), rotate=True):
        scheduler, start = engines[name].llm_engine.scheduler, time.perf_counter()
        before = scheduler.num_preemptions
        outputs = engines[name].generate(prompts, params, use_tqdm=False)
        rates[name].append(sum(len(o.outputs[0].token_ids) for o in outputs)
                           / (time.perf_counter() - start))
        preempted[name].append(scheduler.num_preemptions - before)
    return {"requests": args.requests, "tokens_per_request": tokens, "blocks_needed": needed,
            "bytes_ratio": per_token["auto"] / per_token["int8"], **{name: {
                "kv_blocks": pools[name][1], "preemptions": spread(preempted[name]),
                "tokens_per_s": spread(rates[name]), "vs float32": reading(
                    [r / b for r, b in zip(rates[name], rates["float32"])], "faster", "slower")}
                for name in engines}}


def workload(args) -> tuple:
    """The same work for every engine: `requests` prompts, `max_tokens` greedy tokens each."""
    from minicb import SamplingParams

    prompts = [[3 + (11 * i + 7 * j) % 4000 for j in range(args.prompt_len)]
               for i in range(args.requests)]
    return prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)


PARTS = {"linear": linear_table, "engine": engine_table, "attention": attention_table,
         "pressure": pressure_table}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch

    from minicb.kernels.cpu import available

    if args.threads:
        torch.set_num_threads(args.threads)
    build = available()[1]
    announce(f"bench quant: C kernels {build}; {torch.get_num_threads()} threads")
    load_before = load_average()
    payload = {"build": build, "threads": torch.get_num_threads(), "load_before": load_before,
               "linear_shape": {"in_features": args.in_features,
                                "out_features": args.out_features},
               **{part: PARTS[part](args) for part in args.parts}, "load_after": load_average()}
    for part, name, row in ((p, n, r) for p in ("engine", "pressure", "attention")
                            for n, r in payload.get(p, {}).items() if isinstance(r, dict)):
        value, unit = (row["us"], "µs") if "us" in row else (row["tokens_per_s"], "tok/s")
        print(f"{part}, {name}: {value['median']:.0f} {unit}, {row['vs float32']}")
    stem = "quant" if set(args.parts) == set(PARTS) else "-".join(["quant", *args.parts])
    write_results(args.out_dir, stem, payload)
    return 0

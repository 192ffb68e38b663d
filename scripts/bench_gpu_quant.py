"""Fewer bytes per token on a GPU, measured: the Triton int8 and int4 products against bfloat16
and against dequantizing the whole weight on every call, a decode step's attention over an FP8
cache against bfloat16's, and the engine's tokens/s with int8 and int4 weights and the FP8 cache
against bfloat16. Each comparison alternates its variants over repeats (minicb.bench.harness)
and reads the ratios by the book's rule; the GPU and the load are recorded with the results.

    python scripts/bench_gpu_quant.py --out-dir OUT [--parts linear attention engine]
                                      [--rows 1 16 64] [--repeats 3]

scripts/gpu_session.sh runs it on a lent GPU. It needs CUDA (compiled Triton kernels).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minicb.bench.harness import (  # noqa: E402
    add_flags,
    alternate,
    announce,
    bench_parser,
    reading,
    spread,
    write_results,
)
from minicb.bench.machine import load_average  # noqa: E402

ENGINE = {"bfloat16": {}, "int8 weights": {"quantization": "int8"},
          "int4 weights": {"quantization": "int4"}, "fp8 KV": {"kv_cache_dtype": "fp8"}}


def time_call(call, calls: int) -> float:
    """Median µs of ``calls`` calls, each timed by CUDA events after a warm-up call."""
    import torch

    call()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def compare(variants: dict, base: str, args) -> dict:
    micros = {name: [] for name in variants}
    for _, name in alternate(args.repeats, list(variants), rotate=True):
        micros[name].append(time_call(variants[name], args.calls))
    return {name: {"us": spread(v), f"vs {base}": reading(
        [b / t for b, t in zip(micros[base], v)], "faster", "slower")}
        for name, v in micros.items()}


def linear_table(args) -> dict:
    """One linear of the 100M Llama's MLP (1024 -> 2816) per row count."""
    import torch
    import torch.nn.functional as F
    from minicb.kernels.quant_matmul import int4_matmul, int8_matmul

    from minicb.model.int4 import pack_int4, quantize_int4
    from minicb.model.quant import quantize_int8

    gen = torch.Generator().manual_seed(args.seed)
    w = torch.randn(args.out_features, args.in_features, generator=gen) * 0.02
    (q8, s8), (q4, s4) = quantize_int8(w), quantize_int4(w)
    w, q8, s8, s4, p4 = (t.cuda() for t in (w.bfloat16(), q8, s8, s4, pack_int4(q4)))
    table = {}
    for rows in args.rows:
        x = torch.randn(rows, args.in_features, device="cuda", dtype=torch.bfloat16)
        table[rows] = compare({
            "bfloat16": lambda x=x: F.linear(x, w),
            "int8 (Triton, inside)": lambda x=x: int8_matmul(x, q8, s8),
            "int4 g32 (Triton, inside)": lambda x=x: int4_matmul(x, p4, s4),
            # what a naive int8 layer does: the whole weight converted on every call
            "int8 (whole weight dequantized per call)":
                lambda x=x: F.linear(x, q8.to(torch.bfloat16) * s8[:, None].bfloat16()),
        }, "bfloat16", args)
        print(rows, "rows:", {k: round(v["us"]["median"], 1) for k, v in table[rows].items()},
              flush=True)
    return table


def attention_table(args) -> dict:
    """One decode step: 32 rows of 16 query heads on 8 KV heads of 128, over ``context`` keys,
    the cache bfloat16 or FP8 (the Triton kernel)."""
    import torch
    from minicb.kernels import paged_attention
    from minicb.kernels.fp8 import FP8, pack_kv_fp8

    rows, block = 32, 16
    blocks = rows * args.context // block
    gen = torch.Generator().manual_seed(args.seed)
    k, v = (torch.randn(blocks, block, 8, 128, generator=gen) for _ in range(2))
    caches = {"bfloat16": (k.bfloat16().cuda(), v.bfloat16().cuda()),
              "fp8": (pack_kv_fp8(k).view(FP8).cuda(), pack_kv_fp8(v).view(FP8).cuda())}
    q = torch.randn(rows, 16, 128, generator=gen).bfloat16().cuda()
    cu = torch.arange(rows + 1, dtype=torch.int32, device="cuda")
    lens = torch.full((rows,), args.context, dtype=torch.int32, device="cuda")
    tables = torch.randperm(blocks, generator=gen).int().view(rows, -1).cuda()
    variants = {name: (lambda kv=kv: paged_attention(q, *kv, cu, lens, tables, 128**-0.5, 1,
                                                     args.context))
                for name, kv in caches.items()}
    return {"rows": rows, "context": args.context, **compare(variants, "bfloat16", args)}


def engine_table(args) -> dict:
    """The engine's tokens/s with each quantized path against bfloat16, on the GPU: bench quant's
    alternated measurement with the device and dtype set."""
    from minicb.bench.quant import engine_table as measure

    return measure(args, ENGINE, "bfloat16", device="cuda", dtype="bfloat16")


PARTS = {"linear": linear_table, "attention": attention_table, "engine": engine_table}


def main(argv: list[str]) -> int:
    parser = bench_parser("gpu-quant", __doc__)
    add_flags(parser, "model", "repeats", "seed", "out_dir")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--in-features", type=int, default=1024)
    parser.add_argument("--out-features", type=int, default=2816)
    parser.add_argument("--calls", type=int, default=50, help="calls timed per repeat")
    parser.add_argument("--context", type=int, default=4096, help="keys per row (attention)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu_quant.py measures the Triton kernels on a GPU: no CUDA here")
    announce(f"bench gpu-quant on {torch.cuda.get_device_name()}")
    payload = {"gpu": torch.cuda.get_device_name(), "load_before": load_average(),
               **{part: PARTS[part](args) for part in args.parts}, "load_after": load_average()}
    write_results(args.out_dir, "gpu-quant", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Decode attention on a GPU: the Triton paged kernel against torch, as memory bandwidth.

    python -m minicb bench kernels [--batch-sizes 1 8 64 256] [--contexts 512 4096 32768]
    python -m minicb bench kernels --dry-run        # tiny grid, Triton interpreter, CPU

A decode step reads every cached K/V byte of every request once and does little arithmetic on
it, so the honest unit is bandwidth: K/V bytes read / time, set beside what the device achieves
on a plain device-to-device copy. Heads are Llama-3-8B's: 32 query heads sharing 8 KV heads,
head_dim 128, bfloat16, block_size 16. Three ways to attend one decode query per request:

- ``triton``: ``minicb.kernels.paged_attention`` over shuffled block tables (split-KV chosen
  automatically unless ``--num-splits``).
- ``sdpa``: torch ``scaled_dot_product_attention`` over the same amount of K/V laid out
  contiguously ([batch, kv_heads, context, head_dim]): the best case with no paging at all. A
  decode query attends to every key, so the 4 query heads of a KV group ride as 4 query rows
  against that one KV head (no K/V is copied to serve GQA).
- ``gather``: what the torch backend does: gather the blocks through the block table into a
  padded tensor, then the same SDPA call. Its time includes the gather (it moves the bytes
  three times, but the bandwidth column counts them once, like the others).

Results go to ``benchmarks/results/kernels-<device>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
from pathlib import Path

import torch

from minicb.bench.common import copy_bandwidth_gbps, make_timer
from minicb.bench.harness import bench_parser, write_record
from minicb.model.loader import DTYPES

METHODS = ("triton", "sdpa", "gather")
# The dry run: small enough for the interpreter, big enough to cross block and tile edges.
DRY_RUN_GRID = dict(batch_sizes=[1, 3], contexts=[48], num_q_heads=4, num_kv_heads=2, head_dim=64,
                    block_size=16, dtype="float32")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = bench_parser("kernels", __doc__)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 32768])
    parser.add_argument("--num-q-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--num-splits", type=int, default=None,
                        help="force split-KV (default: automatic)")
    parser.add_argument("--rep-ms", type=int, default=100,
                        help="time spent repeating each measurement")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--dry-run", action="store_true",
                        help="a tiny grid through the Triton interpreter on CPU: proves the code "
                             "path, times nothing")
    return parser.parse_args(argv)


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def fits(device: str, nbytes: int) -> bool:
    if device != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    return nbytes < 0.9 * free


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [batch, q_heads, dim]; k, v [batch, kv_heads, context, dim] -> [batch, q_heads, dim]."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    rows = q.view(batch, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(rows, k, v, scale=scale)
    return out.reshape(batch, num_q_heads, head_dim)


def gather_decode(q, k_cache, v_cache, block_tables, context: int, scale: float) -> torch.Tensor:
    batch = q.shape[0]
    tables = block_tables.long()
    k = k_cache[tables].view(batch, context, *k_cache.shape[2:]).transpose(1, 2)
    v = v_cache[tables].view(batch, context, *v_cache.shape[2:]).transpose(1, 2)
    return sdpa_decode(q, k, v, scale)


def time_paged(args, kernels, device: str, timer, batch: int, context: int, point: dict) -> None:
    """Triton and gather+SDPA over one shuffled paged cache (freed when this returns)."""
    dtype = DTYPES[args.dtype]
    heads, dim, block_size = args.num_kv_heads, args.head_dim, args.block_size
    blocks_per_seq = context // block_size
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, heads, dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq).to(torch.int32)
    q = torch.randn(batch, args.num_q_heads, dim, dtype=dtype, device=device)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    scale = dim**-0.5
    num_splits = args.num_splits
    if num_splits is None and device == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        num_splits = kernels.choose_num_splits(batch, heads, context, sms)
    point["num_splits"] = num_splits or 1
    out = torch.empty_like(q)

    def triton_call():
        return kernels.paged_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, tables, scale,
                                       1, context, out=out, num_splits=num_splits)

    def gather_call():
        return gather_decode(q, k_cache, v_cache, tables, context, scale)

    point["methods"]["triton"] = timer(triton_call)
    if fits(device, point["kv_bytes"]):  # the gather makes a second copy of the cache
        point["max_abs_diff"] = (triton_call().float() - gather_call().float()).abs().max().item()
        point["methods"]["gather"] = timer(gather_call)


def time_contiguous(args, device: str, timer, batch: int, context: int, point: dict) -> None:
    """SDPA over K/V stored contiguously: the same bytes, no block table."""
    if not fits(device, point["kv_bytes"]):
        return
    dtype = DTYPES[args.dtype]
    q = torch.randn(batch, args.num_q_heads, args.head_dim, dtype=dtype, device=device)
    k = torch.randn(batch, args.num_kv_heads, context, args.head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    point["methods"]["sdpa"] = timer(lambda: sdpa_decode(q, k, v, args.head_dim**-0.5))


def bench_point(args, kernels, device: str, timer, batch: int, context: int) -> dict:
    dtype = DTYPES[args.dtype]
    kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_dim * dtype.itemsize
    point = dict(batch=batch, context=context, kv_bytes=kv_bytes, num_splits=None, skipped=None,
                 max_abs_diff=None, methods={m: None for m in METHODS})
    if context % args.block_size:
        point["skipped"] = f"context {context} is not a multiple of block_size {args.block_size}"
        return point
    if not fits(device, int(kv_bytes * 1.05)):
        point["skipped"] = f"the paged cache alone needs {kv_bytes / 2**30:.1f} GiB"
        return point
    try:
        time_paged(args, kernels, device, timer, batch, context, point)
        time_contiguous(args, device, timer, batch, context, point)
    except torch.cuda.OutOfMemoryError:
        point["skipped"] = "out of GPU memory"
    for method, ms in point["methods"].items():
        if ms is not None:
            point["methods"][method] = dict(time_ms=ms, bandwidth_gbps=kv_bytes / ms / 1e6)
    if device == "cuda":
        torch.cuda.empty_cache()
    return point


def print_table(results: dict) -> None:
    copy = results["copy_bandwidth_gbps"]
    print(f"{results['device']}: copy bandwidth {copy:.0f} GB/s; {results['dtype']}, "
          f"{results['num_q_heads']} query / {results['num_kv_heads']} KV heads, head_dim "
          f"{results['head_dim']}, block_size {results['block_size']}")
    header = f"{'batch':>6} {'context':>8} {'splits':>6}"
    header += "".join(f" {m + ' us':>11} {m + ' GB/s':>12}" for m in METHODS)
    print(header + f" {'triton/copy':>11}")
    for p in results["points"]:
        line = f"{p['batch']:>6} {p['context']:>8} {p['num_splits'] or '-':>6}"
        if p["skipped"]:
            print(line + f"  skipped: {p['skipped']}")
            continue
        for m in METHODS:
            r = p["methods"][m]
            line += (f" {r['time_ms'] * 1e3:>11.1f} {r['bandwidth_gbps']:>12.0f}" if r
                     else f" {'-':>11} {'-':>12}")
        triton = p["methods"]["triton"]
        print(line + (f" {triton['bandwidth_gbps'] / copy:>10.0%}" if triton else ""))


def plot(results: dict):
    """Each batch size's bandwidth against context, per method, under the copy bandwidth."""
    from matplotlib.figure import Figure  # no pyplot: never touches the caller's backend

    batches = sorted({p["batch"] for p in results["points"]})
    fig = Figure(figsize=(4 * len(batches), 3.6), layout="constrained")
    axes = fig.subplots(1, len(batches), sharey=True, squeeze=False)[0]
    for ax, batch in zip(axes, batches):
        points = [p for p in results["points"] if p["batch"] == batch and not p["skipped"]]
        for method in METHODS:
            xs = [p["context"] for p in points if p["methods"][method]]
            ys = [p["methods"][method]["bandwidth_gbps"] for p in points if p["methods"][method]]
            ax.plot(xs, ys, marker="o", label=method)
        ax.axhline(results["copy_bandwidth_gbps"], color="gray", linestyle="--",
                   label="device copy")
        ax.set_xscale("log", base=2)
        ax.set_title(f"batch {batch}")
        ax.set_xlabel("context (tokens)")
    axes[0].set_ylabel("K/V bytes read / time (GB/s)")
    axes[-1].legend(fontsize="small")
    fig.suptitle(f"decode attention, {results['device']}, {results['dtype']}")
    return fig


def load_kernels(dry_run: bool):
    """Import the kernels, in the interpreter for a dry run on a machine without CUDA. Triton
    fixes interpreted-or-compiled when the kernels are defined, so the variable goes first."""
    if dry_run and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from minicb import kernels

    return kernels


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("bench kernels times GPU kernels and needs CUDA, which this machine lacks.\n"
              "Use --dry-run to run a tiny grid through the Triton interpreter on CPU instead.",
              file=sys.stderr)
        return 2
    kernels = load_kernels(args.dry_run)
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if args.dry_run:
        vars(args).update(DRY_RUN_GRID)
    device = "cpu" if interpreting or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not interpreting:
        print("the Triton kernels were loaded compiled, which CPU tensors cannot run; "
              "rerun with TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    import triton

    timer = make_timer(device, args.rep_ms)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)"
    slug = device_slug(name) + ("-dry-run" if args.dry_run else "")
    results = dict(
        device=name, device_slug=slug, dry_run=args.dry_run,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch_version=torch.__version__, triton_version=triton.__version__,
        dtype=args.dtype, num_q_heads=args.num_q_heads, num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim, block_size=args.block_size,
        copy_bandwidth_gbps=copy_bandwidth_gbps(device, timer), points=[],
    )
    for batch in args.batch_sizes:
        for context in args.contexts:
            results["points"].append(bench_point(args, kernels, device, timer, batch, context))
    print_table(results)
    json_path, png_path = write_record(args.out_dir, f"kernels-{slug}", results, plot)
    print(f"wrote {json_path} and {png_path}")
    return 0

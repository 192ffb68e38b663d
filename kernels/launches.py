"""Every launch the engine can make on a device: what the ahead-of-time compiler must prove
compiles and fits (``python -m minicb bench gpu-compile`` compiles them for seven GPUs).

The launches are asked of the engine's own tile-choosing functions (``attention_launch``,
``merge_launch``, ``write_launch``, ``moe_launch``, ``matmul_launch``) over every dtype, head
size, GQA group, query length and split count the engine can reach, each dtype resolved for the
device first.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from minicb.kernels.aot import Launch

DTYPES = ("float32", "float16", "bfloat16")
# Head sizes: the kernels pad one to DIM_PAD (the next power of two, at least 16), which sizes
# every tile, so a size stands for its power of two. The loader accepts any: 64 and 128 are what
# Llama, Qwen2 and Qwen3 checkpoints use, compiled in full; 256 bounds the tiles above them
# (smaller ones on the 64 KiB parts) and is compiled at the corners of every other dimension;
# below 64 the tiles are those of 64 over a narrower DIM_PAD, so no larger. Past 256 a 64 KiB part
# holds no float32 tile, and attention_launch refuses it naming the device.
HEAD_DIMS = (64, 128)
CORNER_HEAD_DIMS = (256,)
GROUPS = (1, 2, 4, 8)           # query heads per KV head
QUERY_LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128)  # max_seqlen_q: a decode step up to long chunks
KV_HEADS = (1, 8, 32)           # the write kernel holds all KV heads of one token
BLOCK_SIZE = 16                 # the engine's default; it enters the kernels only as // and %
KERNELS = ("attention", "merge", "write", "fused_moe", "int8_matmul", "int4_matmul")
# An FP8 KV cache (kv_cache_dtype="fp8") gets the same attention tiles as its dtype (widened to it
# before the products), so it is compiled at the corners only: the largest head sizes, GQA 8 (a
# group's rows fill the same tiles as single heads'), a decode step, a split decode and the
# longest chunk.
FP8_HEAD_DIMS = (128, 256)
MATMUL_ROWS = (1, 128)          # a decode step's tile (16 rows) and a prefill's (64)


def engine_dtype(asked: str, limits) -> str:
    from minicb.kernels.targets import resolve_dtype

    if limits.backend != "cuda":
        return asked
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return resolve_dtype(asked, "cuda", capability=(int(limits.arch) // 10,
                                                        int(limits.arch) % 10))


def launches_for(limits, quick: bool = False, corners: bool = False) -> list[Launch]:
    """Every distinct launch the engine can make on ``limits``' device.

    ``corners``: the extremes of each dimension only (GQA groups 1 and 8, a decode step, a
    split decode and the longest prefill chunk, 2 and 64 splits, 1 and 32 KV heads), every
    dtype and head size: the tiles between them lie between them in shared memory (head size
    256 is always compiled so). ``quick``:
    the largest tiles and one of each other kernel, for ``make test``. Attention and the KV write
    over an FP8 cache, and the int8 and int4 products, ride along (FP8 at its corners)."""
    import torch
    from minicb.kernels.fused_moe import moe_launch
    from minicb.kernels.kv_write import write_launch
    from minicb.kernels.paged_attention import attention_launch
    from minicb.kernels.quant_matmul import matmul_launch
    from minicb.kernels.split_kv import MAX_SPLITS, merge_launch

    found: dict[tuple, Launch] = {}

    def add(launch: Launch) -> None:
        found.setdefault(launch.key(), launch)

    dtypes = ("float32", "bfloat16") if quick else DTYPES
    for asked in dtypes:
        dtype = engine_dtype(asked, limits)
        for head_dim in (128,) if quick else HEAD_DIMS + CORNER_HEAD_DIMS:
            edges = corners or head_dim in CORNER_HEAD_DIMS
            groups = (8,) if quick else (GROUPS[0], GROUPS[-1]) if edges else GROUPS
            lengths = (1, QUERY_LENGTHS[-1]) if quick or edges else QUERY_LENGTHS
            kv_heads = (KV_HEADS[-1],) if quick else (KV_HEADS[0], KV_HEADS[-1]) if edges \
                else KV_HEADS
            fp8_too = head_dim in FP8_HEAD_DIMS
            for fp8 in (False, True) if fp8_too else (False,):
                fp8_groups = (GROUPS[-1],) if fp8 else groups
                for group in fp8_groups:
                    for max_seqlen_q in (1, QUERY_LENGTHS[-1]) if fp8 else lengths:
                        # A decode step may be split across programs (split-KV); a chunk never
                        # is.
                        for split in ((False, True) if max_seqlen_q == 1 else (False,)):
                            opts = attention_launch(getattr(torch, dtype), head_dim, group,
                                                    max_seqlen_q, BLOCK_SIZE, split, limits, fp8)
                            warps, stages = opts.pop("num_warps"), opts.pop("num_stages")
                            estimate = opts.pop("shared_estimate")
                            rows = opts["BLOCK_M"] * opts["GROUP_PAD"]
                            tile = "decode" if max_seqlen_q == 1 else "prefill"
                            add(Launch(limits.key, "attention", asked, dtype,
                                       dict(head_dim=head_dim, group=group, tile=tile, rows=rows,
                                            keys=opts["BLOCK_N"], split=split,
                                            kv="fp8" if fp8 else dtype),
                                       opts, warps, stages, estimate))
            splits = (2, MAX_SPLITS) if quick or edges else (2, 8, MAX_SPLITS)
            for num_splits in splits:
                opts = merge_launch(head_dim, num_splits)
                warps = opts.pop("num_warps")
                add(Launch(limits.key, "merge", asked, dtype,
                           dict(head_dim=head_dim, splits=opts["SPLITS_PAD"]), opts, warps, None))
            for num_kv_heads in kv_heads:
                for fp8 in (False, True) if fp8_too else (False,):
                    opts = write_launch(num_kv_heads, head_dim, BLOCK_SIZE, fp8)
                    warps = opts.pop("num_warps")
                    add(Launch(limits.key, "write", asked, dtype,
                               dict(head_dim=head_dim, kv_heads=num_kv_heads,
                                    kv="fp8" if fp8 else dtype), opts, warps, None))
        # one fused-MoE tile per dtype: its sizes enter as runtime arguments, not constexprs
        opts = moe_launch(getattr(torch, dtype))
        warps, stages = opts.pop("num_warps"), opts.pop("num_stages")
        add(Launch(limits.key, "fused_moe", asked, dtype, dict(rows=opts["BLOCK_M"]), opts,
                   warps, stages))
        # the quantized products: their sizes are runtime arguments; the tile follows the rows
        for bits in (8, 4):
            for rows in MATMUL_ROWS:
                opts = matmul_launch(getattr(torch, dtype), rows, limits, bits)
                warps, stages = opts.pop("num_warps"), opts.pop("num_stages")
                estimate = opts.pop("shared_estimate")
                opts["HAS_BIAS"] = True     # Qwen2's q/k/v have one: the larger kernel
                add(Launch(limits.key, f"int{bits}_matmul", asked, dtype,
                           dict(rows=opts["BLOCK_M"], cols=opts["BLOCK_N"]), opts, warps, stages,
                           estimate))
    launches = list(found.values())
    if quick:  # one bfloat16 launch of each kernel is enough to prove the dtype compiles
        seen, kept = set(), []
        for launch in launches:
            tag = (launch.kernel, launch.dtype, *(launch.params.get(name) for name in
                                                  ("tile", "kv", "cols")))
            if launch.asked == "float32" or tag not in seen:
                kept.append(launch)
                seen.add(tag)
        launches = kept
    return launches


# --- the compiled launches as a table (benchmarks/gpu-targets.md, chapter 05) ---

def _kib(n: int) -> str:
    return f"{n / 1024:.1f}".rstrip("0").rstrip(".") + " KiB"


def table_markdown(path: Path | str) -> str:
    """The committed results as markdown: one line per device (what fits, the largest shared
    memory against the limit, registers, spills, occupancy), then the attention tiles each
    device gets for head_dim 128 and GQA group 8, decode and prefill, float32 and bfloat16."""
    from minicb.kernels.targets import TARGETS

    rows = json.loads(Path(path).read_text())["rows"]
    lines = ["| device | target | launches compiled | fit | largest shared / limit "
             "| registers (max) | spilling launches | occupancy, decode |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for key, limits in TARGETS.items():
        mine = [r for r in rows if r["target"] == key]
        if not mine:
            continue
        done = [r for r in mine if r["compiled"]]
        decode = [r["occupancy"] for r in done if r["kernel"] == "attention"
                  and r.get("tile") == "decode"]
        largest = max((r["shared"] for r in done), default=0)
        occ = (f"{min(decode):.0%} to {max(decode):.0%}" if decode else "-")
        registers = max((r["registers"] for r in done), default=0)
        lines.append(f"| {limits.name} | {key} | {len(done)} of {len(mine)} "
                     f"| {sum(r['fits'] for r in mine)} | {_kib(largest)} / "
                     f"{_kib(limits.shared_per_block)} | {registers} "
                     f"| {sum(r['spill_bytes'] > 0 for r in done)} | {occ} |")
    lines += ["", "The attention tiles each device gets for head_dim 128 and GQA group 8, as the "
              "engine runs them (bfloat16 runs as float16 on a T4):", "",
              "| device | dtype | tile | query rows x keys | stages | shared / limit | registers "
              "| spilled bytes | blocks per SM | occupancy |",
              "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for key, limits in TARGETS.items():
        for asked in ("float32", "bfloat16"):
            dtype = engine_dtype(asked, limits)
            for tile in ("decode", "prefill"):
                picks = [r for r in rows if r["target"] == key and r["kernel"] == "attention"
                         and r["dtype"] == dtype and r.get("head_dim") == 128
                         and r.get("group") == GROUPS[-1] and r.get("tile") == tile
                         and not r.get("split") and r.get("kv") != "fp8" and r["compiled"]]
                if not picks:
                    continue
                r = max(picks, key=lambda r: r["rows"])
                lines.append(
                    f"| {limits.name} ({key}) | {r['dtype']} | {tile} | {r['rows']} x {r['keys']} "
                    f"| {r['num_stages']} | {_kib(r['shared'])} / {_kib(limits.shared_per_block)} "
                    f"| {r['registers']} | {r['spill_bytes']:,} | {r['blocks_per_sm']} "
                    f"| {r['occupancy']:.0%} |")
    return "\n".join(lines)

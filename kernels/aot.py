"""Compiling a kernel launch ahead of time for a named GPU, and reading what it uses: shared
memory (Triton's metadata), registers per thread and spilled bytes (the cubin's resource usage
on NVIDIA, the code object's metadata on AMD). `python -m minicb bench gpu-compile` builds the
launches and the table; this module compiles them, in child processes that run without
TRITON_INTERPRET (`python -m minicb.kernels.aot` reads launches as JSON on stdin).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Launch:
    """One kernel launch the engine can make on one device, as the compiler needs it."""

    target: str
    kernel: str
    asked: str                  # the dtype the user asked for
    dtype: str                  # the dtype the engine runs on this device
    params: dict                # head_dim, group, rows, ... (for the table)
    constexprs: dict
    num_warps: int
    num_stages: int | None
    shared_estimate: int | None = None

    def key(self) -> tuple:
        return (self.target, self.kernel, self.dtype, tuple(sorted(self.constexprs.items())),
                self.num_warps, self.num_stages)


@dataclass
class Result:
    launch: Launch
    compiled: bool
    error: str = ""
    shared: int = 0
    registers: int = 0
    spill_bytes: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)



_TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _signature(fn, kernel: str, dtype: str, constexprs: dict) -> tuple[dict, dict]:
    """Each argument's type as the launcher would see it, and the 16-byte alignment hints the
    launcher derives from torch tensors (pointers) and from strides that are multiples of 16."""
    element = _TRITON_TYPES[dtype]
    float32_ptrs = {"lse_ptr", "weights_ptr"} | ({"partial_ptr"} if kernel == "merge" else set())
    # the quantized products' scales and (as quantize_model stores it) bias are float32
    float32_ptrs |= {"scale_ptr", "pairs_ptr", "bias_ptr"} if kernel.endswith("matmul") else set()
    int_ptrs = {"cu_seqlens_q_ptr", "seq_lens_ptr", "block_tables_ptr", "slot_mapping_ptr"}
    int64_ptrs = {"slot_mapping_ptr", "sorted_pairs_ptr", "block_experts_ptr"}
    byte_ptrs = {"int8_matmul": {"w_ptr": "i8"}, "int4_matmul": {"w_ptr": "u8"}}.get(kernel, {})
    fp8 = constexprs.get("KV_FP8", False)
    if fp8:   # an FP8 cache is read and written as bytes
        byte_ptrs |= {"k_cache_ptr": "u8", "v_cache_ptr": "u8"}
    signature, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            kind = ("fp32" if name in float32_ptrs else
                    "i64" if name in int64_ptrs else
                    "i32" if name in int_ptrs else byte_ptrs.get(name, element))
            signature[name] = "*" + kind
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name == "scale_log2":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            # strides along tokens, heads and blocks are multiples of head_dim (>= 16); an FP8
            # cache's rows are head_dim + 4 bytes, so its strides are not
            fp8_cache = fp8 and name.startswith(("stride_kc", "stride_vc"))
            if name.startswith("stride_") and "lse" not in name and not fp8_cache:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, attrs


def _kernel_fn(kernel: str):
    import importlib

    module, name = {"attention": ("paged_attention", "_paged_attention_kernel"),
                    "merge": ("split_kv", "_merge_splits_kernel"),
                    "write": ("kv_write", "_write_kv_kernel"),
                    "fused_moe": ("fused_moe", "_fused_moe_kernel"),
                    "int8_matmul": ("quant_matmul", "_int8_matmul_kernel"),
                    "int4_matmul": ("quant_matmul", "_int4_matmul_kernel")}[kernel]
    return getattr(importlib.import_module(f"minicb.kernels.{module}"), name)


def _nvidia_resources(cubin: bytes) -> tuple[int, int]:
    """Registers per thread and local-memory (stack: spills) bytes per thread, from cuobjdump."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    registers = int(re.search(r"REG:(\d+)", out).group(1))
    stack = int(re.search(r"STACK:(\d+)", out).group(1))
    local = int(re.search(r"LOCAL:(\d+)", out).group(1))
    return registers, stack + local


def _amd_resources(amdgcn: str) -> tuple[int, int, dict]:
    """VGPRs per lane (arch + accumulation registers) and spills, from the code object's
    metadata in the assembly."""
    def number(key: str) -> int:
        match = re.search(rf"\.{key}:\s+(\d+)", amdgcn)
        return int(match.group(1)) if match else 0

    vgprs, agprs = number("vgpr_count"), number("agpr_count")
    # VGPR spills go to scratch memory (4 bytes a lane each); SGPR spills mostly to VGPR lanes
    spills = number("vgpr_spill_count") * 4
    return vgprs, spills, {"sgprs": number("sgpr_count"), "agprs": agprs,
                           "vgpr_spills": number("vgpr_spill_count"),
                           "sgpr_spills": number("sgpr_spill_count")}


def compile_launch(launch: Launch) -> Result:
    """Compile one launch for its target and read what it uses. Must run without
    TRITON_INTERPRET (see :func:`compile_all`)."""
    import triton
    from minicb.kernels.targets import TARGETS, triton_target
    from triton.compiler import ASTSource

    limits = TARGETS[launch.target]
    fn = _kernel_fn(launch.kernel)
    signature, attrs = _signature(fn, launch.kernel, launch.dtype, launch.constexprs)
    options = {"num_warps": launch.num_warps}
    if launch.num_stages is not None:
        options["num_stages"] = launch.num_stages
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = triton.compile(ASTSource(fn, signature, launch.constexprs, attrs),
                                      target=triton_target(limits), options=options)
    except Exception as error:  # the compiler's own message is the result
        message = str(error).strip().splitlines()
        return Result(launch, False, error=" ".join(message[:3])[:400],
                      seconds=time.perf_counter() - start)
    extra = {}
    if limits.backend == "cuda":
        registers, spills = _nvidia_resources(compiled.asm["cubin"])
    else:
        registers, spills, extra = _amd_resources(compiled.asm["amdgcn"])
    return Result(launch, True, shared=compiled.metadata.shared, registers=registers,
                  spill_bytes=spills, seconds=time.perf_counter() - start, extra=extra)


def _worker() -> int:
    """Child process: launches as JSON on stdin, one result per line on stdout."""
    for item in json.load(sys.stdin):
        result = compile_launch(Launch(**item))
        row = asdict(result)
        row["launch"] = item
        print(json.dumps(row), flush=True)
    return 0


def compile_all(launches: list[Launch], jobs: int = 1, progress=None) -> list[Result]:
    """Compile every launch in ``jobs`` child processes that run without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime's default, without its warning
    cache = None
    if "TRITON_CACHE_DIR" not in env:
        cache = tempfile.TemporaryDirectory(prefix="minicb-triton-cache-")
        env["TRITON_CACHE_DIR"] = cache.name
    # Longest first (prefill tiles), dealt round-robin, so the children finish together.
    order = sorted(launches, key=lambda launch: -(launch.shared_estimate or 0))
    shares = [order[i::jobs] for i in range(max(1, jobs))]
    procs = []
    for share in shares:
        if not share:
            continue
        proc = subprocess.Popen([sys.executable, "-m", "minicb.kernels.aot"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        proc.stdin.write(json.dumps([asdict(launch) for launch in share]))
        proc.stdin.close()
        procs.append((proc, share))
    results = []
    try:
        for proc, _ in procs:
            for line in proc.stdout:
                row = json.loads(line)
                launch = Launch(**row.pop("launch"))
                results.append(Result(launch=launch, **{k: v for k, v in row.items()
                                                        if k != "launch"}))
                if progress:
                    progress(results[-1])
            if proc.wait() != 0:
                raise RuntimeError(f"a compile worker exited with {proc.returncode}")
    finally:
        if cache is not None:
            cache.cleanup()
    by_key = {launch.key(): i for i, launch in enumerate(launches)}
    return sorted(results, key=lambda r: by_key[r.launch.key()])


if __name__ == "__main__":
    sys.exit(_worker())


# --- a result as a row of the table (python -m minicb bench gpu-compile) ---

# what tells one launch from another in the results (a missing field: None)
IDENTITY = ("target", "kernel", "asked", "dtype", "num_warps", "num_stages", "head_dim", "group",
            "rows", "keys", "split", "splits", "kv_heads", "kv", "cols")


def identity(row: dict) -> tuple:
    """A result row's identity; rows from before FP8 caches existed read the model's dtype."""
    kv = row.get("kv", row["dtype"] if row["kernel"] in ("attention", "write") else None)
    return tuple(kv if name == "kv" else row.get(name) for name in IDENTITY)


def launch_identity(launch: Launch) -> tuple:
    return identity({"target": launch.target, "kernel": launch.kernel, "asked": launch.asked,
                     "dtype": launch.dtype, "num_warps": launch.num_warps,
                     "num_stages": launch.num_stages, **launch.params})


def row_of(result: Result) -> dict:
    """One result as a flat, JSON-ready row with the device's limits and the occupancy."""
    from minicb.kernels.targets import TARGETS, DoesNotFit, check_fits, occupancy

    launch, limits = result.launch, TARGETS[result.launch.target]
    row = {"target": launch.target, "device": limits.name, "kernel": launch.kernel,
           "asked": launch.asked, "dtype": launch.dtype, **launch.params,
           "num_warps": launch.num_warps, "num_stages": launch.num_stages,
           "compiled": result.compiled, "error": result.error,
           "shared": result.shared, "shared_limit": limits.shared_per_block,
           "shared_estimate": launch.shared_estimate, "registers": result.registers,
           "spill_bytes": result.spill_bytes, "seconds": round(result.seconds, 2), **result.extra}
    # the device's refusal, worded as it names the device and the limit (targets.check_fits)
    row["refused"] = ""
    if result.compiled:
        try:
            check_fits(limits, f"{launch.kernel} ({launch.dtype})", result.shared,
                       result.registers, launch.num_warps)
        except DoesNotFit as refusal:
            row["refused"] = str(refusal)
    row["fits"] = result.compiled and not row["refused"]
    if result.compiled:
        row.update(occupancy(limits, result.shared, result.registers, launch.num_warps))
    return row


def problems(rows: list[dict]) -> list[str]:
    """Every row that is a defect: not compiled, over a limit, or above its shared estimate."""
    found = []
    for row in rows:
        where = f"{row['kernel']} {row['asked']} on {row['device']} ({row['target']}) {row}"
        if not row["compiled"]:
            found.append(f"did not compile: {where}")
        elif not row["fits"]:
            found.append(f"{row['refused']} {where}")
        elif row.get("shared_estimate") is not None and row["shared"] > row["shared_estimate"]:
            found.append(f"shared memory {row['shared']} above the tile choice's estimate "
                         f"{row['shared_estimate']}: {where}")
    return found

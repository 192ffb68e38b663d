"""The CPU kernels: paged attention (``cpu_attention.c``), the small-batch matrix product
(``cpu_linear.c``) and a whole decoder layer for decode steps (``cpu_decode_layer.c``), compiled
together (``cpu_kernels.c``) into one library on first use and called through ctypes.

Triton runs on a CPU only through its interpreter, far too slow to serve with, and the torch
backend's gather + SDPA moves every decode row's (padded) keys three times. This kernel reads each
row's real keys once, straight from its blocks. It is compiled with the machine's C compiler
(``cc``, or ``$CC``) the first time it is needed and cached under ``~/.cache/minicb`` (or
``$MINICB_CACHE``), keyed by the sources, the flags and the CPU, so later runs load it in
milliseconds.
A cached library is loaded only if it is private to this user and its hash matches the one
recorded when it was built; anything else is rebuilt, never loaded.
Where no compiler works, :func:`available` says why, and the engine keeps the torch backend.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_kernels.c")      # includes the three below
SOURCES = (SOURCE, *(Path(__file__).with_name(name) for name in
                     ("cpu_attention.c", "cpu_linear.c", "cpu_decode_layer.c")))
# Tried in order: the fastest build first, then builds for compilers without -march=native or
# OpenMP (Apple's clang has no -fopenmp: the kernel then runs on one thread).
FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3", "-march=native"],
             ["-O3"])


class CPUKernelUnavailable(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("MINICB_CACHE") or Path.home() / ".cache" / "minicb") / "kernels"


def _private(path: Path) -> bool:
    """Owned by this user and writable by no one else: nobody else can have put a file there."""
    info = path.stat()
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _trusted(target: Path) -> bool:
    """A cached library is loaded only if this code wrote it: the directory and the file are
    private to this user and the file's hash matches the one recorded when it was compiled. A
    file planted under the expected name is never loaded (its constructor never runs)."""
    record = target.with_suffix(".sha256")
    try:
        return (_private(target.parent) and _private(target) and _private(record)
                and record.read_text().strip() == _digest(target))
    except OSError:
        return False


def _compile(compiler: str, flags: list[str], target: Path) -> str | None:
    """Build the shared library at `target`; return the compiler's complaint, or None on success."""
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        cmd = [compiler, *flags, "-shared", "-fPIC", str(SOURCE), "-o", str(built), "-lm"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"{' '.join(cmd)}: {err}"
        if done.returncode != 0:
            return f"{' '.join(cmd)}: {done.stderr.strip()[-500:]}"
        built.chmod(0o700)
        record = Path(tmp) / "digest"
        record.write_text(_digest(built))
        record.chmod(0o600)
        os.replace(built, target)   # atomic: a concurrent process sees the old file or the new one
        os.replace(record, target.with_suffix(".sha256"))
    return None


def _cpu_identity() -> str:
    """What -march=native compiles for: the CPU's feature flags where Linux lists them. Part of the
    cache key, so a cache shared between different machines never loads a build for another CPU."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(("flags", "Features")):
                    return line.strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


@functools.cache
def _library() -> ctypes.CDLL:
    compiler = (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
                or shutil.which("clang"))
    if compiler is None:
        raise CPUKernelUnavailable("no C compiler found (cc, gcc or clang; or set $CC)")
    source = b"".join(path.read_bytes() for path in SOURCES)
    complaints = []
    for flags in FLAG_SETS:
        recipe = " ".join([compiler, *flags, _cpu_identity()]).encode()
        key = hashlib.sha256(source + recipe).hexdigest()[:16]
        directory = cache_dir()
        if directory.exists() and not _private(directory):
            # a cache others can write to is not used: build into a private directory instead
            directory = Path(tempfile.mkdtemp(prefix="minicb-kernels-"))
        target = directory / f"cpu_attention-{key}.so"
        if not _trusted(target):
            try:
                complaint = _compile(compiler, flags, target)
            except OSError as err:   # e.g. a cache directory that cannot be written
                complaint = f"{target.parent}: {err} (set $MINICB_CACHE to a writable directory)"
            if complaint:
                complaints.append(complaint)
                continue
        try:
            lib = ctypes.CDLL(str(target))
        except OSError as err:
            complaints.append(f"{target}: {err}")
            continue
        fn = lib.minicb_paged_attention_f32
        fn.restype = ctypes.c_int
        fn.argtypes = ([ctypes.c_void_p] * 7 + [ctypes.c_int64] * 8
                       + [ctypes.c_float, ctypes.c_int32])
        linear = lib.minicb_linear_f32
        linear.restype = None
        linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
        layer = lib.minicb_decode_layer_f32
        layer.restype = ctypes.c_int
        layer.argtypes = ([ctypes.c_void_p] * 22 + [ctypes.c_int64] * 9
                          + [ctypes.c_float] * 2)
        lib.flags = flags
        return lib
    raise CPUKernelUnavailable("the CPU attention kernel did not compile: "
                               + " | ".join(complaints))


def available() -> tuple[bool, str]:
    """(True, how it was built) or (False, why not)."""
    try:
        return True, " ".join(_library().flags)
    except CPUKernelUnavailable as err:
        return False, str(err)


def _require(name: str, t: torch.Tensor, dtype: torch.dtype, fix: str = "") -> None:
    """Refuse a tensor the C code cannot read as a plain array: another device, dtype or layout."""
    if t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {str(dtype).removeprefix('torch.')} CPU "
                         f"tensor, got {t.dtype} on {t.device}{'; ' + fix if fix else ''}.")


def paged_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                        block_tables: torch.Tensor, scale: float, decodes_only: bool = False,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """Attend a packed batch over the paged cache; same contract as the Triton ``paged_attention``.

    q [num_tokens, q_heads, head_dim] and the caches [num_blocks, block_size, kv_heads, head_dim]
    must be float32, contiguous and on the CPU; the index tensors int32.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _require(name, t, torch.float32, "use attention='torch' for other dtypes and devices")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("seq_lens", seq_lens),
                    ("block_tables", block_tables)):
        _require(name, t, torch.int32)
    num_tokens, q_heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not divide into {kv_heads} KV heads.")
    if out is None:
        out = torch.empty_like(q)
    elif (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or
          not out.is_contiguous()):
        raise ValueError("out must be a contiguous tensor shaped and typed like q "
                         f"{tuple(q.shape)}, got {tuple(out.shape)} {out.dtype}.")
    if num_tokens == 0:
        return out
    status = _library().minicb_paged_attention_f32(q.data_ptr(), k_cache.data_ptr(),
                                                   v_cache.data_ptr(), out.data_ptr(),
                                                   cu_seqlens_q.data_ptr(), seq_lens.data_ptr(),
                                                   block_tables.data_ptr(), seq_lens.numel(),
                                                   num_tokens, q_heads, kv_heads, head_dim,
                                                   block_size, block_tables.shape[1], num_blocks,
                                                   scale, int(decodes_only))
    if status == -2:
        raise ValueError("a block table names a block outside the KV pool, or is shorter than its "
                         "row's keys.")
    if status != 0:
        raise MemoryError("the CPU attention kernel could not allocate its scratch rows")
    return out


def linear_cpu(x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a few rows (cpu_linear.c): x [m, k] and weight [n, k]
    contiguous float32 CPU tensors, bias [n] or None; returns [m, n]."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            _require(name, t, torch.float32, "use torch.nn.functional.linear")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply: "
                         "x is [rows, in_features], weight [out_features, in_features].")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias {tuple(bias.shape)} must be [{weight.shape[0]}].")
    (m, k), n = x.shape, weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype)
    if m:
        _library().minicb_linear_f32(x.data_ptr(), weight.data_ptr(),
                                     None if bias is None else bias.data_ptr(), out.data_ptr(),
                                     m, n, k)
    return out


@dataclass
class DecodeStep:
    """What every layer of one decode step shares: checked, and its scratch rows allocated, once
    per step (decode_step_cpu) rather than once per layer."""

    cos: torch.Tensor               # [rows, head_dim]
    signed_sin: torch.Tensor        # [rows, head_dim]
    slot_mapping: torch.Tensor      # int64 [rows]
    seq_lens: torch.Tensor          # int32 [rows]
    block_tables: torch.Tensor      # int32 [rows, width]
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float
    scratch: tuple[torch.Tensor, ...]   # h, qkv, attn, gate_up, act (cpu_decode_layer.c)


def decode_step_cpu(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                    slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                    block_tables: torch.Tensor, q_heads: int, kv_heads: int, head_dim: int,
                    intermediate: int, eps: float, scale: float) -> DecodeStep:
    """Check a step in which every row decodes one token, and allocate its scratch rows: x
    [rows, hidden] float32; cos and signed_sin [rows, head_dim]; slot_mapping int64 [rows];
    seq_lens int32 [rows]; block_tables int32 [rows, width]."""
    for name, t, dtype in (("x", x, torch.float32), ("cos", cos, torch.float32),
                           ("signed_sin", signed_sin, torch.float32),
                           ("slot_mapping", slot_mapping, torch.int64),
                           ("seq_lens", seq_lens, torch.int32),
                           ("block_tables", block_tables, torch.int32)):
        _require(name, t, dtype)
    rows, hidden = x.shape
    if seq_lens.numel() != rows or slot_mapping.numel() != rows or block_tables.shape[0] != rows:
        raise ValueError(f"a decode step has one slot, length and block table per row: {rows} rows,"
                         f" {slot_mapping.numel()} slots, {seq_lens.numel()} lengths, "
                         f"{block_tables.shape[0]} tables.")
    sizes = [rows * hidden, rows * (q_heads + 2 * kv_heads) * head_dim, rows * q_heads * head_dim,
             rows * 2 * intermediate, rows * intermediate]
    scratch = torch.empty(sum(sizes), dtype=torch.float32).split(sizes)
    return DecodeStep(cos, signed_sin, slot_mapping, seq_lens, block_tables, q_heads, kv_heads,
                      head_dim, intermediate, eps, scale, scratch)


def decode_layer_cpu(x: torch.Tensor, layer: dict[str, torch.Tensor | None],
                     k_cache: torch.Tensor, v_cache: torch.Tensor, step: DecodeStep) -> None:
    """One decoder layer of a decode step (cpu_decode_layer.c): x [rows, hidden] is updated in
    place and this step's k and v are written into the caches [num_blocks, block_size, kv_heads,
    head_dim].

    ``layer`` holds contiguous float32 tensors: norm1, qkv (and qkv_bias or None), o, norm2,
    gate_up (and gate_up_bias), down (and down_bias), as DecoderLayer.cpu_weights gives them.
    """
    _require("k_cache", k_cache, torch.float32)
    _require("v_cache", v_cache, torch.float32)
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    if (kv_heads, head_dim) != (step.kv_heads, step.head_dim) or v_cache.shape != k_cache.shape:
        raise ValueError(f"the caches {tuple(k_cache.shape)} and {tuple(v_cache.shape)} do not "
                         f"hold {step.kv_heads} KV heads of {step.head_dim}.")
    rows, hidden = x.shape
    if rows == 0:
        return

    def ptr(t: torch.Tensor | None) -> int | None:
        return None if t is None else t.data_ptr()

    h, qkv, attn, gate_up, act = step.scratch
    status = _library().minicb_decode_layer_f32(
        x.data_ptr(), ptr(layer["norm1"]), ptr(layer["qkv"]), ptr(layer["qkv_bias"]),
        ptr(layer["o"]), ptr(layer["norm2"]), ptr(layer["gate_up"]), ptr(layer["gate_up_bias"]),
        ptr(layer["down"]), ptr(layer["down_bias"]), step.cos.data_ptr(),
        step.signed_sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        step.slot_mapping.data_ptr(), step.seq_lens.data_ptr(), step.block_tables.data_ptr(),
        h.data_ptr(), qkv.data_ptr(), attn.data_ptr(), gate_up.data_ptr(), act.data_ptr(), rows,
        hidden, step.intermediate, step.q_heads, kv_heads, head_dim, block_size,
        step.block_tables.shape[1], num_blocks, step.eps, step.scale)
    if status == -2:
        raise ValueError("a block table names a block outside the KV pool, is shorter than its "
                         "row's keys, or a slot lies outside the pool.")
    if status != 0:
        raise MemoryError("the fused decode layer could not allocate its scratch rows")

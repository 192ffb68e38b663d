"""The CPU kernels, compiled on first use into one library (``libminicb_cpu_kernels``) and called
through ctypes: paged attention (``cpu_attention.c``), the small-batch matrix product
(``cpu_linear.c``) and a whole decoder layer for decode steps (``cpu_decode_layer.c``). Their
entry points, and the fused layer's arguments as one struct, are declared in ``cpu_kernels.h``;
:class:`LayerArgs` mirrors that struct field by field. Activations are float32; weights may be
float32, bfloat16, int8 with per-channel scales, or int4 (two to a byte) with a scale and an
offset per group of 32; the KV cache float32, bfloat16 or int8 with a scale per (token, KV head)
inside its block (``DTYPE_CODES``, ``KV_SCALE_BYTES``, ``I4_GROUP``).

The library is built once per instruction set (kernels/isa.py: AVX2, AVX-512, AVX-512 BF16) and
the widest build the CPU runs is loaded; ``$MINICB_CPU_ISA`` forces one.

Triton runs on a CPU only through its interpreter, far too slow to serve with, and the torch
backend's gather + SDPA moves every decode row's (padded) keys three times. The attention kernel
reads each row's real keys once, straight from its blocks. The library is compiled with the
machine's C compiler (``cc``, or ``$CC``) the first time it is needed and cached under
``~/.cache/minicb`` (or ``$MINICB_CACHE``), keyed by the sources, the build's flags and the CPU,
so later runs load it in milliseconds.
A cached library is loaded only if it is private to this user and its hash matches the one
recorded when it was built; anything else is rebuilt, never loaded.
Where no compiler works, :func:`available` says why, and the engine keeps the torch backend.
Nothing here needs Triton.
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
from minicb.kernels import isa

HEADERS = tuple(Path(__file__).with_name(name) for name in ("cpu_kernels.h", "cpu_simd.h"))
# each compiles on its own; they are linked into one library
SOURCES = tuple(Path(__file__).with_name(name) for name in
                ("cpu_attention.c", "cpu_linear.c", "cpu_decode_layer.c", "cpu_moe.c"))
LIBRARY = "libminicb_cpu_kernels"
# enum minicb_dtype (cpu_kernels.h): how a weight matrix or the KV cache is stored
# (uint8: int4 weights, two values a byte in groups of I4_GROUP; weights only, never a cache)
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2, torch.uint8: 3}
I4_GROUP = 32           # MINICB_I4_GROUP: values of an int4 row sharing a scale and an offset
I8_GROUPED = 4          # MINICB_I8_GROUPED: int8 weights in groups of I4_GROUP, as int4's


def weight_code(weight: torch.Tensor, scale: torch.Tensor | None) -> int:
    """The C code's format of a weight (enum minicb_dtype): its dtype's, except int8 with
    per-group (scale, offset) pairs [n, k / 32, 2] rather than per-channel scales [n]."""
    if weight.dtype == torch.int8 and scale is not None and scale.dim() == 3:
        return I8_GROUPED
    return DTYPE_CODES[weight.dtype]
MAX_HEAD_DIM = 256      # MINICB_MAX_HEAD_DIM: the attention kernel's scratch row for one head
# MINICB_KV_SCALE_BYTES: an int8 cache row is head_dim values, then its float32 scale's 4 bytes
KV_SCALE_BYTES = 4


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
        cmd = [compiler, *flags, "-shared", "-fPIC", *map(str, SOURCES), "-o", str(built), "-lm"]
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
def _library(build: str | None = None) -> ctypes.CDLL:
    """The library compiled for one instruction set (kernels/isa.py), built on first use; None:
    the build for this CPU (isa.chosen: the widest it runs, or $MINICB_CPU_ISA)."""
    if build is None:
        try:
            return _library(isa.chosen())
        except ValueError as err:
            raise CPUKernelUnavailable(str(err)) from None
    compiler = (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
                or shutil.which("clang"))
    if compiler is None:
        raise CPUKernelUnavailable("no C compiler found (cc, gcc or clang; or set $CC)")
    source = b"".join(path.read_bytes() for path in (*HEADERS, *SOURCES))
    complaints = []
    for flags in isa.compiler_flags(build):
        recipe = " ".join([compiler, *flags, _cpu_identity()]).encode()
        key = hashlib.sha256(source + recipe).hexdigest()[:16]
        directory = cache_dir()
        if directory.exists() and not _private(directory):
            # a cache others can write to is not used: build into a private directory instead
            directory = Path(tempfile.mkdtemp(prefix="minicb-kernels-"))
        target = directory / f"{LIBRARY}-{key}.so"
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
        _declare(lib)
        lib.flags, lib.build = flags, build
        return lib
    raise CPUKernelUnavailable("the CPU kernels did not compile: " + " | ".join(complaints))


def _declare(lib: ctypes.CDLL) -> None:
    """The entry points' argument and result types, as cpu_kernels.h declares them."""
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float
    lib.minicb_paged_attention.restype = ctypes.c_int
    lib.minicb_paged_attention.argtypes = [p] * 3 + [i32] + [p] * 4 + [i64] * 8 + [f32, i32]
    lib.minicb_linear.restype = ctypes.c_int
    lib.minicb_linear.argtypes = [p] * 3 + [i32] + [p] * 2 + [i64] * 3
    lib.minicb_decode_layer.restype = ctypes.c_int
    lib.minicb_decode_layer.argtypes = [ctypes.POINTER(LayerArgs)]
    lib.minicb_layer_args_field.restype = ctypes.c_char_p
    lib.minicb_layer_args_field.argtypes = [i64, ctypes.POINTER(i64), ctypes.POINTER(i64)]
    lib.minicb_layer_args_size.restype = i64
    lib.minicb_layer_args_size.argtypes = []


_p, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class LayerArgs(ctypes.Structure):
    """struct minicb_layer_args (cpu_kernels.h), field by field: the fused layer's arguments by
    name. tests/minicb_kernels/test_cpu_kernels_build.py holds the two layouts to each other."""

    _fields_ = [
        ("x", _p),                                       # the residual stream, updated in place
        ("norm1", _p), ("w_qkv", _p), ("b_qkv", _p),     # the layer's weights (None: absent)
        ("q_norm", _p), ("k_norm", _p), ("w_o", _p), ("b_o", _p), ("norm2", _p),
        ("w_gate_up", _p), ("b_gate_up", _p), ("w_down", _p), ("b_down", _p),
        ("s_qkv", _p), ("s_o", _p), ("s_gate_up", _p), ("s_down", _p),   # int8 weights' scales
        ("cos", _p), ("signed_sin", _p),                 # the step, shared by every layer
        ("k_cache", _p), ("v_cache", _p), ("slot_mapping", _p), ("seq_lens", _p),
        ("block_tables", _p),
        ("h", _p), ("qkv", _p), ("attn", _p), ("gate_up", _p), ("act", _p),   # scratch rows
        ("x_round", _p),
        ("m", _i64), ("hidden", _i64), ("intermediate", _i64), ("q_heads", _i64),
        ("kv_heads", _i64), ("head_dim", _i64), ("block_size", _i64), ("table_width", _i64),
        ("num_blocks", _i64), ("w_dtype", _i64), ("kv_dtype", _i64),
        ("eps", _f32), ("scale", _f32),
    ]


def c_layout() -> tuple[int, list[tuple[str, int, int]]]:
    """The C struct's size and its fields (name, offset, size), as the compiled library sees
    them."""
    lib, fields = _library(), []
    offset, size = ctypes.c_int64(), ctypes.c_int64()
    while (name := lib.minicb_layer_args_field(len(fields), ctypes.byref(offset),
                                               ctypes.byref(size))) is not None:
        fields.append((name.decode(), offset.value, size.value))
    return lib.minicb_layer_args_size(), fields


def available() -> tuple[bool, str]:
    """(True, which build and how it was compiled) or (False, why not)."""
    try:
        lib = _library()
        return True, f"{lib.build}: {' '.join(lib.flags)}"
    except CPUKernelUnavailable as err:
        return False, str(err)


def _require(name: str, t: torch.Tensor, dtype: torch.dtype, fix: str = "") -> None:
    """Refuse a tensor the C code cannot read as a plain array: another device, dtype or layout."""
    if t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {str(dtype).removeprefix('torch.')} CPU "
                         f"tensor, got {t.dtype} on {t.device}{'; ' + fix if fix else ''}.")


def _require_typed(name: str, t: torch.Tensor, fix: str = "") -> int:
    """A weight or cache the C code reads in one of its formats (DTYPE_CODES): its format's
    code."""
    if t.dtype not in DTYPE_CODES:
        raise ValueError(f"{name} is {t.dtype}; the CPU kernels read float32, bfloat16 or int8 "
                         f"(or int4 weights packed as uint8){'; ' + fix if fix else ''}.")
    _require(name, t, t.dtype, fix)
    return DTYPE_CODES[t.dtype]


def cache_format(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int]:
    """(format code, head_dim) of a KV cache [num_blocks, block_size, kv_heads, row]: a row is
    head_dim float32 or bfloat16 values, or for int8 head_dim values and then the 4 bytes of
    their float32 scale (minicb.model.quant.pack_kv_int8)."""
    if k_cache.dtype == torch.uint8:
        raise ValueError("k_cache is uint8 (the int4 weight format); a KV cache is float32, "
                         "bfloat16 or int8.")
    code = _require_typed("k_cache", k_cache)
    if v_cache.dtype != k_cache.dtype or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache "
                         f"{tuple(v_cache.shape)} {v_cache.dtype} must match.")
    _require("v_cache", v_cache, v_cache.dtype)
    head_dim = k_cache.shape[3] - (KV_SCALE_BYTES if k_cache.dtype == torch.int8 else 0)
    if not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"a cache row of {k_cache.shape[3]} {k_cache.dtype} holds head_dim "
                         f"{head_dim}; the CPU kernel takes 1 to {MAX_HEAD_DIM}. Use "
                         "attention='torch'.")
    return code, head_dim


def paged_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                        block_tables: torch.Tensor, scale: float, decodes_only: bool = False,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """Attend a packed batch over the paged cache; same contract as the Triton ``paged_attention``.

    q [num_tokens, q_heads, head_dim] must be float32, the caches [num_blocks, block_size,
    kv_heads, row] float32, bfloat16 or int8 with its scales (cache_format), all contiguous and
    on the CPU; the index tensors int32.
    """
    _require("q", q, torch.float32, "use attention='torch' for other dtypes and devices")
    kv_dtype, cache_head_dim = cache_format(k_cache, v_cache)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("seq_lens", seq_lens),
                    ("block_tables", block_tables)):
        _require(name, t, torch.int32)
    num_tokens, q_heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not divide into {kv_heads} KV heads.")
    if head_dim != cache_head_dim:
        raise ValueError(f"q has head_dim {head_dim}, the cache {cache_head_dim}.")
    if out is None:
        out = torch.empty_like(q)
    elif (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or
          not out.is_contiguous()):
        raise ValueError("out must be a contiguous tensor shaped and typed like q "
                         f"{tuple(q.shape)}, got {tuple(out.shape)} {out.dtype}.")
    if num_tokens == 0:
        return out
    status = _library().minicb_paged_attention(q.data_ptr(), k_cache.data_ptr(),
                                               v_cache.data_ptr(), kv_dtype, out.data_ptr(),
                                               cu_seqlens_q.data_ptr(), seq_lens.data_ptr(),
                                               block_tables.data_ptr(),
                                               seq_lens.numel(), num_tokens, q_heads, kv_heads,
                                               head_dim, block_size, block_tables.shape[1],
                                               num_blocks, scale, int(decodes_only))
    if status == -2:
        raise ValueError("a block table names a block outside the KV pool, or is shorter than its "
                         "row's keys.")
    if status != 0:
        raise MemoryError("the CPU attention kernel could not allocate its scratch rows")
    return out


def linear_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               scale: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a few rows (cpu_linear.c): x [m, k] a contiguous float32
    CPU tensor; weight [n, k] float32, bfloat16, or int8 with its per-output-channel float32
    ``scale`` [n] (the product is then ``x (weight * scale[:, None])^T``), or int4: uint8
    [n, k / 2] in groups of 32 (minicb.model.quant.pack_int4) with ``scale`` [n, k / 32, 2], each
    group's (scale, offset); bias [n] float32 or None. Returns float32 [m, n]."""
    _require("x", x, torch.float32, "use torch.nn.functional.linear")
    _require_typed("weight", weight, "use torch.nn.functional.linear")
    int4 = weight.dtype == torch.uint8
    grouped = int4 or (weight.dtype == torch.int8 and scale is not None and scale.dim() == 3)
    # an int4 row holds two values a byte
    k_weight = weight.shape[-1] * (2 if int4 else 1)
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != k_weight:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply: "
                         "x is [rows, in_features], weight [out_features, in_features] "
                         "(in_features / 2 bytes for int4).")
    if grouped and k_weight % I4_GROUP:
        raise ValueError(f"grouped weights come in groups of {I4_GROUP} along a row; "
                         f"in_features {k_weight} is no multiple of {I4_GROUP}.")
    scale_shape = (weight.shape[0], k_weight // I4_GROUP, 2) if grouped else (weight.shape[0],)
    for name, t, shape in (("bias", bias, (weight.shape[0],)), ("scale", scale, scale_shape)):
        if t is not None:
            _require(name, t, torch.float32)
            if t.shape != shape:
                raise ValueError(f"{name} {tuple(t.shape)} must be {list(shape)}.")
    if (weight.dtype in (torch.int8, torch.uint8)) != (scale is not None):
        raise ValueError("int8 weights need their per-channel scale (int4 weights their per-group "
                         "(scale, offset) pairs), and only they take one.")
    (m, k), n = x.shape, weight.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    if m and _library().minicb_linear(
            x.data_ptr(), weight.data_ptr(), None if scale is None else scale.data_ptr(),
            weight_code(weight, scale), None if bias is None else bias.data_ptr(), out.data_ptr(),
            m, n, k) != 0:
        raise MemoryError("the CPU linear kernel could not allocate its rounded input rows")
    return out


# The layer's tensors the fused layer reads, by their LayerArgs names; None where the model has no
# such part (a bias, Qwen3's per-head q/k norms, int8 weights' scales) except for the first six,
# which every layer has.
WEIGHTS = ("norm1", "w_qkv", "w_o", "norm2", "w_gate_up", "w_down",
           "b_qkv", "q_norm", "k_norm", "b_o", "b_gate_up", "b_down",
           "s_qkv", "s_o", "s_gate_up", "s_down")
REQUIRED_WEIGHTS = WEIGHTS[:6]
MATRICES = {"w_qkv": "s_qkv", "w_o": "s_o", "w_gate_up": "s_gate_up", "w_down": "s_down"}


@dataclass
class DecodeStep:
    """What every layer of one decode step shares: checked, its scratch rows allocated and its
    part of the layer's arguments filled in, once per step (decode_step_cpu) rather than once per
    layer."""

    args: LayerArgs
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    keep: tuple[torch.Tensor, ...]  # the tensors args points into, alive as long as the step


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
    if cos.shape != (rows, head_dim) or signed_sin.shape != (rows, head_dim):
        raise ValueError(f"cos and signed_sin must be [{rows}, {head_dim}], got "
                         f"{tuple(cos.shape)} and {tuple(signed_sin.shape)}.")
    sizes = [rows * hidden, rows * (q_heads + 2 * kv_heads) * head_dim, rows * q_heads * head_dim,
             rows * 2 * intermediate, rows * intermediate,
             rows * max(hidden, q_heads * head_dim, intermediate)]   # x_round: any product's input
    scratch = torch.empty(sum(sizes), dtype=torch.float32).split(sizes)
    h, qkv, attn, gate_up, act, x_round = (t.data_ptr() for t in scratch)
    args = LayerArgs(x=x.data_ptr(), cos=cos.data_ptr(), signed_sin=signed_sin.data_ptr(),
                     slot_mapping=slot_mapping.data_ptr(), seq_lens=seq_lens.data_ptr(),
                     block_tables=block_tables.data_ptr(), h=h, qkv=qkv, attn=attn,
                     gate_up=gate_up, act=act, x_round=x_round, m=rows, hidden=hidden,
                     intermediate=intermediate,
                     q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                     table_width=block_tables.shape[1], eps=eps, scale=scale)
    keep = (x, cos, signed_sin, slot_mapping, seq_lens, block_tables, *scratch)
    return DecodeStep(args, q_heads, kv_heads, head_dim, hidden, keep)


def check_layer_weights(layer: dict[str, torch.Tensor | None]) -> int:
    """Refuse a layer the fused layer cannot run as it is: a tensor it has no slot for, a
    required one missing, or one the C code cannot read. The four matrices share one format
    (float32, bfloat16, int8 or int4 with their scales); norms, biases and scales are float32.
    Returns the matrices' format code."""
    unknown = sorted(set(layer) - set(WEIGHTS))
    if unknown:
        raise ValueError(f"the fused decode layer has no slot for {', '.join(unknown)}; it reads "
                         f"{', '.join(WEIGHTS)}.")
    missing = [name for name in REQUIRED_WEIGHTS if layer.get(name) is None]
    if missing:
        raise ValueError(f"the fused decode layer needs {', '.join(missing)}.")
    formats = {layer[name].dtype for name in MATRICES}
    if len(formats) != 1 or not formats <= set(DTYPE_CODES):
        raise ValueError(f"the fused decode layer's four matrices share one format of "
                         f"float32, bfloat16, int8 or int4 (uint8); got "
                         f"{sorted(map(str, formats))}.")
    quantized = formats in ({torch.int8}, {torch.uint8})
    for matrix, scale in MATRICES.items():
        if quantized != (layer.get(scale) is not None):
            raise ValueError(f"{matrix} is {layer[matrix].dtype}: int8 and int4 matrices need "
                             f"their scales ({scale}), and only they take one.")
    codes = {weight_code(layer[m], layer.get(s)) for m, s in MATRICES.items()}
    if len(codes) != 1:
        raise ValueError("the fused decode layer's int8 matrices share one kind of scales: per "
                         "channel or per group.")
    if codes & {DTYPE_CODES[torch.uint8], I8_GROUPED}:
        if any(layer[m].shape[1] * (2 if layer[m].dtype == torch.uint8 else 1) % I4_GROUP
               for m in MATRICES):
            raise ValueError(f"grouped matrices come in groups of {I4_GROUP} along a row.")
    fix = "Use attention='torch' for other dtypes and devices."
    for name, tensor in layer.items():   # the C code reads them as plain arrays
        if tensor is None:
            continue
        if name in MATRICES:
            _require(name, tensor, tensor.dtype, fix)
        else:
            _require(name, tensor, torch.float32, f"norms, biases and scales are float32. {fix}")
    return codes.pop()


def decode_layer_cpu(x: torch.Tensor, layer: dict[str, torch.Tensor | None],
                     k_cache: torch.Tensor, v_cache: torch.Tensor, step: DecodeStep,
                     w_dtype: int = 0) -> None:
    """One decoder layer of a decode step (cpu_decode_layer.c): x [rows, hidden], the step's own
    (decode_step_cpu), is updated in place and this step's k and v are written into the caches
    [num_blocks, block_size, kv_heads, row] (float32, bfloat16, or int8 with its scales:
    cache_format).

    ``layer`` maps the names in WEIGHTS to contiguous tensors (or None for an optional part), as
    minicb.model.fused_cpu.layer_weights gives them, checked there by check_layer_weights, whose
    answer is ``w_dtype``.
    """
    kv_dtype, head_dim = cache_format(k_cache, v_cache)
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    if (kv_heads, head_dim) != (step.kv_heads, step.head_dim):
        raise ValueError(f"the caches {tuple(k_cache.shape)} and {tuple(v_cache.shape)} do not "
                         f"hold {step.kv_heads} KV heads of {step.head_dim}.")
    if x.data_ptr() != step.args.x or x.shape != (step.args.m, step.hidden):
        raise ValueError("x must be the hidden states the step was set up with "
                         "(decode_step_cpu).")
    if step.args.m == 0:
        return
    args = step.args
    for name in WEIGHTS:
        tensor = layer.get(name)
        setattr(args, name, None if tensor is None else tensor.data_ptr())
    args.k_cache, args.v_cache = k_cache.data_ptr(), v_cache.data_ptr()
    args.kv_dtype, args.w_dtype = kv_dtype, w_dtype
    args.block_size, args.num_blocks = block_size, num_blocks
    status = _library().minicb_decode_layer(ctypes.byref(args))
    if status == -2:
        raise ValueError("a block table names a block outside the KV pool, is shorter than its "
                         "row's keys, or a slot lies outside the pool.")
    if status != 0:
        raise MemoryError("the fused decode layer could not allocate its scratch rows")

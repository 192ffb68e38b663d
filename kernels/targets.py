"""The GPUs the kernels are built for, what each one holds, and the dtype each one can run.

A launch that a GPU cannot hold fails only on that GPU: Triton's interpreter (how the kernel
tests run on a CPU) has no shared-memory limit, no registers and no missing instructions. So the
tile choice reads the device's limits (:func:`limits_for_device` on a live GPU, :data:`TARGETS`
for the seven parts checked ahead of time by ``python -m minicb bench gpu-compile``), and
:func:`check_fits` refuses a compiled kernel that is over a limit with a message naming the
device and the limit. Every number here comes from ``minicb/facts.py`` with its source.

                      per-block shared   threads/SM   bfloat16
    T4        sm_75        64 KiB           1024        no  -> float16, stated
    A100      sm_80       163 KiB           2048        yes
    A10       sm_86        99 KiB           1536        yes
    L4        sm_89        99 KiB           1536        yes
    H100      sm_90       227 KiB           2048        yes
    MI250     gfx90a       64 KiB (LDS)     2048        yes
    MI300     gfx942       64 KiB (LDS)     2048        yes
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

from minicb.facts import fact


@dataclass(frozen=True)
class GpuLimits:
    """What one GPU gives one kernel launch: the numbers occupancy is computed from."""

    key: str                   # "sm_75", "gfx942": the compiler's name for the target
    name: str                  # the parts a reader knows it by
    backend: str               # "cuda" or "hip"
    arch: int | str            # 75 (compute capability 7.5) or "gfx942"
    warp_size: int
    shared_per_block: int      # bytes one block may use (the opt-in maximum)
    shared_per_sm: int         # bytes all resident blocks share
    shared_reserved_per_block: int
    registers_per_sm: int      # 32-bit registers in one SM (CUDA) / one CU (HIP)
    max_registers_per_thread: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    bf16: bool

    @property
    def label(self) -> str:
        return f"{self.name} ({self.key})"


def _from_facts(key: str, name: str, backend: str, arch: int | str) -> GpuLimits:
    prefix = f"sm{arch}" if backend == "cuda" else str(arch)

    def value(field: str):
        return fact(f"{prefix}_{field}").value

    if backend == "cuda":
        registers = value("registers_per_sm")
    else:  # one CU: every SIMD lane of every SIMD has its own VGPR file
        registers = value("registers_per_simd_lane") * value("simds_per_cu") * value("warp_size")
    return GpuLimits(
        key=key, name=name, backend=backend, arch=arch, warp_size=value("warp_size"),
        shared_per_block=value("shared_per_block"), shared_per_sm=value("shared_per_sm"),
        shared_reserved_per_block=value("shared_reserved_per_block"),
        registers_per_sm=registers, max_registers_per_thread=value("max_registers_per_thread"),
        max_threads_per_sm=value("max_threads_per_sm"),
        max_blocks_per_sm=value("max_blocks_per_sm"),
        bf16=value("bf16") == "yes",
    )


# The seven targets the kernels are compiled for ahead of time, in the order tables show them.
TARGETS: dict[str, GpuLimits] = {t.key: t for t in (
    _from_facts("sm_75", "T4", "cuda", 75),
    _from_facts("sm_80", "A100", "cuda", 80),
    _from_facts("sm_86", "A10 / RTX 30", "cuda", 86),
    _from_facts("sm_89", "L4 / RTX 40", "cuda", 89),
    _from_facts("sm_90", "H100", "cuda", 90),
    _from_facts("gfx90a", "MI250", "hip", "gfx90a"),
    _from_facts("gfx942", "MI300", "hip", "gfx942"),
)}


def triton_target(limits: GpuLimits):
    """The ``triton.backends.compiler.GPUTarget`` that compiles for this device."""
    from triton.backends.compiler import GPUTarget

    return GPUTarget(limits.backend, limits.arch, limits.warp_size)


@functools.lru_cache(maxsize=8)
def limits_for_device(device) -> GpuLimits:
    """The limits of a live GPU (a ``torch.device``): the checked target of the same
    architecture, with the shared memory the driver reports where it says otherwise."""
    import torch

    props = torch.cuda.get_device_properties(device)
    if getattr(torch.version, "hip", None):
        key = props.gcnArchName.split(":")[0]
    else:
        key = f"sm_{props.major}{props.minor}"
    reported = getattr(props, "shared_memory_per_block_optin", 0)
    known = TARGETS.get(key)
    if known is not None:
        return known if not reported or reported == known.shared_per_block else GpuLimits(
            **{**known.__dict__, "shared_per_block": reported})
    # A part the facts table does not list: what the driver reports.
    major = props.major
    return GpuLimits(
        key=key, name=props.name, backend="hip" if getattr(torch.version, "hip", None) else "cuda",
        arch=key if key.startswith("gfx") else major * 10 + props.minor,
        warp_size=getattr(props, "warp_size", 32),
        shared_per_block=reported or getattr(props, "shared_memory_per_block", 48 * 1024),
        shared_per_sm=getattr(props, "shared_memory_per_multiprocessor", reported),
        shared_reserved_per_block=0,
        registers_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
        max_registers_per_thread=255,
        max_threads_per_sm=getattr(props, "max_threads_per_multi_processor", 2048),
        max_blocks_per_sm=16,
        bf16=key.startswith("gfx") or major >= 8,
    )


def bf16_capable(device: str, capability: tuple[int, int] | None = None) -> bool:
    """Whether ``device`` computes in bfloat16 natively: NVIDIA from compute capability 8.0
    (``minicb.facts``: sm75_bf16 is "no"); a CPU and AMD's CDNA parts do."""
    import torch

    kind = torch.device(device).type
    if kind != "cuda":
        return True
    if capability is None:
        if getattr(torch.version, "hip", None) or not torch.cuda.is_available():
            return True  # AMD's parts have it; no GPU at all is the loader's error to give
        capability = torch.cuda.get_device_capability(torch.device(device))
    major, minor = capability
    key = f"sm_{major}{minor}"
    if key in TARGETS:
        return TARGETS[key].bf16
    return major >= 8


def resolve_dtype(requested: str, device: str, capability: tuple[int, int] | None = None) -> str:
    """The dtype the engine runs: ``requested``, except bfloat16 on an NVIDIA GPU below compute
    capability 8.0 (a T4), which has no bfloat16 instructions: there it becomes float16, with a
    warning saying so. float16 keeps bfloat16's two bytes per value, so the KV cache holds the
    same number of tokens; its narrower range (largest value 65504) is what changes."""
    if requested != "bfloat16" or bf16_capable(device, capability):
        return requested
    cc = capability or _capability(device)
    warnings.warn(
        f"dtype='bfloat16' asked for on {device} (compute capability {cc[0]}.{cc[1]}), which has "
        "no bfloat16 instructions (they start at 8.0, the A100); running float16 instead. Pass "
        "dtype='float16' to silence this, or dtype='float32' for full precision.",
        UserWarning, stacklevel=2)
    return "float16"


def _capability(device: str) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(torch.device(device))


class DoesNotFit(RuntimeError):
    """A compiled kernel that the device cannot launch."""


def occupancy(limits: GpuLimits, shared: int, registers: int, num_warps: int) -> dict:
    """Blocks (programs) one SM / CU keeps resident, and what bounds them.

    Each resident block needs its shared memory (plus what the system reserves per block), its
    registers (per warp, allocated in units of 256 on NVIDIA, 8 VGPRs per lane on AMD) and its
    threads; the fewest blocks any of them allows is what stays resident."""
    threads = num_warps * limits.warp_size
    bounds = {"threads": limits.max_threads_per_sm // threads,
              "blocks": limits.max_blocks_per_sm}
    per_block = shared + limits.shared_reserved_per_block
    bounds["shared memory"] = (limits.shared_per_sm // per_block if shared
                               else limits.max_blocks_per_sm)
    if registers:
        if limits.backend == "cuda":
            per_warp = -(-registers * limits.warp_size // 256) * 256
            bounds["registers"] = (limits.registers_per_sm // per_warp) // num_warps
        else:  # a workgroup of num_warps waves spreads over the CU's 4 SIMDs
            per_lane = -(-registers // 8) * 8
            waves_per_simd = min(limits.registers_per_sm // (4 * limits.warp_size) // per_lane, 8)
            bounds["registers"] = waves_per_simd * 4 // num_warps
    resident = min(bounds.values())
    limiter = min(bounds, key=bounds.get)
    return {"blocks_per_sm": resident, "limited_by": limiter,
            "occupancy": resident * threads / limits.max_threads_per_sm}


def check_fits(limits: GpuLimits, kernel: str, shared: int, registers: int = 0,
               num_warps: int = 4) -> None:
    """Raise :class:`DoesNotFit` naming the device and the limit a compiled kernel is over."""
    if shared > limits.shared_per_block:
        raise DoesNotFit(
            f"{kernel} needs {shared:,} bytes of shared memory per block; the {limits.label} "
            f"allows {limits.shared_per_block:,} (shared memory per block). Use smaller tiles "
            "(fewer keys per step, fewer pipeline stages) for this device.")
    if registers > limits.max_registers_per_thread:
        raise DoesNotFit(f"{kernel} needs {registers} registers per thread; the {limits.label} "
                         f"allows {limits.max_registers_per_thread}.")
    threads = num_warps * limits.warp_size
    if threads > limits.max_threads_per_sm:
        raise DoesNotFit(f"{kernel} runs {threads} threads per block; the {limits.label} holds "
                         f"{limits.max_threads_per_sm} per SM.")

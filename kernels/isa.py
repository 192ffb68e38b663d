"""Which instruction set the CPU kernels are compiled for, chosen at run time by the CPU's features.

The C kernels are compiled once per instruction set (each build a library of its own in the
kernels cache) and the widest one this CPU runs is loaded:

=============  ===============================================  ===================================
build          what the CPU must list (/proc/cpuinfo flags)      what the kernels gain
=============  ===============================================  ===================================
avx512_bf16    AVX-512 F/BW/CD/DQ/VL and AVX-512 BF16           bfloat16 products by vdpbf16ps
avx512         AVX-512 F/BW/CD/DQ/VL (x86-64-v4)                16-float vectors
avx2           AVX2, FMA, F16C, BMI1/2, MOVBE (x86-64-v3)       8-float vectors with FMA
generic        nothing (x86-64 baseline, or any other CPU)      the compiler's own vectorising
=============  ===============================================  ===================================

VNNI (integer dot products) and AMX are not builds of their own: VNNI multiplies int8 by int8,
so weight-only int8 (float activations) cannot use it, and AMX's tiles pay off for the big
products that torch's oneDNN already runs (prompts), not for a decode's few rows.

``$MINICB_CPU_ISA`` forces one build (tests run each the machine supports); naming one the CPU
lacks is an error, never a crash on an illegal instruction. Away from x86 there is one build,
``native`` (``-march=native`` where the compiler takes it).
"""

from __future__ import annotations

import os
import platform

# widest first: name -> (CPU flags it needs, compiler flags that build it)
X86_BUILDS: dict[str, tuple[tuple[str, ...], list[str]]] = {
    "avx512_bf16": (("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_bf16",
                     "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"),
                    ["-march=x86-64-v4", "-mavx512bf16"]),
    "avx512": (("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma", "f16c",
                "bmi1", "bmi2", "movbe"), ["-march=x86-64-v4"]),
    "avx2": (("avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"), ["-march=x86-64-v3"]),
    "generic": ((), []),
}
ENV = "MINICB_CPU_ISA"


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty where there is no /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def supported() -> list[str]:
    """The builds this CPU runs, widest first."""
    if not is_x86():
        return ["native"]
    flags = cpu_flags()
    return [name for name, (needs, _) in X86_BUILDS.items() if set(needs) <= flags]


def chosen() -> str:
    """The build to load: ``$MINICB_CPU_ISA`` if set (checked), else the widest supported."""
    able = supported()
    asked = os.environ.get(ENV, "").strip()
    if not asked:
        return able[0]
    if asked not in able:
        known = list(X86_BUILDS) if is_x86() else ["native"]
        raise ValueError(f"{ENV}={asked!r}: this CPU runs the builds {able} (of {known}); unset "
                         f"it to take the widest, or name one of those.")
    return asked


def compiler_flags(build: str) -> list[list[str]]:
    """The flag sets to try for a build, in order: with OpenMP, then without (Apple's clang has
    no -fopenmp: the kernels then run on one thread)."""
    if build == "native":
        return [["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"],
                ["-O3", "-march=native"], ["-O3"]]
    isa = X86_BUILDS[build][1]
    return [["-O3", *isa, "-fopenmp"], ["-O3", *isa]]

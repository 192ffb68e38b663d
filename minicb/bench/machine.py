"""Facts about the machine, written next to every measurement: a number means little without them.

    >>> from minicb.viz.benchmarks import describe
    >>> describe(machine_info())
    '2-core Intel(R) Xeon(R) ..., no GPU, torch 2.13.0, transformers 5.23.0'
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

PACKAGES = ("minicb", "torch", "transformers", "triton", "numpy")


def cpu_model() -> str:
    """The CPU's marketing name (Linux: /proc/cpuinfo; elsewhere what `platform` knows)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5).stdout.strip() or platform.machine()
        except OSError:
            pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (a container or taskset can allow fewer than the machine
    has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_line() -> str:
    """The CPU's name and usable cores, one line: absolute times mean nothing without them."""
    return f"{cpu_model()}, {usable_cores()} CPU cores"


def gpus() -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return []
    result = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        result.append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "capability": f"{props.major}.{props.minor}"})
    return result


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_commit() -> str | None:
    """The checkout's commit (with '+dirty' when files differ from it), or None outside a
    checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                                capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return None
    return commit.stdout.strip() + ("+dirty" if dirty else "")


def load_average() -> list[float]:
    """The machine's 1-, 5- and 15-minute load averages, recorded beside every run: a shared
    machine slows every system, which is why systems are compared in one alternated run."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []


def machine_info() -> dict:
    """Everything a reader needs to judge a measurement: when, on what, with which versions.

    The load average is recorded because a shared machine slows every system down, which is
    why results compare systems as ratios measured in one run.
    """
    import torch

    memory = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf")
              else None)
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_cores": usable_cores(),
        "cpu_cores_machine": os.cpu_count(),
        "memory_gib": round(memory / 2**30, 1) if memory else None,
        "load_average": load_average() or None,
        "torch_threads": torch.get_num_threads(),
        "gpus": gpus(),
        "cuda": torch.version.cuda,
        "versions": versions(),
        "git_commit": git_commit(),
    }

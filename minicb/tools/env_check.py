"""python -m minicb env-check: one line per dependency, the device, a real Triton kernel run, the
CPU
attention kernel, and a verdict.

Paste its output into a bug report.

The dependency list is read from minicb's own package metadata (what pyproject.toml declares), so
it cannot fall out of step with the install; a source tree that was never installed falls back to
the list below.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

FALLBACK_REQUIRED = ["torch", "transformers", "safetensors", "tokenizers", "numpy", "matplotlib",
                     "ipywidgets", "tqdm", "fastapi", "uvicorn", "httpx", "psutil"]
FALLBACK_DEV = ["triton", "pytest", "pytest-timeout", "pytest-xdist", "nbval", "jupyterlab",
                "hypothesis", "ruff", "openai", "nbformat", "ipykernel"]
MINIMUM_PYTHON = (3, 10)

# A kernel launch in a fresh interpreter (TRITON_INTERPRET must be set before triton is imported):
# write three tokens' K/V through the KV-write kernel and compare with the plain-torch twin.
_TRITON_SMOKE = """
import torch
from minicb.kernels import write_kv, write_kv_reference
device = "cuda" if torch.cuda.is_available() else "cpu"
k, v = torch.randn(2, 3, 2, 8, device=device).unbind(0)
caches = [torch.zeros(4, 4, 2, 8, device=device) for _ in range(4)]
slots = torch.tensor([5, -1, 9], device=device)
write_kv(k, v, caches[0], caches[1], slots)
write_kv_reference(k, v, caches[2], caches[3], slots)
assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3]), \
    "kernel and reference differ"
print("ok")
"""


def requirements() -> tuple[list[Requirement], list[Requirement]]:
    """(runtime, dev) requirements as declared by the installed package."""
    try:
        declared = [Requirement(line) for line in importlib.metadata.requires("minicb") or []]
    except importlib.metadata.PackageNotFoundError:
        return [Requirement(n) for n in FALLBACK_REQUIRED], [Requirement(n) for n in FALLBACK_DEV]
    runtime = [r for r in declared if r.marker is None]
    dev = [r for r in declared if r.marker is not None
           and any(r.marker.evaluate({"extra": extra}) for extra in ("dev", "book"))]
    return runtime, dev


LOCK = Path(__file__).resolve().parents[2] / "constraints.txt"


def locked_versions(path: Path = LOCK) -> dict[str, str]:
    """Package name -> the exact version the book was recorded with (``constraints.txt`` of a
    source checkout; empty when minicb was installed without it)."""
    if not path.is_file():
        return {}
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            pin = Requirement(line)
            if pin.marker is None or pin.marker.evaluate():
                pins[canonicalize_name(pin.name)] = str(pin.specifier).removeprefix("==")
    return pins


def _lock_note(name: str, version: str | None, pins: dict[str, str]) -> str | None:
    """Why an installed version that differs from the lock matters, or None when it matches."""
    pinned = pins.get(canonicalize_name(name))
    if version is None or pinned is None or version.split("+")[0] == pinned:
        return None
    return (f"{version} installed, the notebooks were recorded with {pinned} (constraints.txt): "
            "their outputs may differ; make setup installs the recorded versions")


def _installed(requirement: Requirement) -> tuple[str | None, bool]:
    """(installed version or None, whether it satisfies the requirement)."""
    try:
        version = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        return None, False
    return version, requirement.specifier.contains(version, prereleases=True)


def triton_smoke(cuda: bool, timeout: float = 120.0) -> tuple[bool, str]:
    """Launch a real kernel: compiled on a GPU, through the interpreter on a CPU."""
    env = dict(os.environ)
    if not cuda:
        env["TRITON_INTERPRET"] = "1"
    try:
        done = subprocess.run([sys.executable, "-c", _TRITON_SMOKE], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"a tiny kernel did not finish in {timeout:.0f} s"
    if done.returncode == 0 and done.stdout.strip().endswith("ok"):
        return (True, "compiled kernels on the GPU" if cuda else "interpreter "
                "(TRITON_INTERPRET=1), slow but exact")
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return False, f"the KV-write kernel failed: {last}"


def cpu_kernel_line() -> str:
    """The CPU attention kernel: built (and how), or why not. Never a FAIL: without it the engine
    runs the torch backend, only slower."""
    try:
        from minicb.kernels.cpu import available

        built, how = available()
    except Exception as error:   # an unexpected failure while building or loading it
        built, how = False, str(error)
    if built:
        return f"OK   cpu attention kernel: compiled ({how}); attention='auto' uses it on the CPU"
    return (f"WARN cpu attention kernel: {how}; the engine uses attention='torch' on the CPU "
            "(slower)")


def check(run_kernel: bool = True) -> tuple[list[str], bool]:
    lines, ok = [], True
    python_ok = sys.version_info[:2] >= MINIMUM_PYTHON
    ok &= python_ok
    lines.append(f"{'OK  ' if python_ok else 'FAIL'} python {platform.python_version()} (need >= "
                 "3.10)")
    runtime, dev = requirements()
    pins = locked_versions()
    for requirement in runtime:
        version, good = _installed(requirement)
        ok &= good
        problem = ("missing" if version is None
                   else f"{version} installed, need {requirement.specifier}")
        note = _lock_note(requirement.name, version, pins) if good else None
        lines.append(f"FAIL {requirement.name}: {problem}; run make setup" if not good else
                     f"WARN {requirement.name}: {note}" if note else
                     f"OK   {requirement.name} {version}")
    for requirement in dev:
        version, good = _installed(requirement)
        problem = ("missing" if version is None
                   else f"{version} installed, want {requirement.specifier}")
        note = _lock_note(requirement.name, version, pins) if good else None
        lines.append(f"WARN {requirement.name}: {problem} (needed for tests and the lab; run make "
                     f"setup)" if not good else
                     f"WARN {requirement.name}: {note}" if note else
                     f"OK   {requirement.name} {version}")
    cuda = False
    try:
        import torch

        cuda = torch.cuda.is_available()
        if cuda:
            lines.append(f"OK   device: CUDA, {torch.cuda.get_device_name(0)} (torch CUDA "
                         f"{torch.version.cuda})")
        else:
            lines.append(f"OK   device: CPU only ({os.cpu_count()} cores); notebooks and tests run "
                         "here")
    except Exception as error:  # torch missing or broken
        ok = False
        lines.append(f"FAIL device: torch unusable ({error})")
    if run_kernel and importlib.util.find_spec("triton") is None:
        lines.append("WARN triton: not installed; the CPU engine runs without it, the Triton "
                     "backend needs it (pip install 'minicb[triton]'; make setup installs it)")
    elif run_kernel:
        kernel_ok, message = triton_smoke(cuda)
        ok &= kernel_ok
        lines.append(f"{'OK  ' if kernel_ok else 'FAIL'} triton: {message}")
        lines.append(cpu_kernel_line())
    try:
        from minicb.model.default import default_model_path

        lines.append(f"OK   default model: {default_model_path()}")
    except Exception as error:
        ok = False
        lines.append(f"FAIL default model: {error}")
    lines.append(f"{'OK  ' if ok else 'FAIL'} verdict: "
                 f"{'ready' if ok else 'fix the FAIL lines above'}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m minicb env-check",
                            description=__doc__.split("\n\n")[0]).parse_args(argv)
    lines, ok = check()
    print("\n".join(lines))
    return 0 if ok else 1

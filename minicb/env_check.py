"""python -m minicb env-check: one line per dependency, the device, and a verdict.

Paste its output into a bug report.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys

REQUIRED = ["torch", "transformers", "safetensors", "tokenizers", "triton", "numpy", "matplotlib",
            "ipywidgets", "tqdm", "fastapi", "uvicorn", "httpx"]
OPTIONAL = ["pytest", "nbval", "jupyterlab", "hypothesis", "openai"]
MINIMUM_PYTHON = (3, 10)


def _version(name: str) -> str | None:
    try:
        module = importlib.import_module(name)
    except Exception:
        return None
    return getattr(module, "__version__", "installed")


def check() -> tuple[list[str], bool]:
    lines, ok = [], True
    python_ok = sys.version_info[:2] >= MINIMUM_PYTHON
    ok &= python_ok
    lines.append(f"{'OK  ' if python_ok else 'FAIL'} python {platform.python_version()} (need >= 3.10)")
    for name in REQUIRED:
        version = _version(name)
        ok &= version is not None
        lines.append(f"{'OK  ' if version else 'FAIL'} {name} {version or 'missing: run make setup'}")
    for name in OPTIONAL:
        version = _version(name)
        lines.append(f"{'OK  ' if version else 'WARN'} {name} {version or 'missing (needed for tests and the lab)'}")
    try:
        import torch

        if torch.cuda.is_available():
            lines.append(f"OK   device: CUDA, {torch.cuda.get_device_name(0)} (torch CUDA {torch.version.cuda})")
            triton_mode = "GPU (compiled kernels)"
        else:
            lines.append(f"OK   device: CPU only ({os.cpu_count()} cores); notebooks and tests run here")
            triton_mode = "interpreter only (TRITON_INTERPRET=1), slow but exact"
        lines.append(f"OK   triton: {triton_mode}")
    except Exception as error:  # torch missing or broken
        ok = False
        lines.append(f"FAIL device: torch unusable ({error})")
    try:
        from minicb.default_model import default_model_path

        lines.append(f"OK   default model: {default_model_path()}")
    except Exception as error:
        ok = False
        lines.append(f"FAIL default model: {error}")
    lines.append(f"{'OK  ' if ok else 'FAIL'} verdict: {'ready' if ok else 'fix the FAIL lines above'}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    lines, ok = check()
    print("\n".join(lines))
    return 0 if ok else 1

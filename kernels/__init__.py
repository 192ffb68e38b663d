"""The kernels for the paged KV cache, installed as ``minicb.kernels``.

Triton kernels (for GPUs; on a CPU only through the interpreter, ``TRITON_INTERPRET=1``):

- :func:`write_kv` scatters this step's K/V into the cache through ``slot_mapping``.
- :func:`paged_attention` attends a packed batch of prefill chunks and decodes over the cache,
  splitting long decodes across programs (:func:`choose_num_splits`) and merging the splits.
  Both also take an FP8 cache (e4m3 rows with a scale each, :mod:`minicb.kernels.fp8`).
- :func:`int8_matmul` multiplies by an int8 weight with one scale per output channel, and
  :func:`int4_matmul` by an int4 one in groups of 32, widening their tiles inside the product
  (weight-only ``quantization="int8"`` and ``"int4"`` on a GPU).

Each has a plain-torch twin (``*_reference``) that the tests hold it to. The CPU kernels, in C,
are in :mod:`minicb.kernels.cpu`.

Triton is an optional dependency (``pip install 'minicb[triton]'``; ``make setup`` installs it):
importing this package, its references or the CPU kernels never imports Triton. The Triton
kernels are imported on first use, and without Triton that use raises an ImportError naming the
extra to install.
"""

from __future__ import annotations

import importlib

from .reference import paged_attention_reference

# the names that live in a module importing Triton, and that module
_TRITON_NAMES = {"choose_num_splits": "split_kv", "int4_matmul": "quant_matmul",
                 "int8_matmul": "quant_matmul", "paged_attention": "paged_attention",
                 "write_kv": "kv_write", "write_kv_reference": "kv_write"}
TRITON_MISSING = ("the Triton backend needs Triton, which is not installed: install minicb's "
                  "triton extra (pip install 'minicb[triton]'; make setup does), or use "
                  "attention='cpu' or 'torch'.")

__all__ = ["choose_num_splits", "int4_matmul", "int8_matmul", "paged_attention",
           "paged_attention_reference", "require_triton", "write_kv", "write_kv_reference"]


def require_triton() -> None:
    """Import Triton (patching its interpreter where needed), or raise an ImportError that names
    the extra to install."""
    try:
        import triton  # noqa: F401
    except ImportError as error:
        raise ImportError(TRITON_MISSING) from error
    from ._compat import patch_interpreter_index

    patch_interpreter_index()  # Triton < 3.8 interpreter with NumPy >= 2.4; a no-op elsewhere


try:   # as soon as the package is imported, so a Triton kernel module imported directly is covered
    from ._compat import patch_interpreter_index

    patch_interpreter_index()  # only when TRITON_INTERPRET is set; a no-op elsewhere
except ImportError:            # no Triton: nothing to patch
    pass


def __getattr__(name: str):
    if name not in _TRITON_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_triton()
    value = getattr(importlib.import_module(f".{_TRITON_NAMES[name]}", __name__), name)
    globals()[name] = value      # later lookups skip this function
    return value

"""A workaround for one known bug in older Triton interpreters; compiled kernels never see it.

The interpreter (``TRITON_INTERPRET=1``) stores every scalar as a one-element 1-d NumPy array,
and Triton 3.2 to 3.6 at least (3.8 is fixed; 3.7 unchecked) turns such a scalar into a Python
int with ``int(array)``. NumPy 2.4 made that a ``TypeError`` (deprecated since 1.25), so a loop
with a run-time bound, such as ``for start in range(lo, hi, BLOCK_N)`` in the attention kernel,
fails in those interpreters with "only 0-dimensional arrays can be converted to Python scalars"
(triton-lang/triton#9171). Triton 3.8 squeezes the array first; this module applies the same
one-line change to Triton < 3.8 when interpreting with NumPy >= 2.4, and does nothing otherwise.
"""

from __future__ import annotations

import os


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def patch_interpreter_index() -> bool:
    """Make the interpreter's scalar-to-int conversion NumPy-2.4-safe; True if it patched."""
    if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes", "y"):
        return False
    import numpy
    import triton

    if _version(numpy.__version__) < (2, 4) or _version(triton.__version__) >= (3, 8):
        return False
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_minicb_index_fix", False):
        return False

    def index(self):
        return int(self.handle.data.squeeze())

    def patch_lang_tensor(tensor, *args, **kwargs):
        original(tensor, *args, **kwargs)
        scope = args[0] if args else kwargs.get("scope")
        if hasattr(scope, "set_attr"):  # newer Triton undoes its patches after each launch
            scope.set_attr(tensor, "__index__", index)
        else:  # older Triton sets the attributes for good
            tensor.__index__ = index

    patch_lang_tensor._minicb_index_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True

"""The experts' part of the fused mixture-of-experts product on the CPU, in C (cpu_moe.c): the
same contract as the torch reference (fused_moe_reference.moe_experts_torch), one call for every
expert the step touched, reading only those experts' weights.

It is the CPU engine's path for small steps (minicb.model.moe.use_cpu_moe); the torch function
stays the reference it is tested against. The products sum in the C kernels' order, so the
outputs agree with torch's to about 1e-6 relative rather than bit for bit; the k outputs of a
token are then summed by the shared ``combine``, in ascending expert id, as on every path.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from minicb.kernels.cpu import _library, _require
from minicb.kernels.fused_moe_reference import Alignment


@functools.cache
def _entry() -> ctypes._CFuncPtr:
    """minicb_moe_experts from the CPU kernels' library (built on first use), its types
    declared."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    function = _library().minicb_moe_experts
    function.restype = ctypes.c_int
    function.argtypes = [p] * 7 + [i64] * 7
    return function


def moe_experts_cpu(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                    weights: torch.Tensor, ids: torch.Tensor, align: Alignment,
                    first_expert: int = 0) -> torch.Tensor:
    """Every touched expert once on its rows, each output scaled by its routing weight:
    [tokens, top_k, hidden], as moe_experts_torch. x [tokens, hidden] and the stacked weights
    (w_gate_up [local, 2 * expert_size, hidden], w_down [local, hidden, expert_size], experts
    first_expert, first_expert + 1, ...) float32 CPU tensors; `align` from align_by_expert with
    block_size 1."""
    fix = "the C experts take float32 CPU tensors; use the torch path (moe_experts_torch)"
    for name, t in (("x", x), ("w_gate_up", w_gate_up), ("w_down", w_down)):
        _require(name, t, torch.float32, fix)
    tokens, top_k = ids.shape
    local, double_size, hidden = w_gate_up.shape
    size = double_size // 2
    if (x.shape != (tokens, hidden) or w_down.shape != (local, hidden, size)
            or double_size % 2):
        raise ValueError(f"x {tuple(x.shape)}, w_gate_up {tuple(w_gate_up.shape)} and w_down "
                         f"{tuple(w_down.shape)} do not fit {tokens} tokens' experts: x is "
                         "[tokens, hidden], w_gate_up [experts, 2 * size, hidden], w_down "
                         "[experts, hidden, size].")
    if align.sorted_pairs.numel() != tokens * top_k:
        raise ValueError("the C experts take an alignment of blocks of one row "
                         "(align_by_expert(ids, num_experts, 1)).")
    weights = weights.float().contiguous()
    pairs, counts = align.sorted_pairs.contiguous(), align.counts.contiguous()
    for name, t in (("sorted_pairs", pairs), ("counts", counts)):
        _require(name, t, torch.int64)
    out = torch.empty(tokens * top_k, hidden, dtype=torch.float32)
    if tokens == 0:
        return out.view(tokens, top_k, hidden)
    status = _entry()(x.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(), weights.data_ptr(),
                      pairs.data_ptr(), counts.data_ptr(), out.data_ptr(), tokens, top_k, hidden,
                      size, counts.numel(), first_expert, local)
    if status == -2:
        raise ValueError("the alignment's counts do not add up to the step's (token, slot) "
                         "pairs, or it names a pair outside them.")
    if status != 0:
        raise MemoryError("the C experts could not allocate their scratch rows")
    return out.view(tokens, top_k, hidden)

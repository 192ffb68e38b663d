"""Attention over the paged KV cache for a packed batch (see docs/ARCHITECTURE.md).

Three backends with one signature: "torch" (the readable reference, gather + SDPA), "triton"
(minicb.kernels, for GPUs) and "cpu" (minicb.kernels.cpu, a C kernel for the decode rows on a
CPU, SDPA for the prompts). All first write this step's K/V into the cache through
`slot_mapping`, then let every query attend to its request's cached keys through the block
table. "auto" (the default) picks "cpu" where that kernel can run, otherwise "torch".
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minicb.config import blocks_for
from minicb.kernels.fp8 import is_fp8, pack_kv_fp8, unpack_kv_fp8


@dataclass
class AttentionMetadata:
    """The tensors of a packed batch that attention needs (all on the model's device)."""

    slot_mapping: torch.Tensor      # int64 [num_tokens], -1 = padding (not written)
    cu_seqlens_q: torch.Tensor      # int32 [num_seqs + 1]
    seq_lens: torch.Tensor          # int32 [num_seqs]
    block_tables: torch.Tensor      # int32 [num_seqs, max_blocks]
    max_seqlen_q: int
    max_seqlen_k: int
    q_lens_host: list[int] | None = None    # the same lengths as Python ints (shapes are decided on
    seq_lens_host: list[int] | None = None  # the host); derived from the tensors when not given
    # which rows are decodes (one query attending to all its request's keys), as the scheduler's
    # plan marked them (ScheduledSeq.is_decode); nothing downstream decides it again. A metadata
    # built by hand, without a plan, marks the rows of one query, the plan's own definition.
    decode_rows: list[bool] | None = None
    num_decode_rows: int | None = None      # sum(decode_rows)
    # the Triton kernel's key splits per decode, fixed by a captured CUDA graph (its launch grid
    # cannot change between replays); None: the kernel chooses from max_seqlen_k each step
    num_splits: int | None = None
    _torch_plans: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _writes: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.q_lens_host is None:
            self.q_lens_host = (self.cu_seqlens_q[1:] - self.cu_seqlens_q[:-1]).tolist()
        if self.seq_lens_host is None:
            self.seq_lens_host = self.seq_lens.tolist()
        if self.decode_rows is None:
            self.decode_rows = [q_len == 1 for q_len in self.q_lens_host]
        if self.num_decode_rows is None:
            self.num_decode_rows = sum(self.decode_rows)

    @property
    def num_rows(self) -> int:
        return len(self.q_lens_host)

    @property
    def decodes_only(self) -> bool:
        """Every row of the step is a decode."""
        return self.num_decode_rows == self.num_rows

    def writes(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(rows to write or None for all of them, their slots): the padding rows (slot -1) left
        out, worked out once per step for every layer."""
        if self._writes is None:
            real = self.slot_mapping >= 0
            self._writes = (None, self.slot_mapping) if bool(real.all()) else \
                (real.nonzero().squeeze(1), self.slot_mapping[real])
        return self._writes

    def torch_plan(self, block_size: int, decodes: bool = True) -> TorchPlan:
        """The torch backend's index tensors for this step. Every layer needs the same ones, so
        the first layer builds them and the others reuse them (one plan per `decodes`).
        decodes=False leaves the decode rows out (the cpu backend attends them in its kernel)."""
        plan = self._torch_plans.get(decodes)
        if plan is None:
            plan = self._torch_plans[decodes] = TorchPlan.build(self, block_size, decodes)
        return plan


@dataclass
class DecodeBatch:
    """The rows that decode one token each: they attend as one padded batch."""

    tokens: torch.Tensor    # int64 [rows]: where each row's query sits in the packed batch
    blocks: torch.Tensor    # int64 [rows, n]: the blocks that hold the longest row's keys
    num_keys: int           # the longest row's keys; the others are padded up to it
    visible: torch.Tensor   # bool [rows, 1, 1, num_keys]: False on each row's padding


@dataclass
class PrefillChunk:
    """One request's chunk of several queries: it attends on its own."""

    start: int              # its first query in the packed batch
    q_len: int
    seq_len: int            # its keys, this chunk's own included
    blocks: torch.Tensor    # int64 [1, n]
    visible: torch.Tensor | None   # bool [q_len, seq_len]; None when it is plainly causal


@dataclass
class TorchPlan:
    """How the torch backend splits a step: one padded batch of decodes, then each prefill chunk."""

    decode: DecodeBatch | None
    prefills: list[PrefillChunk]

    @staticmethod
    def build(meta: AttentionMetadata, block_size: int, decodes: bool = True) -> TorchPlan:
        device = meta.block_tables.device
        q_lens, seq_lens = meta.q_lens_host, meta.seq_lens_host

        def blocks_of(table: torch.Tensor, num_keys: int) -> torch.Tensor:
            # only the blocks that hold keys (a contiguous reservation's table is longer)
            return table[:, :blocks_for(num_keys, block_size)].long().contiguous()

        decode = None
        rows = [i for i, decode in enumerate(meta.decode_rows) if decode]
        if rows and decodes:
            index = torch.tensor(rows, device=device)
            num_keys = max(seq_lens[i] for i in rows)
            visible = torch.arange(num_keys, device=device)[None, :] < meta.seq_lens[index].long()[
                :, None]
            decode = DecodeBatch(tokens=meta.cu_seqlens_q[index].long(),
                                 blocks=blocks_of(meta.block_tables[index], num_keys),
                                 num_keys=num_keys, visible=visible[:, None, None, :])
        prefills, start = [], 0
        for row, (q_len, seq_len, one_query) in enumerate(zip(q_lens, seq_lens,
                                                              meta.decode_rows)):
            if not one_query:
                # a whole prompt (q_len == seq_len): query i sees keys 0..i, plain causal
                visible = None
                if q_len != seq_len:
                    # query i sits at max(seq_len - q_len + i, 0) and sees keys up to there (0 for
                    # left padding)
                    positions = (torch.arange(q_len, device=device) + seq_len - q_len).clamp(min=0)
                    visible = torch.arange(seq_len, device=device)[None, :] <= positions[:, None]
                prefills.append(PrefillChunk(start, q_len, seq_len,
                                             blocks_of(meta.block_tables[row:row + 1], seq_len),
                                             visible))
            start += q_len
        return TorchPlan(decode, prefills)


def write_kv_torch(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: AttentionMetadata) -> None:
    """Scatter K/V [num_tokens, kv_heads, head_dim] into the cache through meta.slot_mapping;
    slot -1 (padding) is skipped. An int8 or FP8 cache gets each row quantized with its scale."""
    if k_cache.dtype == torch.int8:
        from minicb.model.quant import pack_kv_int8

        k, v = pack_kv_int8(k), pack_kv_int8(v)
    elif is_fp8(k_cache):   # e4m3 bytes and the scale's four, written through byte views
        k, v = pack_kv_fp8(k), pack_kv_fp8(v)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    rows, slots = meta.writes()
    if rows is not None:
        k, v = k.index_select(0, rows), v.index_select(0, rows)
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v)


def gather_keys(cache: torch.Tensor, blocks: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[num_blocks, block_size, H, D] cache → [rows, num_keys, H, D] keys in logical order.

    `blocks` [rows, n]: each row's block ids in order (n blocks hold at least num_keys keys).
    Logical position j of a row lives at blocks[row, j // block_size], offset j % block_size, so
    copying whole blocks side by side puts every key in place: one index_select of rows × n
    blocks, several times faster than indexing each position.
    """
    rows, n = blocks.shape
    source = cache.view(torch.uint8) if is_fp8(cache) else cache   # FP8 rows gathered as bytes
    whole = source.index_select(0, blocks.flatten()).view(rows, n * cache.shape[1],
                                                          *cache.shape[2:])
    if cache.dtype == torch.int8:   # int8 rows with their scales: dequantized to float32
        from minicb.model.quant import unpack_kv_int8

        return unpack_kv_int8(whole[:, :num_keys])
    if is_fp8(cache):               # FP8 rows with their scales: dequantized to float32
        return unpack_kv_fp8(whole[:, :num_keys])
    return whole[:, :num_keys]


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """The reference: gather keys through the block tables, then scaled_dot_product_attention.

    Decodes (one query each) run as one padded batch; each prefill chunk runs on its own, so a
    long chunk never pads every decode row to its length. q: [num_tokens, q_heads, head_dim].
    On a CPU the decode batch is bound by moving K/V: the gather copies whole blocks, and SDPA
    reads the gathered keys through a transposed view and shares each KV head among its query
    heads (enable_gqa) instead of copying it per head. (A hand-written grouped matmul was no
    faster: it needs the keys contiguous, one more copy.) A whole prompt uses is_causal instead
    of a mask, which lets SDPA skip the key blocks above the diagonal.
    """
    out = torch.empty_like(q)
    plan = meta.torch_plan(k_cache.shape[1])
    with _sdpa_without_cudnn(q):
        if plan.decode is not None:
            d = plan.decode
            keys = gather_keys(k_cache, d.blocks, d.num_keys).to(q.dtype).transpose(1, 2)
            values = gather_keys(v_cache, d.blocks, d.num_keys).to(q.dtype).transpose(1, 2)
            out[d.tokens] = F.scaled_dot_product_attention(
                q[d.tokens][:, :, None, :], keys, values, attn_mask=d.visible, scale=scale,
                enable_gqa=q.shape[1] != k_cache.shape[2])[:, :, 0, :]
        attend_prefills_torch(q, k_cache, v_cache, plan, scale, out)
    return out


def _sdpa_without_cudnn(q: torch.Tensor):
    """On a GPU, SDPA may pick cuDNN for half precision, which builds an execution plan for every
    new shape: about a millisecond of CPU per call, measured on an H200 in bfloat16. A serving
    step's shapes change every step, so the torch backend leaves cuDNN out there."""
    if not q.is_cuda:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def attend_prefills_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          plan: TorchPlan, scale: float, out: torch.Tensor) -> None:
    """Each prefill chunk on its own: gather its keys, SDPA, write its rows of `out`."""
    gqa = q.shape[1] != k_cache.shape[2]   # SDPA lets each group of query heads share a KV head
    for c in plan.prefills:
        keys = gather_keys(k_cache, c.blocks, c.seq_len).to(q.dtype).transpose(1, 2)
        values = gather_keys(v_cache, c.blocks, c.seq_len).to(q.dtype).transpose(1, 2)
        chunk = q[c.start:c.start + c.q_len].transpose(0, 1)[None]
        out[c.start:c.start + c.q_len] = F.scaled_dot_product_attention(
            chunk, keys, values, attn_mask=c.visible, is_causal=c.visible is None, scale=scale,
            enable_gqa=gqa)[0].transpose(0, 1)


def paged_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """The CPU backend: decode rows in the C kernel, prefill chunks through SDPA.

    A decode reads a row's keys once, straight from its blocks (kernels/cpu_attention.c),
    instead of gathering them padded and reading them again. A prompt is compute-bound, where
    SDPA's blocked matrix products beat a per-query loop, so prompts keep the torch path.
    """
    from minicb.kernels.cpu import paged_attention_cpu as kernel

    q = q.contiguous()   # the kernel indexes q and out as packed rows
    out = torch.empty_like(q)
    plan = meta.torch_plan(k_cache.shape[1], decodes=False)
    if meta.num_decode_rows:
        # the kernel's queries are float32 (a bfloat16 cache is widened as it is read); its
        # prefill rows are left as they were, and written just below
        wide = q.dtype == torch.float32
        decoded = kernel(q if wide else q.float(), k_cache, v_cache, meta.cu_seqlens_q,
                         meta.seq_lens, meta.block_tables, scale, decodes_only=True,
                         out=out if wide else None)
        if not wide:
            out.copy_(decoded)
    attend_prefills_torch(q, k_cache, v_cache, plan, scale, out)
    return out


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _triton_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def resolve_backend(attention: str, device: str, dtype: str,
                    kv_cache_dtype: str = "auto") -> str:
    """"auto" → "triton" on a GPU where Triton is installed (faster than the torch backend there:
    benchmarks/gpu.md), "cpu" where the C kernel serves (float32 or bfloat16 on a CPU, and it
    compiles), else "torch". "triton" on a CPU runs only under Triton's interpreter. An FP8 cache
    on a CPU gets "torch" (the C kernel reads float and int8 caches).

    An explicit "cpu" that cannot run raises, naming why and the alternative.
    """
    if attention == "triton" and torch.device(device).type == "cpu" and not _interpreting():
        # compiled Triton kernels read GPU memory: handed CPU tensors they fail at launch
        raise ValueError("attention='triton' compiles its kernels for a GPU and cannot read "
                         "tensors on device='cpu'. Use device='cuda', or on a CPU "
                         "attention='cpu' or 'torch' (Triton's interpreter runs the kernels on "
                         "a CPU only with TRITON_INTERPRET=1 set before Python starts: slow, "
                         "for tests).")
    if attention not in ("auto", "cpu"):
        return attention
    if attention == "auto" and torch.device(device).type == "cuda":
        return "triton" if _triton_installed() else "torch"
    fits = (torch.device(device).type == "cpu" and dtype in ("float32", "bfloat16")
            and not kv_cache_dtype.startswith("fp8"))
    if attention == "auto" and not fits:
        return "torch"
    if not fits:
        raise ValueError(f"attention='cpu' runs float32 or bfloat16 on a CPU (got dtype="
                         f"{dtype!r} on "
                         f"device={device!r}); use attention='torch' (or 'triton' on a GPU).")
    from minicb.kernels.cpu import available

    ok, why = available()
    if ok:
        return "cpu"
    if attention == "auto":
        return "torch"
    raise ValueError(f"attention='cpu' is unavailable here: {why}. Use attention='torch'.")


def torch_backend():
    """(write K/V, attend) of the readable reference."""
    return write_kv_torch, paged_attention_torch


def cpu_backend():
    """(write K/V, attend) with the decode rows in the C kernel."""
    return write_kv_torch, paged_attention_cpu


def triton_backend():
    """(write K/V, attend) through the Triton kernels (imported here: only they need Triton)."""
    from minicb import kernels

    kernels.require_triton()    # without it: an ImportError naming the extra
    def write(k, v, k_cache, v_cache, meta):
        kernels.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)

    def attend(q, k_cache, v_cache, meta, scale):
        return kernels.paged_attention(q, k_cache, v_cache, meta.cu_seqlens_q, meta.seq_lens,
                                       meta.block_tables, scale, meta.max_seqlen_q,
                                       meta.max_seqlen_k, num_splits=meta.num_splits)

    return write, attend


class Attention:
    """Picks the backend once (from minicb.registry.ATTENTION_BACKENDS); called by every layer
    with its own cache tensors."""

    def __init__(self, backend: str):
        from minicb.registry import ATTENTION_BACKENDS

        self._write, self._attend = ATTENTION_BACKENDS.get_part(backend)()
        self.backend = backend

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        self._write(k, v, k_cache, v_cache, meta)
        return self._attend(q, k_cache, v_cache, meta, scale)

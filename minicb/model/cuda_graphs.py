"""CUDA graphs for decode-only steps (see docs/ARCHITECTURE.md, "CUDA graphs").

A decode step of a small model is a few hundred small kernels, each launched from Python: on a
GPU the launches, not the arithmetic, bound small and medium batches. A CUDA graph records one
step's launches once, at start-up, and replays them with one call. A replay runs the same kernels
on the same addresses with the same launch arguments, so everything that varies between steps
must live in tensors the graph reads (its *static buffers*), and every shape must be fixed:

- one graph per size of a **ladder** of batch sizes (`capture_sizes`); a step of n rows runs the
  smallest captured size >= n, its extra rows padded;
- **padding rows write nowhere**: slot -1 (the KV write kernels skip it), sequence length 1 over
  block 0 (a read of one key that is never used), position 0, the pad token;
- the **attention kernel's launch is frozen** per size: max_seqlen_k is taken as max_model_len
  and the split count (`choose_num_splits`, which reads max_seqlen_k) fixed at capture, so the
  grid never changes; the kernel bounds each split by the row's real sequence length at run time.

On a device without CUDA graphs (a CPU) the same code runs "replayed without capture": the static
buffers are filled exactly as for a replay and the eager step runs on views of them. The
ladder, the padding and the buffers are tested on every machine that way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minicb.config import ResolvedConfig
from minicb.model.attention import AttentionMetadata
from minicb.model.llama import ModelArgs
from minicb.model.loader import DTYPES

# SMs assumed when the split count is frozen on a machine without a GPU (replay without capture
# under Triton's interpreter): an H100's 132, so the CPU tests run the split path a GPU takes.
NOMINAL_SMS = 132
# per captured graph, beyond the activations in the shared pool: the graph's own bookkeeping on
# the device (kernel parameters, nodes); an allowance, checked by the GPU test of the estimate
GRAPH_OVERHEAD_BYTES = 2 * 2**20

EagerForward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor],
                        torch.Tensor]


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The ladder: 1, 2, 4, 8, then every 8 up to 64, then every 16, ending at max_num_seqs.

    Small steps get tight sizes (padding 7 rows to 8 is a small share); above 64 a row more or
    less barely changes a step's cost, so coarser rungs keep the graphs (and start-up) few."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1 (got {max_num_seqs}).")
    ladder = [1, 2, 4] + list(range(8, 65, 8)) + list(range(80, max_num_seqs + 1, 16))
    sizes = [s for s in ladder if s < max_num_seqs]
    return sizes + [max_num_seqs]


def padded_size(sizes: list[int], num_rows: int) -> int | None:
    """The smallest captured size that holds `num_rows` rows; None when none does (run eagerly)."""
    return next((s for s in sizes if s >= num_rows), None)


def uses_cuda_graphs(config: ResolvedConfig) -> bool:
    """Graphs are captured for the Triton backend on CUDA unless enforce_eager. The other
    backends synchronise with the host inside a step (the torch backend asks which rows are
    padding), which a graph cannot record."""
    return (not config.enforce_eager and torch.device(config.device).type == "cuda"
            and config.attention == "triton")


def frozen_num_splits(args: ModelArgs, config: ResolvedConfig, size: int) -> int | None:
    """The split count a captured size runs with on the Triton backend: the kernel's own choice
    for the longest sequence a request may reach, so no row is ever split less than it would be
    eagerly. None for the other backends, which do not split."""
    if config.attention != "triton":
        return None
    from minicb.kernels import choose_num_splits

    device = torch.device(config.device)
    on_gpu = device.type == "cuda" and torch.cuda.is_available()
    sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else NOMINAL_SMS
    return choose_num_splits(size, args.num_kv_heads, config.max_model_len, sms)


def graph_memory_bytes(args: ModelArgs, config: ResolvedConfig) -> int:
    """What the graphs hold on the device, estimated before the KV pool is sized.

    Every graph allocates from one shared pool and they are captured largest first, so the pool
    is about one step of the largest size: per row, the layer's activations alive at once (the
    residual, the normed input, q/k/v, the attention output and its split partials in float32,
    gate/up and the SwiGLU product), the logits (in the model's dtype and again in float32),
    doubled for the allocator's rounding and the temporaries a layer frees late. Plus the static
    buffers and an allowance per graph. An estimate, not a measurement: the GPU test
    (tests/model/test_cuda_graphs.py) checks a capture stays within it."""
    if not uses_cuda_graphs(config):
        return 0
    sizes = capture_sizes(config.max_num_seqs)
    largest = sizes[-1]
    item = DTYPES[config.dtype].itemsize
    q_dim, kv_dim = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    splits = frozen_num_splits(args, config, largest) or 1
    per_row = (item * (3 * args.hidden_size + 2 * (q_dim + 2 * kv_dim) + 3 * args.intermediate_size
                       + args.vocab_size)
               + 4 * (splits * args.num_heads * (args.head_dim + 1) + args.vocab_size))
    static = largest * (8 * 4 + 4 * config.blocks_per_seq())
    return 2 * largest * per_row + static + GRAPH_OVERHEAD_BYTES * len(sizes)


class DecodeGraphs:
    """Decode steps through captured graphs (capture=True, CUDA) or replayed without capture.

    Static buffers, sized for the largest captured size (rows) and max_model_len (block table
    width); a captured size reads their first `size` rows:
    input_ids, positions, slot_mapping, seq_lens, block_tables [rows, blocks per request],
    cu_seqlens_q (0, 1, …, one query per row) and logits_indices (every row).
    `input_ids` may be written on the device by whoever produced the tokens (overlapped
    scheduling writes the previous step's sampled tokens there) before `run`.
    """

    def __init__(self, args: ModelArgs, forward: EagerForward, config: ResolvedConfig,
                 capture: bool, pad_token_id: int = 0):
        """`forward(input_ids, positions, meta, logits_indices)`: the runner's eager step (the
        model over the KV cache), which a graph records and a replay without capture runs."""
        self.forward, self.config = forward, config
        self.sizes = capture_sizes(config.max_num_seqs)
        self.capture, self.pad_token_id = capture, pad_token_id
        self.device = torch.device(config.device)
        rows, width = self.sizes[-1], config.blocks_per_seq()

        def buffer(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=self.device)

        self.input_ids = buffer(rows, dtype=torch.long)
        self.positions = buffer(rows, dtype=torch.long)
        self.slot_mapping = buffer(rows, dtype=torch.long)
        self.seq_lens = buffer(rows)
        self.block_tables = buffer(rows, width)
        self.cu_seqlens_q = torch.arange(rows + 1, dtype=torch.int32, device=self.device)
        self.logits_indices = torch.arange(rows, dtype=torch.long, device=self.device)
        self.num_splits = {s: frozen_num_splits(args, config, s) for s in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.replays = 0        # steps served by this runner (tests count them)
        if capture:
            self._capture_all()

    def can_run(self, meta: AttentionMetadata, num_logits: int) -> bool:
        """A decode-only step whose every row needs its logits, that fits a captured size."""
        rows = meta.num_rows
        return (meta.decodes_only and num_logits == rows == meta.slot_mapping.shape[0]
                and rows <= self.sizes[-1]
                and meta.block_tables.shape[1] <= self.block_tables.shape[1])

    def metadata(self, size: int, seq_lens_host: list[int] | None = None) -> AttentionMetadata:
        """The attention metadata over the first `size` rows of the static buffers. Captured,
        its host-side values are frozen (max_seqlen_k = max_model_len); replayed without capture,
        `seq_lens_host` gives the step's own lengths, which the torch backend sizes its gather
        by."""
        lens = seq_lens_host or [self.config.max_model_len] * size
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], cu_seqlens_q=self.cu_seqlens_q[:size + 1],
            seq_lens=self.seq_lens[:size], block_tables=self.block_tables[:size],
            max_seqlen_q=1, max_seqlen_k=max(lens), q_lens_host=[1] * size,
            seq_lens_host=lens, decode_rows=[True] * size, num_decode_rows=size,
            num_splits=self.num_splits[size])

    def fill(self, input_ids: torch.Tensor, positions: torch.Tensor,
             meta: AttentionMetadata) -> int:
        """Copy one step's inputs into the static buffers, pad the rest of its size; return the
        size. Real rows first; padding rows get slot -1, sequence length 1 and block 0."""
        rows = meta.num_rows
        size = padded_size(self.sizes, rows)
        width = meta.block_tables.shape[1]
        if input_ids.data_ptr() != self.input_ids.data_ptr():   # not already written in place
            self.input_ids[:rows].copy_(input_ids, non_blocking=True)
        self.positions[:rows].copy_(positions, non_blocking=True)
        self.slot_mapping[:rows].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:rows].copy_(meta.seq_lens, non_blocking=True)
        # columns past the step's width are never read: a row reads only its seq_len's blocks
        self.block_tables[:rows, :width].copy_(meta.block_tables, non_blocking=True)
        if size > rows:
            self.input_ids[rows:size] = self.pad_token_id
            self.positions[rows:size] = 0
            self.slot_mapping[rows:size] = -1
            self.seq_lens[rows:size] = 1
            self.block_tables[rows:size, 0] = 0
        return size

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """The step's logits [rows, vocab] (float32), through the graph of its padded size."""
        rows = meta.num_rows
        size = self.fill(input_ids, positions, meta)
        self.replays += 1
        if self.capture:
            self.graphs[size].replay()
            return self.outputs[size][:rows]
        lens = list(meta.seq_lens_host) + [1] * (size - rows)
        return self._forward(size, self.metadata(size, lens))[:rows]

    def _forward(self, size: int, meta: AttentionMetadata) -> torch.Tensor:
        return self.forward(self.input_ids[:size], self.positions[:size], meta,
                            self.logits_indices[:size])

    def _capture_all(self) -> None:
        """Capture every size, largest first, into one memory pool: a smaller graph reuses the
        larger one's activations' memory (graphs replay one at a time). Capture runs over an
        all-padding batch, which writes nowhere, so it leaves the KV cache untouched. Each
        graph's metadata is built here, once: what a replay runs is frozen with it."""
        self.slot_mapping.fill_(-1)
        self.seq_lens.fill_(1)
        for size in reversed(self.sizes):
            self.graphs[size], self.outputs[size] = self._capture(size, self.metadata(size))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            # give the warm-ups' memory (outside the pool) back; the graphs hold the pool
            torch.cuda.empty_cache()

    def _capture(self, size: int, meta: AttentionMetadata
                 ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """One size's graph and the output tensor its replays write. The size runs once eagerly
        first, on a side stream, so Triton compiles its kernels outside the capture."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._forward(size, meta)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            output = self._forward(size, meta)
        return graph, output

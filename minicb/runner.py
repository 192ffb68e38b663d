"""The model runner: turn a SchedulerOutput into packed tensors, run the model, sample.

The per-step work is tensor operations over the packed batch; Python touches each request
once per step (the tokens it computes this step and its block table), never each cached token.
"""

from __future__ import annotations

import torch

from minicb.config import EngineConfig
from minicb.model.attention import AttentionMetadata
from minicb.model.llama import LlamaForCausalLM
from minicb.model.loader import DTYPES
from minicb.sampling import Sampler, SamplerOutput
from minicb.scheduler.base import SchedulerOutput


def free_memory(device: torch.device) -> int:
    """Bytes the KV cache could still take: free device memory on a GPU, available RAM on a CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def check_kv_fits(config: EngineConfig, args) -> None:
    """Refuse, before anything is allocated, a KV pool the machine cannot hold, naming the knobs
    behind it."""
    device = torch.device(config.device)
    per_token = (2 * args.num_layers * args.num_kv_heads * args.head_dim
                 * DTYPES[config.dtype].itemsize)
    kv_bytes = per_token * config.num_kv_blocks * config.block_size
    available = free_memory(device)
    if kv_bytes <= 0.9 * available:
        return
    sized_by = f"num_kv_blocks={config.num_kv_blocks}" if config.num_kv_blocks_given else \
        (f"num_kv_blocks defaulting to max_num_seqs={config.max_num_seqs} x max_model_len="
         f"{config.max_model_len} tokens")
    raise ValueError(f"the KV cache would need {kv_bytes / 2**30:.1f} GiB ({sized_by}, "
                     f"block_size={config.block_size}) but {available / 2**30:.1f} GiB of "
                     f"{device.type} memory is free; lower num_kv_blocks, max_num_seqs, "
                     "max_model_len or block_size.")


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, kv_manager,
                 pad_token_id: int = 0):
        self.model = model
        self.config = config
        self.kv = kv_manager
        self.device = torch.device(config.device)
        self.pad_token_id = pad_token_id
        self.sampler = Sampler()
        args = model.args
        shape = (config.num_kv_blocks, config.block_size, args.num_kv_heads, args.head_dim)
        dtype = DTYPES[config.dtype]
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=self.device),
                           torch.zeros(shape, dtype=dtype, device=self.device))
                          for _ in range(args.num_layers)]

    def kv_cache_bytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.kv_caches)

    def prepare(self, output: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor,
                                                        AttentionMetadata, torch.Tensor]:
        """Pack the step: per row, [pad…, the request's next tokens]; everything else by tensor
        ops."""
        block_size = self.config.block_size
        input_ids: list[int] = []
        q_lens, starts, pads, seq_lens, tables, real_rows = [], [], [], [], [], []
        for seq in output.seqs:
            request = seq.request
            start = request.num_computed_tokens
            # recompute the last token without writing it (static batches' idle rows)
            if seq.ghost:
                tokens, seq_len = request.token_ids(request.num_tokens - 1,
                                                    request.num_tokens), start
            else:
                tokens, seq_len = request.token_ids(start,
                                                    start + seq.num_tokens), start + seq.num_tokens
            input_ids.extend([self.pad_token_id] * seq.num_pad)
            input_ids.extend(tokens)
            q_lens.append(seq.num_pad + len(tokens))
            starts.append(start)
            pads.append(seq.num_pad)
            seq_lens.append(seq_len)
            tables.append(self.kv.block_table(request))
            real_rows.append(not seq.ghost)

        q_lens_t = torch.tensor(q_lens)
        cu_seqlens_q = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
        cu_seqlens_q[1:] = q_lens_t.cumsum(0)
        row_of_token = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens_t)
        offset_in_row = torch.arange(len(input_ids)) - cu_seqlens_q[:-1].long()[row_of_token]
        pads_t = torch.tensor(pads)[row_of_token]
        positions = (torch.tensor(starts)[row_of_token] + offset_in_row - pads_t).clamp(min=0)
        max_blocks = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in tables],
                                    dtype=torch.int32)
        # token at position p of row r → block_tables[r, p // block_size] * block_size + p %
        # block_size
        slots = block_tables[row_of_token,
                             (positions // block_size).clamp(max=max_blocks - 1)].long() \
            * block_size + positions % block_size
        writes = (offset_in_row >= pads_t) & torch.tensor(real_rows)[row_of_token]
        slot_mapping = torch.where(writes, slots, torch.full_like(slots, -1))
        logits_indices = (cu_seqlens_q[1:].long() - 1)[[s.needs_logits for s in output.seqs]]

        device = self.device
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(device, non_blocking=True),
            cu_seqlens_q=cu_seqlens_q.to(device, non_blocking=True),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device, non_blocking=True),
            block_tables=block_tables.to(device, non_blocking=True),
            max_seqlen_q=max(q_lens), max_seqlen_k=max(max(seq_lens), 1), q_lens_host=q_lens,
            seq_lens_host=seq_lens)
        return (torch.tensor(input_ids).to(device, non_blocking=True),
                positions.to(device, non_blocking=True), meta,
                logits_indices.to(device, non_blocking=True))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: give each destination block the KV of its source, in every layer.

        In order, one pair at a time: a block copied earlier in the list may be a later source.
        """
        for source, destination in pairs:
            for k_cache, v_cache in self.kv_caches:
                k_cache[destination] = k_cache[source]
                v_cache[destination] = v_cache[source]

    def execute(self, output: SchedulerOutput) -> SamplerOutput:
        self.copy_blocks(output.block_copies)      # before the forward writes into the copies
        input_ids, positions, meta, logits_indices = self.prepare(output)
        rows = [s.request for s in output.seqs if s.needs_logits]
        if not rows:  # only intermediate prefill chunks this step: nothing to sample
            self.model(input_ids, positions, self.kv_caches, meta, logits_indices)
            return SamplerOutput([], [])
        logits = self.model(input_ids, positions, self.kv_caches, meta, logits_indices)
        params, generators = [r.params for r in rows], [r.generator for r in rows]
        try:
            return self.sampler(logits, params, generators)
        except Exception:
            return self._sample_rows_apart(logits, params, generators)

    def _sample_rows_apart(self, logits, params, generators) -> SamplerOutput:
        """One request's settings broke the batch's sampling: sample each row alone, so only a
        row that fails by itself goes without a token (the engine ends that request, with the
        error, and every other request carries on)."""
        tokens, logprobs, errors = [], [], []
        for row in range(logits.shape[0]):
            try:
                one = self.sampler(logits[row:row + 1], params[row:row + 1],
                                   generators[row:row + 1])
                tokens.append(one.token_ids[0])
                logprobs.append(one.logprobs[0])
                errors.append(None)
            except Exception as error:
                tokens.append(None)
                logprobs.append(None)
                errors.append(f"sampling failed: {type(error).__name__}: {error}")
        return SamplerOutput(tokens, logprobs, errors)

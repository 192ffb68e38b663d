"""The model runner: turn a SchedulerOutput into packed tensors, run the model, sample.

It reads only the plan: each row carries the tokens it computes, where they start, its block
table, whether it is a decode and its sampling settings (minicb.scheduler.base.ScheduledSeq). It
holds no KV manager and never looks at a Request, so the plan alone says what a step computes.

The per-step work is tensor operations over the packed batch; Python touches each row once per
step, never each cached token. A step of decodes only (the common case) takes a shorter path:
one position and one slot per row, worked out in plain Python, then one tensor each.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minicb.config import ResolvedConfig
from minicb.model.attention import AttentionMetadata
from minicb.model.cuda_graphs import DecodeGraphs, graph_memory_bytes
from minicb.model.fused_cpu import FusedCpuDecoder
from minicb.model.llama import LlamaForCausalLM
from minicb.model.loader import DTYPES
from minicb.plan import Logprob, ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from minicb.runner.input_batch import DecodeInputs, InputBatch
from minicb.runner.sampler import Sampler
from minicb.spec.rejection import accept


class PackedStep(NamedTuple):
    """A step as the forward and the sampler take it. It carries all the step reads of the
    runner's state between steps (`decode`), so a step prepared while the last one runs
    (overlapped scheduling) never shares that state with it."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    decode: DecodeInputs | None     # a step of decodes only: what it read of the batch


def _row_logits(seq: ScheduledSeq, end: int) -> list[torch.Tensor]:
    """The packed positions whose logits a row needs, in order: its prompt positions (for prompt
    logprobs), then those it samples from (the last, or a verification row's 1 + k)."""
    parts = []
    if seq.prompt_targets:
        first = end - seq.num_tokens
        parts.append(torch.arange(first, first + len(seq.prompt_targets)))
    if seq.needs_logits:
        parts.append(torch.arange(end - seq.num_logits, end))
    return parts


def free_memory(device: torch.device) -> int:
    """Bytes the KV cache could still take: free device memory on a GPU, available RAM on a CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def check_kv_fits(config: ResolvedConfig, *models_args) -> None:
    """Refuse, before anything is allocated, a KV pool the machine cannot hold, naming the knobs
    behind it. Each block holds every model's KV (the target's, and a draft model's); the target's
    CUDA graphs, captured after the pool, need their memory too (graph_memory_bytes)."""
    device = torch.device(config.device)
    per_token = sum(2 * args.num_layers * args.num_kv_heads * args.head_dim
                    * DTYPES[config.dtype].itemsize for args in models_args)
    kv_bytes = per_token * config.num_kv_blocks * config.block_size
    graph_bytes = graph_memory_bytes(models_args[0], config)
    available = free_memory(device) - graph_bytes
    if kv_bytes <= 0.9 * available:
        return
    if graph_bytes:
        sized_by = f"after {graph_bytes / 2**30:.2f} GiB for CUDA graphs (enforce_eager=True " \
            "frees it); "
    else:
        sized_by = ""
    sized_by += f"num_kv_blocks={config.num_kv_blocks}" if config.given("num_kv_blocks") else \
        (f"num_kv_blocks defaulting to max_num_seqs={config.max_num_seqs} x max_model_len="
         f"{config.max_model_len} tokens")
    raise ValueError(f"the KV cache would need {kv_bytes / 2**30:.1f} GiB ({sized_by}, "
                     f"block_size={config.block_size}) but {available / 2**30:.1f} GiB of "
                     f"{device.type} memory is free; lower num_kv_blocks, max_num_seqs, "
                     "max_model_len or block_size.")


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, config: ResolvedConfig, pad_token_id: int = 0,
                 proposer=None):
        """`proposer`: a draft model's (minicb.spec.draft_model.DraftModelProposer), which drafts
        the verification rows' tokens before each forward; None for no draft model."""
        self.model = model
        self.proposer = proposer
        self.config = config
        self.device = torch.device(config.device)
        self.pad_token_id = pad_token_id
        self.sampler = Sampler()
        # the last step's sampled tokens, one per plain row that sampled, on the logits' device:
        # written and read only by the step being run (steps run one at a time, in order)
        self.sampled: torch.Tensor | None = None
        # each running request's block table and sampling settings, kept between steps
        self.input_batch = InputBatch(2 * config.max_num_seqs, config.blocks_per_seq() + 1,
                                      config.block_size)
        # per row count, a decode step's cu_seqlens_q and logits_indices (the row numbers)
        self._row_numbers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        args = model.args
        shape = (config.num_kv_blocks, config.block_size, args.num_kv_heads, args.head_dim)
        dtype = DTYPES[config.dtype]
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=self.device),
                           torch.zeros(shape, dtype=dtype, device=self.device))
                          for _ in range(args.num_layers)]
        # a CPU engine (its C kernels built, float32 weights) runs its decode-only steps of up to
        # max_fused_decode_rows rows through the fused C decode layer; other steps run the model
        self.fused = (FusedCpuDecoder(model, config.max_fused_decode_rows)
                      if config.attention == "cpu" else None)
        self.graphs: DecodeGraphs | None = None     # decode-only steps through CUDA graphs

    def use_cuda_graphs(self, capture: bool = True) -> None:
        """Run decode-only steps through DecodeGraphs: captured (CUDA, after the KV pool), or with
        capture=False replayed without capture (the same static buffers and padding, the eager
        forward run on them: how a CPU tests the path). Prefill, mixed and verification steps
        stay eager."""
        self.graphs = DecodeGraphs(self.model.args, self.eager_forward, self.config, capture,
                                   self.pad_token_id)

    def kv_cache_bytes(self) -> int:
        """The pool's bytes: the model's caches and, with a draft model, the draft's."""
        own = sum(k.numel() * k.element_size() * 2 for k, _ in self.kv_caches)
        return own + (self.proposer.runner.kv_cache_bytes() if self.proposer is not None else 0)

    def prepare(self, output: SchedulerOutput) -> PackedStep:
        """Pack the step: input ids, positions, attention metadata, the rows to sample and, for a
        step of decodes only, what it read of the persistent batch."""
        rows = len(output.seqs)
        if (output.num_decode_rows == rows and output.num_useful_rows == rows
                and not any(s.prompt_targets for s in output.seqs)):
            return self._prepare_decodes(output)       # decodes only, none a ghost or a prompt
        return self._prepare_packed(output)

    def _prepare_packed(self, output: SchedulerOutput):
        """Any step: per row, [pad…, the row's tokens]; everything else by tensor ops."""
        seqs, block_size = output.seqs, self.config.block_size
        input_ids: list[int] = []
        q_lens, starts, pads, seq_lens, real_rows = [], [], [], [], []
        for seq in seqs:
            input_ids.extend([self.pad_token_id] * seq.num_pad)
            input_ids.extend(seq.token_ids)
            q_lens.append(seq.q_len)
            starts.append(seq.start)
            pads.append(seq.num_pad)
            seq_lens.append(seq.seq_len)
            real_rows.append(not seq.ghost)

        q_lens_t = torch.tensor(q_lens)
        cu_seqlens_q = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
        cu_seqlens_q[1:] = q_lens_t.cumsum(0)
        row_of_token = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens_t)
        offset_in_row = torch.arange(len(input_ids)) - cu_seqlens_q[:-1].long()[row_of_token]
        pads_t = torch.tensor(pads)[row_of_token]
        positions = (torch.tensor(starts)[row_of_token] + offset_in_row - pads_t).clamp(min=0)
        block_tables = self._block_tables(seqs)
        max_blocks = block_tables.shape[1]
        # token at position p of row r → block_tables[r, p // block_size] * block_size + p %
        # block_size
        slots = block_tables[row_of_token,
                             (positions // block_size).clamp(max=max_blocks - 1)].long() \
            * block_size + positions % block_size
        writes = (offset_in_row >= pads_t) & torch.tensor(real_rows)[row_of_token]
        slot_mapping = torch.where(writes, slots, torch.full_like(slots, -1))
        ends = cu_seqlens_q[1:].long()
        if any(s.proposal or s.prompt_targets for s in seqs):
            # a verification row needs logits at each of its 1 + k positions, a row asking for
            # prompt logprobs at its first len(prompt_targets) positions too, the rest at the last
            logits_indices = torch.cat([part for s, end in zip(seqs, ends.tolist())
                                        for part in _row_logits(s, end)]
                                       or [torch.zeros(0, dtype=torch.long)])
        else:
            logits_indices = (ends - 1)[[s.needs_logits for s in seqs]]
        return self._to_device(output, torch.tensor(input_ids), positions, slot_mapping,
                               cu_seqlens_q, torch.tensor(seq_lens, dtype=torch.int32), seq_lens,
                               block_tables, q_lens, logits_indices)

    def _prepare_decodes(self, output: SchedulerOutput):
        """The decode-only step: row r is one token at position start_r, every row needs its
        logits, nothing is padded. The persistent batch gathers the rows in one pass (their
        block tables rewritten only when they changed) into arrays that become tensors without
        a copy; what depends on the row count alone (cu_seqlens_q, the logits of every row, the
        query lengths and decode marks) is the same for every step of as many rows, made once."""
        inputs = self.input_batch.gather(output.seqs)
        num_rows = len(output.seqs)
        numbers = self._row_numbers.get(num_rows)
        if numbers is None:    # (never written in place: every step of num_rows rows reads them)
            rows = torch.arange(num_rows + 1, dtype=torch.int32)
            numbers = self._row_numbers[num_rows] = (rows, rows[:-1].long(), [1] * num_rows,
                                                     [True] * num_rows)
        cu_seqlens_q, logits_indices, q_lens, decode_rows = numbers
        if self.device.type != "cpu":
            return self._to_device(output, torch.from_numpy(inputs.tokens),
                                   torch.from_numpy(inputs.positions),
                                   torch.from_numpy(inputs.slots), cu_seqlens_q,
                                   torch.from_numpy(inputs.seq_lens), inputs.seq_lens_host,
                                   torch.from_numpy(inputs.block_tables), q_lens, logits_indices,
                                   inputs)
        # on the host, the arrays are the step's tensors: nothing to move
        meta = AttentionMetadata(torch.from_numpy(inputs.slots), cu_seqlens_q,
                                 torch.from_numpy(inputs.seq_lens),
                                 torch.from_numpy(inputs.block_tables), 1,
                                 max(inputs.seq_lens_host), q_lens, inputs.seq_lens_host,
                                 decode_rows, num_rows)
        return PackedStep(torch.from_numpy(inputs.tokens), torch.from_numpy(inputs.positions),
                          meta, logits_indices, inputs)

    @staticmethod
    def _block_tables(seqs) -> torch.Tensor:
        """The rows' block tables, padded with block 0 to the longest: int32 [rows, max_blocks]."""
        tables = [s.block_table for s in seqs]
        width = max(len(t) for t in tables)
        return torch.tensor([t + [0] * (width - len(t)) if len(t) < width else t for t in tables],
                            dtype=torch.int32)

    def _to_device(self, output, input_ids, positions, slot_mapping, cu_seqlens_q, seq_lens,
                   seq_lens_host, block_tables, q_lens, logits_indices, decode=None) -> PackedStep:
        on_host = self.device.type == "cpu"     # then every .to() would be a no-op call

        def moved(tensor: torch.Tensor) -> torch.Tensor:
            return tensor if on_host else tensor.to(self.device, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=moved(slot_mapping), cu_seqlens_q=moved(cu_seqlens_q),
            seq_lens=moved(seq_lens), block_tables=moved(block_tables), max_seqlen_q=max(q_lens),
            max_seqlen_k=max(max(seq_lens_host), 1), q_lens_host=q_lens,
            seq_lens_host=seq_lens_host,
            decode_rows=([True] * len(q_lens) if output.num_decode_rows == len(q_lens)
                         else [s.is_decode for s in output.seqs]),
            num_decode_rows=output.num_decode_rows)
        return PackedStep(moved(input_ids), moved(positions), meta,
                          moved(logits_indices), decode)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                logits_indices: torch.Tensor) -> torch.Tensor:
        """The packed step's logits: a decode-only step that fits a captured size through its
        CUDA graph, any other step eagerly."""
        if self.graphs is not None and self.graphs.can_run(meta, logits_indices.shape[0]):
            return self.graphs.run(input_ids, positions, meta)
        return self.eager_forward(input_ids, positions, meta, logits_indices)

    def eager_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      meta: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        """The step run op by op: the fused decode layer's when it takes the step, else the
        model's."""
        if self.fused is not None and self.fused.takes(input_ids.shape[0], meta):
            return self.fused(input_ids, positions, self.kv_caches, meta, logits_indices)
        return self.model(input_ids, positions, self.kv_caches, meta, logits_indices)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: give each destination block the KV of its source, in every layer.

        In order, one pair at a time: a block copied earlier in the list may be a later source.
        """
        for source, destination in pairs:
            for k_cache, v_cache in self.kv_caches:
                k_cache[destination] = k_cache[source]
                v_cache[destination] = v_cache[source]

    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        if self.proposer is not None:
            self.proposer.copy_blocks(output.block_copies)
            self.proposer.propose(output)          # the draft's tokens, before the target's pass
        return self.run(output, self.prepare(output))

    def run(self, output: SchedulerOutput, packed: PackedStep,
            previous: torch.Tensor | None = None) -> ModelRunnerOutput:
        """Run a packed step (`prepare`'s): copy-on-write, the forward, sampling. Everything the
        step reads of the persistent batch travels in `packed`, so the next step can be prepared
        meanwhile. `previous`: the step before's sampled tokens, one per row that sampled
        (overlapped scheduling): the plan's placeholders (-1 - r) are filled from row r of it,
        here, where the tokens are, without a trip through the host."""
        if output.block_copies:                    # before the forward writes into the copies
            self.copy_blocks(output.block_copies)
        input_ids, positions, meta, logits_indices, decode = packed
        if previous is not None and len(previous):   # (a step that sampled nothing names none)
            holes = input_ids < 0
            input_ids = torch.where(holes, previous[(-1 - input_ids).clamp(0, len(previous) - 1)],
                                    input_ids)
        logits = self.forward(input_ids, positions, meta, logits_indices)
        prompt_logprobs, rows = None, output.seqs
        if decode is not None:                    # every row a decode: its settings are at hand
            steady = decode.all_greedy and not decode.any_logprobs    # nothing but an argmax
            result = self._argmax_rows(logits) if steady else self.sample(rows, logits, decode)
        else:
            rows = [s for s in output.seqs if s.needs_logits]
            if any(s.prompt_targets for s in output.seqs):
                logits, prompt_logprobs = self._prompt_logprobs(output.seqs, logits)
            result = self.sample(rows, logits)
        result.prompt_logprobs = prompt_logprobs
        if self.proposer is not None:
            self.proposer.catch_up([s for s, tokens in zip(rows, result.sampled_token_ids)
                                    if s.proposal and tokens and len(tokens) > len(s.proposal)])
        return result

    def sample(self, rows: list[ScheduledSeq], logits: torch.Tensor,
               decode: DecodeInputs | None = None) -> ModelRunnerOutput:
        """Every row's tokens, one path for all: `logits` holds each row's `num_logits`
        positions in turn (one for a decode or a prompt's last chunk, 1 + k for a verification
        row). The one-position rows are sampled together by the sampler; each verification row
        goes to the acceptance rule (minicb.spec.rejection.accept, with the request's own
        generator), which keeps 1 to k + 1 tokens; then every kept token's logprob, read by the
        sampler from its own position's logits. `decode`: in a step of decodes only, what the
        persistent batch read of its rows, their sampling settings included."""
        if decode is not None:
            firsts = range(len(rows) + 1)
            plain = range(len(rows))
            greedy = decode.all_greedy
        else:
            firsts = [0]
            for seq in rows:
                firsts.append(firsts[-1] + seq.num_logits)
            plain = [i for i, s in enumerate(rows) if not s.proposal]
            greedy = None
        tokens: list[list[int] | None] = [None] * len(rows)
        errors: list[str | None] = [None] * len(rows)
        if len(plain) == len(rows):
            drawn, errors = self._sample_plain(logits, rows, greedy)
            tokens = [None if token is None else [token] for token in drawn]
        elif plain:
            at = torch.tensor([firsts[i] for i in plain])
            drawn, failed = self._sample_plain(logits[at], [rows[i] for i in plain])
            for i, token, error in zip(plain, drawn, failed):
                tokens[i], errors[i] = (None if token is None else [token]), error
        if len(plain) < len(rows):
            for i, seq in enumerate(rows):
                if seq.proposal:
                    try:
                        tokens[i] = accept(logits[firsts[i]:firsts[i + 1]], seq.proposal,
                                           seq.params, seq.generator, seq.draft_probs)
                    except Exception as error:
                        errors[i] = f"verification failed: {type(error).__name__}: {error}"
        if decode is not None and not decode.any_logprobs:
            logprobs = [None] * len(rows)
        else:
            logprobs = self._logprobs(rows, logits, firsts, tokens)
        return ModelRunnerOutput(tokens, logprobs, errors)

    @staticmethod
    def _prompt_logprobs(seqs: list[ScheduledSeq], logits: torch.Tensor):
        """Split the prompt positions' logits (each row's first len(prompt_targets)) from those to
        sample, and turn them into each asking row's prompt logprobs: the log-softmax of the raw
        logits at position p, read at prompt token p + 1, with the top prompt_logprobs."""
        flags = [flag for s in seqs
                 for flag in [True] * len(s.prompt_targets) + [False] * s.num_logits]
        is_prompt = torch.tensor(flags, dtype=torch.bool, device=logits.device)
        targets = torch.tensor([t for s in seqs for t in s.prompt_targets], device=logits.device)
        wanted = [s.params.prompt_logprobs for s in seqs for _ in s.prompt_targets]
        values = iter(Sampler.top_logprobs(logits[is_prompt], targets, wanted))
        by_row = {index: [next(values)[1] for _ in s.prompt_targets]
                  for index, s in enumerate(seqs) if s.prompt_targets}
        return logits[~is_prompt], by_row

    def _sample_plain(self, logits: torch.Tensor, rows: list[ScheduledSeq],
                      all_greedy: bool | None = None
                      ) -> tuple[list[int | None], list[str | None]]:
        """One token per row, the batch at once. If one request's settings break the batch's
        sampling, each row is sampled alone, so only a row that fails by itself goes without a
        token (the engine ends that request, with the error, and every other request carries
        on). `all_greedy`: whether every row is greedy, when the caller knows."""
        if all_greedy:         # no settings to read: every row takes its argmax
            self.sampled = self.sampler.argmax(logits.float())
            return self.sampled.tolist(), [None] * len(rows)
        params, generators = [s.params for s in rows], [s.generator for s in rows]
        states = [s.logits_state for s in rows]
        try:
            sampled = self.sampler.sample(logits, params, generators, states)
        except Exception:
            pass
        else:
            self.sampled = sampled
            return sampled.tolist(), [None] * len(rows)
        tokens: list[int | None] = []
        errors: list[str | None] = []
        for row in range(len(rows)):
            try:
                tokens += self.sampler.sample(logits[row:row + 1], params[row:row + 1],
                                              generators[row:row + 1],
                                              states[row:row + 1]).tolist()
                errors.append(None)
            except Exception as error:
                tokens.append(None)
                errors.append(f"sampling failed: {type(error).__name__}: {error}")
        # (a row without a token holds 0: its request ends, and the token is never fed)
        self.sampled = torch.tensor([0 if t is None else t for t in tokens], device=logits.device)
        return tokens, errors

    def _argmax_rows(self, logits: torch.Tensor) -> ModelRunnerOutput:
        """Every row greedy, none asking for logprobs (a decode step's settings, read off the
        persistent batch): each row's argmax is its one token, and the result's lists are built
        once each, without `sample`'s general bookkeeping."""
        # (float32 logits, the CPU's, are taken as they are: .float() is a call even then)
        sampled = self.sampled = self.sampler.argmax(
            logits if logits.dtype == torch.float32 else logits.float())
        num_rows = len(sampled)
        return ModelRunnerOutput([[token] for token in sampled.tolist()], [None] * num_rows,
                                 [None] * num_rows)

    def _logprobs(self, rows: list[ScheduledSeq], logits: torch.Tensor, firsts: list[int],
                  tokens: list[list[int] | None]) -> list[list[Logprob | None] | None]:
        """Each kept token's logprob from its own position's logits, in one call of the sampler
        over the rows that asked for them; None for the others."""
        asked = [i for i, (s, t) in enumerate(zip(rows, tokens))
                 if t is not None and s.params.logprobs is not None]
        result: list[list[Logprob | None] | None] = [None] * len(rows)
        if not asked:
            return result
        positions = [firsts[i] + j for i in asked for j in range(len(tokens[i]))]
        kept = torch.tensor([t for i in asked for t in tokens[i]], device=logits.device)
        params = [rows[i].params for i in asked for _ in tokens[i]]
        flat = iter(self.sampler.logprobs(logits[positions], kept, params))
        for i in asked:
            result[i] = [next(flat) for _ in tokens[i]]
        return result

"""The model runner: turn a SchedulerOutput into packed tensors, run the model, sample.

It reads only the plan: each row carries the tokens it computes, where they start, its block
table, whether it is a decode and its sampling settings (minicb.plan.ScheduledSeq). It holds no
KV manager and never looks at a Request, so the plan alone says what a step computes.

A step takes one general path, which any step may take, or a shorter sibling that gives the same
result for the steps it accepts. Each choice is made once, in one place: `prepare` picks the
packer (minicb.runner.packing: any step, or decodes only) and `sample` the sampling route (any
step, no verification row, or every row a plain argmax).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minicb.config import ResolvedConfig
from minicb.model.attention import AttentionMetadata
from minicb.model.cuda_graphs import DecodeGraphs, graph_memory_bytes
from minicb.model.fused_cpu import FusedCpuDecoder, use_small_batch_linear
from minicb.model.llama import LlamaForCausalLM
from minicb.model.loader import DTYPES
from minicb.model.moe import use_cpu_moe
from minicb.model.quant import kv_bytes_per_token, kv_cache_layout
from minicb.plan import Logprob, ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from minicb.runner.input_batch import DecodeInputs, InputBatch
from minicb.runner.packing import PackedStep, pack, pack_decodes
from minicb.runner.sampler import Sampler
from minicb.spec.rejection import accept


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
    per_token = sum(kv_bytes_per_token(args, DTYPES[config.dtype], config.kv_cache_dtype)
                    for args in models_args)
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
        args = model.args
        row, dtype = kv_cache_layout(args.num_kv_heads, args.head_dim, DTYPES[config.dtype],
                                     config.kv_cache_dtype)
        shape = (config.num_kv_blocks, config.block_size, *row)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=self.device),
                           torch.zeros(shape, dtype=dtype, device=self.device))
                          for _ in range(args.num_layers)]
        # a CPU engine (its C kernels built, float32 weights) runs its decode-only steps of up to
        # max_fused_decode_rows rows through the fused C decode layer; other steps run the model
        # (a mixture-of-experts model always: the fused layer computes a dense MLP; and a rank
        # of a split model: the fused layer has no place for the all-reduces)
        self.fused = (FusedCpuDecoder(model, config.max_fused_decode_rows)
                      if config.attention == "cpu" and model.args.moe is None
                      and config.tensor_parallel_size == 1 else None)
        if config.attention == "cpu" and model.args.moe is not None \
                and config.tensor_parallel_size == 1:
            # its steps of up to as many rows run the experts in one C call (kernels/cpu_moe.c)
            # and its other small products through the small-batch kernel
            use_small_batch_linear(model)
            use_cpu_moe(model, config.max_fused_decode_rows)
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
        """Pack the step (minicb.runner.packing): input ids, positions, attention metadata, the
        rows to sample and, for a step of decodes only, what it read of the persistent batch.
        Such a step (none a ghost, none asking for prompt logprobs) takes the shorter packer."""
        rows = len(output.seqs)
        if (output.num_decode_rows == rows and output.num_useful_rows == rows
                and not any(s.prompt_targets for s in output.seqs)):
            return pack_decodes(output, self.input_batch, self.device)
        return pack(output, self.config.block_size, self.pad_token_id, self.device)

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
        if decode is None:    # (a step of decodes only samples every row, asks no prompt logprobs)
            rows = [s for s in output.seqs if s.needs_logits]
            if any(s.prompt_targets for s in output.seqs):
                logits, prompt_logprobs = self._prompt_logprobs(output.seqs, logits)
        result = self.sample(rows, logits, decode)
        result.prompt_logprobs = prompt_logprobs
        if self.proposer is not None:
            self.proposer.catch_up([s for s, tokens in zip(rows, result.sampled_token_ids)
                                    if s.proposal and tokens and len(tokens) > len(s.proposal)])
        return result

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

    def sample(self, rows: list[ScheduledSeq], logits: torch.Tensor,
               decode: DecodeInputs | None = None) -> ModelRunnerOutput:
        """Every row's tokens, their logprobs and errors, by the route the step allows, chosen
        here once. `_sample_general` takes any step; the two others give its very result for the
        steps they accept, with less work (tests/runner/test_sample_routes.py holds them to it):

        - `_sample_argmax`: a step of decodes whose every row takes the argmax of its raw logits
          (greedy, nothing to apply first), as the persistent batch read off its rows (`decode`);
        - `_sample_plain`: a step without a verification row, so row i's logits are logits[i]."""
        if decode is not None:
            if decode.all_greedy:
                return self._sample_argmax(rows, logits, decode.any_logprobs)
            return self._sample_plain(rows, logits, decode.any_logprobs)
        if not any(s.proposal for s in rows):
            return self._sample_plain(rows, logits)
        return self._sample_general(rows, logits)

    def _sample_general(self, rows: list[ScheduledSeq], logits: torch.Tensor
                        ) -> ModelRunnerOutput:
        """Every row's tokens, one path for all: `logits` holds each row's `num_logits`
        positions in turn (one for a decode or a prompt's last chunk, 1 + k for a verification
        row). The one-position rows are sampled together by the sampler; each verification row
        goes to the acceptance rule (minicb.spec.rejection.accept, with the request's own
        generator), which keeps 1 to k + 1 tokens; then every kept token's logprob, read by the
        sampler from its own position's logits."""
        firsts = [0]
        for seq in rows:
            firsts.append(firsts[-1] + seq.num_logits)
        tokens: list[list[int] | None] = [None] * len(rows)
        errors: list[str | None] = [None] * len(rows)
        plain = [i for i, s in enumerate(rows) if not s.proposal]
        if plain:
            at = torch.tensor([firsts[i] for i in plain])
            drawn, failed = self._sample_batch(logits[at], [rows[i] for i in plain])
            for i, token, error in zip(plain, drawn, failed):
                tokens[i], errors[i] = (None if token is None else [token]), error
        for i, seq in enumerate(rows):
            if seq.proposal:
                try:
                    tokens[i] = accept(logits[firsts[i]:firsts[i + 1]], seq.proposal, seq.params,
                                       seq.generator, seq.draft_probs)
                except Exception as error:
                    errors[i] = f"verification failed: {type(error).__name__}: {error}"
        return ModelRunnerOutput(tokens, self._logprobs(rows, logits, firsts, tokens), errors)

    def _sample_plain(self, rows: list[ScheduledSeq], logits: torch.Tensor,
                      any_logprobs: bool = True) -> ModelRunnerOutput:
        """No verification row: each row has one position, logits[i], so the sampler takes the
        logits whole (no gather) and no acceptance rule runs. `any_logprobs`: False when the
        persistent batch says no row asked for logprobs (else `_logprobs` looks)."""
        drawn, errors = self._sample_batch(logits, rows)
        tokens = [None if token is None else [token] for token in drawn]
        logprobs = (self._logprobs(rows, logits, range(len(rows) + 1), tokens) if any_logprobs
                    else [None] * len(rows))
        return ModelRunnerOutput(tokens, logprobs, errors)

    def _sample_argmax(self, rows: list[ScheduledSeq], logits: torch.Tensor,
                       any_logprobs: bool) -> ModelRunnerOutput:
        """Every row a decode that takes the argmax of its raw logits, as the sampler would
        (greedy, no penalty, bias or grammar to apply first): one argmax, no row's settings read,
        nothing that can fail; logprobs only when a row asked. The steady greedy decode."""
        # (float32 logits, the CPU's, are taken as they are: .float() is a call even then)
        sampled = self.sampled = self.sampler.argmax(
            logits if logits.dtype == torch.float32 else logits.float())
        tokens = [[token] for token in sampled.tolist()]
        logprobs = (self._logprobs(rows, logits, range(len(rows) + 1), tokens) if any_logprobs
                    else [None] * len(rows))
        return ModelRunnerOutput(tokens, logprobs, [None] * len(rows))

    def _sample_batch(self, logits: torch.Tensor, rows: list[ScheduledSeq]
                      ) -> tuple[list[int | None], list[str | None]]:
        """One token per row, the batch at once, kept in `sampled` for the next step's
        placeholders. If one request's settings break the batch's sampling, each row is sampled
        alone, so only a row that fails by itself goes without a token (the engine ends that
        request, with the error, and every other request carries on)."""
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

    def _logprobs(self, rows: list[ScheduledSeq], logits: torch.Tensor, firsts: Sequence[int],
                  tokens: list[list[int] | None]) -> list[list[Logprob | None] | None]:
        """Each kept token's logprob from its own position's logits, in one call of the sampler
        over the rows that asked for them; None for the others. `firsts[i]`: row i's first
        position in `logits`."""
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

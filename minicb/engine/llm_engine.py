"""LLMEngine: add_request / step / abort, shaped like vLLM's. LLM (minicb/engine/llm.py) and the
async engine (minicb/serving/async_engine.py) both drive it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

import torch

from minicb.config import EngineConfig
from minicb.engine.core import EngineCore, ModelExecutor, OverlappedModelExecutor
from minicb.engine.detokenizer import IncrementalDetokenizer
from minicb.engine.inputs import InputProcessor, ProcessedPrompt, Prompt
from minicb.engine.outputs import CompletionOutput, RequestOutput
from minicb.kv import make_kv_manager
from minicb.metrics import RequestMetrics, StepTotals, count_step
from minicb.model.attention import resolve_backend
from minicb.model.cuda_graphs import uses_cuda_graphs
from minicb.model.loader import load_model, load_tokenizer, resolve_model_path
from minicb.params import SamplingParams
from minicb.request import Request, RequestStatus
from minicb.runner.logits_process import LogitsState
from minicb.runner.model_runner import ModelRunner, check_kv_fits
from minicb.runner.structured_outputs import StructuredOutputManager
from minicb.runner.threads import ThreadPolicy, ceiling
from minicb.scheduler import make_scheduler

log = logging.getLogger("minicb.engine.llm_engine")

class LLMEngine:
    """One engine, swappable parts: scheduler × KV manager × attention backend."""

    def __init__(self, config: EngineConfig):
        """`config` is the caller's and stays as it is; `self.config` is its resolved copy (a
        ResolvedConfig: the model's context, the pool size and the attention backend filled in)."""
        path = resolve_model_path(config.model)
        self.model_path = str(path)
        self.tokenizer = load_tokenizer(path)
        dtype = config.asked("dtype")
        if dtype == "auto":                   # what the device runs best (as vLLM's "auto")
            from minicb.model.quant import auto_dtype
            dtype = auto_dtype(path, config.device)
        if config.device.startswith("cuda"):  # bfloat16 on a GPU without it: float16, stated
            from minicb.kernels.targets import resolve_dtype
            dtype = resolve_dtype(dtype, config.device)
        attention = resolve_backend(config.asked("attention"), config.device, dtype,
                                    config.kv_cache_dtype)
        self.model = load_model(path, config.device, dtype, attention, config.quantization)
        # on a CPU, how many threads each step uses: the cores other programs leave free. It
        # changes how many threads run a step, never which arithmetic: the fused decode layer's
        # row limit is fixed here, once (config.max_fused_decode_rows)
        threads = config.cpu_threads
        if config.tensor_parallel_size > 1:     # each rank its share of the cores, fixed
            from minicb.engine.tp_executor import rank_threads
            threads = rank_threads(config)
        self.threads = (ThreadPolicy(threads) if config.device == "cpu" else None)
        config = self.config = config.resolve(self.model.args.max_position_embeddings, attention,
                                               dtype, ceiling())
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        draft = proposer = None
        if config.speculative_method == "draft_model":
            from minicb.spec.draft_model import DraftModelProposer, load_draft

            draft = load_draft(config, path, self.model.args, self.tokenizer)
        check_kv_fits(config, self.model.args, *([draft.args] if draft is not None else []))
        if draft is not None:     # its KV cache: one block for each of the pool's blocks
            proposer = DraftModelProposer(ModelRunner(draft, config, pad_token_id=pad or 0))
        self.vocab_size = self.model.args.vocab_size
        self.eos_token_ids = _eos_ids(path, self.tokenizer)
        self.kv = make_kv_manager(config.kv_cache, config.num_kv_blocks, config.block_size,
                                  config.max_model_len, config.enable_prefix_caching)
        overlap = _overlaps(config)
        self.scheduler = make_scheduler(config, self.kv, time.perf_counter, self.eos_token_ids,
                                        overlap=overlap)
        if config.tensor_parallel_size == 1:
            self.runner = ModelRunner(self.model, config, pad_token_id=pad or 0,
                                      proposer=proposer)
        else:      # the model split across processes, this one rank 0 (engine/tp_executor.py)
            from minicb.engine.tp_executor import start_tensor_parallel
            self.runner = start_tensor_parallel(self.model, config, self.model_path, pad or 0,
                                                proposer)
        if uses_cuda_graphs(config):        # after the KV pool, whose addresses the graphs read
            self.runner.use_cuda_graphs(capture=True)
            if self.model.expert_load is not None:    # the capture's steps routed no request
                self.model.expert_load.reset()
        self.core = self._make_core(overlap)
        # the grammar compiler and its cache, built by the first constrained request
        self._structured: StructuredOutputManager | None = None
        self._structured_lock = threading.Lock()
        # the front door: every request is checked there, once (minicb/engine/inputs.py)
        self.processor = InputProcessor(self.tokenizer, self.vocab_size, self.scheduler.check_fits,
                                        self.model_path, self._structured_manager)
        # True: every output carries the text its step added (the async engine streams it)
        self.stream_text = False
        # per sample that has stop strings (or streams text): its incremental detokenizer
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.requests: dict[str, Request] = {}       # by the engine's id (a sample's, for n > 1)
        self._groups: dict[str, list[str]] = {}      # the caller's request id -> its samples' ids
        self._final_only: set[str] = set()           # samples reported only once finished
        self._arrivals = 0
        self._seed_generator = torch.Generator().manual_seed(config.seed)
        # per-step counts (slot, padding and KV use): running totals + the last steps; see
        # minicb.metrics
        self.step_stats = StepTotals()

    def _make_core(self, overlap: bool) -> EngineCore:
        """The engine core: synchronous steps, or overlapped ones (`_overlaps`)."""
        executor = (OverlappedModelExecutor if overlap else ModelExecutor)(self.runner,
                                                                            self.threads)
        return EngineCore(self.scheduler, executor, overlap=overlap)

    # --- requests --------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Prompt | ProcessedPrompt,
                    params: SamplingParams | None = None, arrival_time: float | None = None,
                    priority: int = 0, stream: bool = True) -> list[Request]:
        """Queue one request; return its Requests (one per sample).

        `prompt` is text or token ids, checked here by the front door (`self.processor`), or a
        ProcessedPrompt the caller already had from `self.processor.process(prompt, params)`,
        queued without a second check (its params are the ones it was checked with).
        With `params.n > 1` the request runs as n samples: inside the engine they are requests
        `{request_id}-{i}`, reported under `request_id` with `CompletionOutput.index` i. Sample i
        draws from `seed + i` (when a seed is given), and the samples after the first share the
        first one's prompt blocks (paged KV). `stream=False` reports the request once, when it
        finishes (vLLM's final-only output): no output is built for it while it runs.
        """
        if request_id in self._groups:
            raise ValueError(f"request id {request_id!r} is already in use; ids must be unique.")
        if isinstance(prompt, ProcessedPrompt):
            if params is not None and params is not prompt.params:
                raise ValueError("a ProcessedPrompt carries the params it was checked with; "
                                 "leave params out.")
            processed = prompt
        else:
            processed = self.processor.process(prompt, params)
        prompt, token_ids, params = processed.prompt, processed.prompt_token_ids, processed.params
        n = params.n
        sample_ids = [request_id] if n == 1 else [f"{request_id}-{i}" for i in range(n)]
        taken = [sample_id for sample_id in sample_ids if sample_id in self.requests]
        if taken:
            raise ValueError(f"request id {taken[0]!r} is already in use; ids must be unique.")
        arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        requests: list[Request] = []
        for index, sample_id in enumerate(sample_ids):
            sample_params = params if n == 1 else \
                replace(params, n=1, seed=None if params.seed is None else params.seed + index)
            seed = sample_params.seed if sample_params.seed is not None else \
                int(torch.randint(0, 2**62, (1,), generator=self._seed_generator))
            request = Request(sample_id, token_ids, sample_params, arrival_time=arrival_time,
                              arrival_step=self.scheduler.step_count,
                              generator=torch.Generator().manual_seed(seed),
                              prompt=prompt, priority=priority,
                              arrival_index=self._arrivals, group_id=request_id, sample_index=index)
            request.logits_state = self._logits_state(sample_params, token_ids)
            self._arrivals += 1
            self.requests[sample_id] = request
            if not stream:
                self._final_only.add(sample_id)
            if (params.stop or self.stream_text) and self.tokenizer is not None:
                self._detokenizers[sample_id] = IncrementalDetokenizer(
                    self.tokenizer, params.stop, params.skip_special_tokens)
            # a sample asking for prompt logprobs computes its whole prompt: it shares no blocks
            first = (requests[0] if requests and self.kv.supports_sharing
                     and params.prompt_logprobs is None else None)
            self.scheduler.add_request(request, fork_of=first)
            requests.append(request)
        self._groups[request_id] = sample_ids
        return requests

    @property
    def structured(self) -> StructuredOutputManager:
        """The grammar compiler over this model's tokenizer (ValueError without xgrammar)."""
        return self._structured_manager(self.tokenizer)

    def _structured_manager(self, tokenizer) -> StructuredOutputManager:
        """Built once, reading the vocabulary through `tokenizer`: the calling thread's own (a
        tokenizer must never be used by two threads at once)."""
        with self._structured_lock:
            if self._structured is None:
                self._structured = StructuredOutputManager(tokenizer, self.vocab_size,
                                                           sorted(self.eos_token_ids))
            return self._structured

    def _logits_state(self, params: SamplingParams, token_ids: list[int]) -> LogitsState | None:
        """A sample's own penalties, min_tokens and grammar state; None when it asks for none."""
        if not params.needs_logits_processing:
            return None
        matcher = (self.structured.matcher(params.structured_outputs)
                   if params.structured_outputs is not None else None)
        return LogitsState(params, token_ids, self.vocab_size,
                           self.eos_token_ids | set(params.stop_token_ids), matcher)

    def request_ids(self) -> list[str]:
        """The requests (callers' ids) not yet reported finished."""
        return list(self._groups)

    def discard(self, request_id: str) -> None:
        """Forget a request without a step: abort it (its blocks are freed) and drop it unreported.
        For a caller that cannot step any more (LLM.generate after a failure)."""
        for sample_id in self._groups.get(request_id, []):
            request = self.requests.get(sample_id)
            if request is None:
                continue
            if not request.finished:
                self.scheduler.abort(sample_id)
            self._forget(request)

    def has_request(self, request_id: str) -> bool:
        """True while the request (any of its samples) is queued, running, or not yet reported."""
        return request_id in self._groups

    def abort(self, request_id: str) -> None:
        """Stop a request (every sample of it): the next step() frees its blocks and reports it."""
        if request_id not in self._groups:
            raise ValueError(f"cannot abort {request_id!r}: no such request (it may have finished "
                             "already).")
        self.core.abort(sample_id for sample_id in self._groups[request_id]
                        if sample_id in self.requests and not self.requests[sample_id].finished)

    def has_unfinished_requests(self) -> bool:
        """Requests queued or running, aborted ones the next step reports, or a step in
        flight (overlapped scheduling)."""
        return self.core.has_unfinished()

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission (each sample of a request counts)."""
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        """Sequences running and not finished."""
        return self.scheduler.num_running

    # --- the loop ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step of the engine core (schedule, run the model once, sample, apply the results),
        then the stop strings on the new text, and the outputs."""
        result = self.core.step()
        touched = result.touched                               # tokens, logprobs, errors, stops
        texts: dict[str, str] = {}
        if result.plan is not None:
            if self._detokenizers:
                texts = self._detokenize(touched)                # stop strings, streamed text
            self.step_stats.add(count_step(result.plan, self.kv, self.scheduler.running,
                                           self.config.max_num_seqs))
        # the requests aborted since the last step come back from the core, applied at its start;
        # the scheduler lists every request that finished (stops, errors, aborts), so a request
        # that does not stream is reported once, finished, without asking every row
        ended = result.aborted
        finished = self.scheduler.take_finished()
        if not finished and not ended and len(self._final_only) == len(self.requests):
            return []      # every live request is reported once finished, and none finished
        finished_ids = {r.request_id for r in finished}
        final_only = self._final_only
        outputs = [self._output(r, texts.get(r.request_id, "")) for r in touched + ended
                   if r.request_id not in final_only or r.request_id in finished_ids]
        for request in finished:
            if request.request_id in self.requests:
                self._forget(request)
        return outputs

    def _forget(self, request: Request) -> None:
        """A finished request has been reported: drop it, and its group once every sample is."""
        self.requests.pop(request.request_id, None)
        self._detokenizers.pop(request.request_id, None)
        self._final_only.discard(request.request_id)
        group = self._groups.get(request.group_id)
        if group is not None and not any(sample_id in self.requests for sample_id in group):
            del self._groups[request.group_id]

    # --- text -----------------------------------------------------------------------------------
    def _detokenize(self, touched: list[Request]) -> dict[str, str]:
        """Feed each request's new tokens to its detokenizer (on this, the step thread): end a
        request whose text now holds a stop string, and return each one's new text."""
        texts = {}
        for request in touched:
            detokenizer = self._detokenizers.get(request.request_id)
            if detokenizer is None:
                continue
            try:
                texts[request.request_id] = detokenizer.add(
                    request.output_token_ids[len(detokenizer.token_ids):])
            except Exception as error:     # one request's text must not stop the others
                if not request.finished:
                    request.error = f"the stop check failed: {type(error).__name__}: {error}"
                    self.scheduler.finish(request, RequestStatus.FINISHED_ERROR)
                continue
            # a stop string ends the request, unless EOS or a stop token id ended it first
            if detokenizer.stop is not None and request.status in (
                    RequestStatus.RUNNING, RequestStatus.FINISHED_LENGTH):
                request.stop_reason, request.output_text = detokenizer.stop, detokenizer.text
                if request.finished:
                    request.status = RequestStatus.FINISHED_STOPPED
                else:
                    self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
        return texts

    def decode(self, request: Request) -> str:
        """A finished request's text: cut before its stop string if one ended it."""
        if self.tokenizer is None:
            return ""
        if request.stop_reason is not None and isinstance(request.stop_reason, str):
            return request.output_text
        return self.tokenizer.decode(request.output_token_ids,
                                     skip_special_tokens=request.params.skip_special_tokens)

    def _output(self, request: Request, new_text: str = "") -> RequestOutput:
        """What one step tells about a request: its new tokens (and new text when streaming);
        once it finished, its whole output, text, logprobs and metrics, copied that once."""
        new = request.output_token_ids[request.num_reported_tokens:]
        # prompt logprobs: on the first output (for a streaming client) and on the last
        prompt_logprobs = (request.prompt_logprobs if request.num_reported_tokens == 0
                           or request.finished else None)
        new_logprobs = ([top for _, top in request.logprobs[request.num_reported_tokens:]]
                        if request.params.logprobs is not None else None)
        request.num_reported_tokens = request.num_output_tokens
        if not request.finished:
            completion = CompletionOutput(request.sample_index, "", new, logprobs=new_logprobs,
                                          num_tokens=request.num_output_tokens, new_text=new_text)
            return RequestOutput(request.group_id, request.prompt, request.prompt_token_ids,
                                 [completion], False, None, new, request.error,
                                 prompt_logprobs=prompt_logprobs)
        text = ""
        try:
            text = self.decode(request)
        except Exception as error:     # its text alone is lost, not the engine
            request.error = request.error or f"decoding failed: {type(error).__name__}: {error}"
        detokenizer = self._detokenizers.get(request.request_id)
        if detokenizer is not None:      # the rest of the text after what was streamed
            new_text += detokenizer.finish(text)
        logprobs = ([top for _, top in request.logprobs] if request.params.logprobs is not None
                    else None)
        cumulative = sum(c for c, _ in request.logprobs) if request.logprobs else None
        completion = CompletionOutput(request.sample_index, text, list(request.output_token_ids),
                                      request.finish_reason, request.stop_reason, logprobs,
                                      cumulative, num_tokens=request.num_output_tokens,
                                      new_text=new_text)
        return RequestOutput(request.group_id, request.prompt, list(request.prompt_token_ids),
                             [completion], True, RequestMetrics.from_request(request), new,
                             request.error, prompt_logprobs=prompt_logprobs)


def _overlaps(config) -> bool:
    """Whether the engine overlaps its steps: asked for, and every feature in use can overlap (a
    fallback is said once, in a warning naming why)."""
    if config.async_scheduling and config.speculative_method is not None:
        log.warning("async_scheduling: running synchronous steps, since speculative decoding "
                    "(speculative_method=%r) plans each step from the tokens the last one "
                    "accepted, which an overlapped step does not know yet.",
                    config.speculative_method)
        return False
    return config.async_scheduling


def _eos_ids(path, tokenizer) -> set[int]:
    import json

    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        file = path / name
        if file.exists():
            value = json.loads(file.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [] if value is None else [value])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids

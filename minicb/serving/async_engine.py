"""AsyncLLMEngine: the engine's step loop runs in the background; each request gets a stream.

Serving differs from LLM.generate in three ways: requests arrive while others are decoding,
each token goes to its client as soon as it exists, and a client that leaves must give its KV
blocks back. So the step loop runs on its own, and every request gets an async iterator of
deltas (new token ids, new text, and at the end the finish reason and metrics).

Threading. A step is blocking work (milliseconds to seconds); it runs in a worker thread so
the event loop keeps accepting connections and sending tokens meanwhile. Everything that
touches the engine (adding, aborting, stepping, detokenising) runs inside that one call, one
call at a time: the engine never sees two threads, and an arrival or an abort is queued and
applied between two steps, never during one.

Tokenizers. A Hugging Face fast tokenizer must not be used from two threads at once: one call
that changes a setting (truncation, padding) while another encodes or decodes fails with
"Already borrowed". So there are two tokenizer objects, each with one owner:
  - the front end's copy (made here) is called only on the tokenizer thread, a one-thread
    executor: it tokenises prompts off the step (a long prompt must not stall everyone's
    tokens), renders chat templates (render_chat), decodes an echoed token-id prompt (decode),
    and builds the token-text table for log-probabilities (token_texts). The event loop never
    calls it; it reads only plain attributes (whether there is a chat template).
  - the engine's own is called only inside the step call (detokenising, stop strings), which
    runs one at a time.
No tokenizer object is ever called by two threads (tests/serving/test_tokenizer_threads.py
records the threads that call each one, through the HTTP server).

    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=path)))
    async for delta in engine.generate("def fib(n):", SamplingParams(max_tokens=16)):
        print(delta.text, end="")

Parallel sampling. A request with `SamplingParams(n=k)` runs as k samples, fanned out by the
engine itself (LLMEngine.add_request, as for LLM.generate). They share one stream, whose deltas
say which sample they belong to (`index`); it ends once every sample has finished, and aborting
the request aborts all of them.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from minicb.config import EngineConfig
from minicb.engine.inputs import ProcessedPrompt, Prompt
from minicb.engine.llm_engine import LLMEngine
from minicb.engine.outputs import RequestOutput
from minicb.kv.prefix import PrefixCacheStats
from minicb.metrics import RequestMetrics
from minicb.model.expert_load import expert_load_of
from minicb.params import SamplingParams
from minicb.serving.metrics import ServingStats
from minicb.serving.openai_logprobs import token_texts


class QueueFullError(RuntimeError):
    """Too many requests are waiting; the caller should come back later (HTTP 503)."""

    def __init__(self, num_waiting: int, max_queue_len: int, retry_after: float = 1.0):
        super().__init__(f"the server is overloaded: {num_waiting} requests are waiting "
                         f"(max_queue_len={max_queue_len}); retry in {retry_after:g} s.")
        self.retry_after = retry_after


@dataclass
class StreamDelta:
    """What one step added to one sample of a request (`index`: which of its n samples)."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False                # this sample finished
    finish_reason: str | None = None      # "stop" | "length" | "abort" | "error" once finished
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0            # this sample's
    metrics: RequestMetrics | None = None  # on the finished delta
    error: str | None = None
    index: int = 0
    # this delta's tokens' {token id: logprob} (SamplingParams.logprobs: the top-k and the chosen
    # token), and the prompt's with its token ids (prompt_logprobs, on a request's first delta and
    # its last; None for the prompt's first token); None unless asked
    logprobs: list[dict[int, float]] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None


class RequestStream:
    """One request's deltas (of all its n samples, interleaved), as an async iterator that ends
    after every sample's finished delta."""

    def __init__(self, request_id: str, n: int = 1):
        self.request_id = request_id
        self.n = n
        self.finished = False                 # the consumer has seen every sample finish
        self.unfinished = set(range(n))       # samples whose finished delta has not been put yet
        self._to_see = n
        self._queue: asyncio.Queue[StreamDelta] = asyncio.Queue()

    def put(self, delta: StreamDelta) -> None:
        if delta.finished:
            self.unfinished.discard(delta.index)
        self._queue.put_nowait(delta)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamDelta:
        if self.finished:
            raise StopAsyncIteration
        delta = await self._queue.get()
        if delta.finished:
            self._to_see -= 1
            self.finished = self._to_see == 0
        return delta


@dataclass
class _PendingAdd:
    request_id: str
    prompt: ProcessedPrompt             # checked and tokenised by the engine's front door
    priority: int
    arrival_time: float
    added: asyncio.Future = field(repr=False)


class AsyncLLMEngine:
    """Wraps an LLMEngine with a background step loop and per-request async streams.

    max_queue_len: how many requests may wait for admission; one more is refused with
    QueueFullError at once (a fast "come back later" beats a request that hangs).
    """

    def __init__(self, engine: LLMEngine, max_queue_len: int | None = None):
        self.engine = engine
        self.max_queue_len = max_queue_len
        self.stats = ServingStats(expert_load_of(engine))
        self._pending_adds: list[_PendingAdd] = []
        self._pending_aborts: set[str] = set()
        self._streams: dict[str, RequestStream] = {}
        engine.stream_text = True           # every output carries the text its step added
        # prompts are tokenised here, on one thread, with a tokenizer of their own
        self._tokenizer = copy.deepcopy(engine.tokenizer)
        self._tokenize_thread = ThreadPoolExecutor(1, thread_name_prefix="minicb-tokenize")
        self._token_texts: list[str] | None = None
        self._ids = itertools.count()
        self._validating = 0          # samples of requests being tokenised (they count as waiting)
        self._finish_times: deque[float] = deque(maxlen=1024)   # when recent samples finished
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._stopping = False

    # --- what the server reports ---------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        """Sequences waiting: every sample of a parallel-sampling request counts."""
        return (self._validating + sum(add.prompt.params.n for add in self._pending_adds)
                + self.engine.num_waiting)

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def has_tokenizer(self) -> bool:
        return self._tokenizer is not None

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer has a chat template (a plain attribute: no tokenizer call)."""
        return bool(getattr(self._tokenizer, "chat_template", None))

    @property
    def model_path(self) -> str:
        return self.engine.model_path

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    async def _on_tokenizer_thread(self, function, *args):
        """function(*args) on the front end's one tokenizer thread: the only thread that calls
        the front end's tokenizer."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_thread,
                                                                 function, *args)

    async def token_texts(self) -> list[str]:
        """Each token id's text, for log-probabilities: decoded once, on the tokenizer's thread."""
        if self._token_texts is None:
            self._token_texts = await self._on_tokenizer_thread(token_texts, self._tokenizer,
                                                                self.vocab_size)
        return self._token_texts

    async def render_chat(self, messages: list[dict]) -> str:
        """The chat template applied to `messages` (with the assistant's turn opened), on the
        tokenizer's thread. Whatever the template raises (it is the checkpoint's own Jinja
        code) comes through."""
        return await self._on_tokenizer_thread(functools.partial(
            self._tokenizer.apply_chat_template, messages, tokenize=False,
            add_generation_prompt=True))

    async def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """Token ids as text (an echoed token-id prompt), on the tokenizer's thread."""
        return await self._on_tokenizer_thread(functools.partial(
            self._tokenizer.decode, token_ids, skip_special_tokens=skip_special_tokens))

    def kv_usage(self) -> tuple[int, int, PrefixCacheStats]:
        """KV blocks in use, blocks free, and the prefix cache's counters."""
        kv = self.engine.kv
        return kv.num_used_blocks(), kv.num_free_blocks(), kv.prefix_stats()

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the step loop on the running event loop (idempotent)."""
        if self._loop_task is None or self._loop_task.done():
            self._stopping = False
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def shutdown(self) -> None:
        """Stop the loop after the step in flight; every open stream ends with "abort"."""
        if self._loop_task is None:
            return
        self._stopping = True
        self._wake.set()
        await self._loop_task
        self._loop_task = None

    # --- requests
    # ----------------------------------------------------------------------------------
    async def add_request(self, prompt: Prompt, params: SamplingParams,
                          request_id: str | None = None, priority: int = 0,
                          require_fit: bool = False) -> RequestStream:
        """Queue a request; return its stream once the engine accepted it.

        Raises ValueError (bad input, from the engine's checks) or QueueFullError (overload).
        `require_fit=True` refuses a request whose prompt + max_tokens exceeds max_model_len
        instead of cutting it short, as OpenAI-style servers do. `params.n > 1` runs n samples
        of the prompt; their deltas all come through the one stream returned.
        """
        self.start()
        if self.max_queue_len is not None and self.num_waiting >= self.max_queue_len:
            raise QueueFullError(self.num_waiting, self.max_queue_len, self.retry_after())
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use; ids must be unique.")
        # tokenise and check here, off the engine's thread: a long prompt never stalls the steps
        # (it holds its place in the queue meanwhile)
        self._validating += params.n
        try:
            processed = await self._on_tokenizer_thread(
                self.engine.processor.process, prompt, params, self._tokenizer, require_fit)
        finally:
            self._validating -= params.n
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use; ids must be unique.")
        stream = self._streams[request_id] = RequestStream(request_id, params.n)
        added = asyncio.get_running_loop().create_future()
        self._pending_adds.append(_PendingAdd(request_id, processed, priority, time.perf_counter(),
                                              added))
        self._wake.set()
        try:
            await added
        except asyncio.CancelledError:   # the caller went away while the request was queued
            self.abort(request_id)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Ask for the request (all its samples) to stop; its blocks are freed before the next
        step."""
        if request_id in self._streams and self._wake is not None:
            self._pending_aborts.add(request_id)
            self._wake.set()

    async def generate(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None,
                       priority: int = 0) -> AsyncIterator[StreamDelta]:
        """Add a request and yield its deltas. Closing the generator early (the consumer is
        cancelled, or leaves an `async with contextlib.aclosing(...)` block) aborts the request."""
        stream = await self.add_request(prompt, params, request_id, priority)
        try:
            async for delta in stream:
                yield delta
        finally:
            if not stream.finished:
                self.abort(stream.request_id)

    # --- the loop (event loop side) ------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            if not (self._pending_adds or self._pending_aborts
                    or self.engine.has_unfinished_requests()):
                self._wake.clear()
                await self._wake.wait()
                continue
            aborts, self._pending_aborts = self._pending_aborts, set()
            adds = [a for a in self._pending_adds if a.request_id not in aborts]
            for add in self._pending_adds:
                if add.request_id in aborts:       # never reached the engine: end it here
                    self._end_stream(add.request_id, "abort")
            self._pending_adds = []
            try:
                rejected, deltas = await asyncio.to_thread(self._engine_iteration, adds, aborts)
            # a fault inside a step: fail what is in flight, keep serving
            except Exception as error:
                self._fail_all(f"{type(error).__name__}: {error}", adds)
                continue
            for add in adds:
                error = rejected.get(add.request_id)
                if error is not None:
                    self._streams.pop(add.request_id, None)
                if add.added.done():       # its caller gave up meanwhile (and asked for an abort)
                    continue
                if error is None:
                    add.added.set_result(None)
                else:
                    add.added.set_exception(error)
            for delta in deltas:
                self._deliver(delta)
        await asyncio.to_thread(self._abort_everything)
        for request_id in list(self._streams):
            self._end_stream(request_id, "abort")

    def retry_after(self) -> float:
        """Seconds until the queue likely has room for one more: the requests over the limit
        over the rate at which requests finished in the last minute (1 to 60 s)."""
        now = time.perf_counter()
        while self._finish_times and now - self._finish_times[0] > 60:
            self._finish_times.popleft()
        if len(self._finish_times) < 2:
            return 1.0
        rate = len(self._finish_times) / max(now - self._finish_times[0], 1e-3)
        over = self.num_waiting - (self.max_queue_len or 0) + 1
        return min(60.0, max(1.0, over / rate))

    def _deliver(self, delta: StreamDelta) -> None:
        self.stats.generation_tokens += len(delta.token_ids)
        stream = self._streams.get(delta.request_id)
        if delta.finished:
            self._finish_times.append(time.perf_counter())
            # a request's prompt tokens count once, however many samples it has
            self.stats.on_finished(delta.metrics, delta.finish_reason,
                                   count_prompt=delta.index == 0)
        if stream is not None:
            stream.put(delta)
            if not stream.unfinished:
                self._streams.pop(delta.request_id, None)

    def _end_stream(self, request_id: str, reason: str, error: str | None = None) -> None:
        """End a stream from this side (not from an engine output): every sample still open gets
        a finished delta, and a waiting add is released."""
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            for index in sorted(stream.unfinished):
                stream.put(StreamDelta(request_id, [], "", True, reason, error=error, index=index))
        for add in self._pending_adds:
            if add.request_id == request_id and not add.added.done():
                add.added.set_result(None)

    def _fail_all(self, message: str, adds: list[_PendingAdd]) -> None:
        # the next iteration removes them from the engine
        self._pending_aborts.update(self._streams)
        for request_id in list(self._streams):
            self._end_stream(request_id, "error", message)
        for add in adds:   # their callers still wait for the add: hand them the ended stream
            if not add.added.done():
                add.added.set_result(None)

    # --- the worker call (everything that touches the engine) -----------------------------------
    def _engine_iteration(self, adds: list[_PendingAdd], aborts: set[str]
                          ) -> tuple[dict[str, ValueError], list[StreamDelta]]:
        rejected = {}
        for add in adds:
            try:
                self._add_to_engine(add)
            except ValueError as error:
                rejected[add.request_id] = error
            # whatever else one request trips over, it alone is refused
            except Exception as error:
                rejected[add.request_id] = ValueError(f"the request could not be added: "
                                                      f"{type(error).__name__}: {error}")
        for request_id in aborts:
            if self.engine.has_request(request_id):
                self.engine.abort(request_id)
        deltas = []
        # a step also runs right after an abort, even with nothing left: it reports the aborted
        # request (finish_reason "abort") and lets the engine forget it
        if self.engine.has_unfinished_requests() or aborts:
            deltas = [self._to_delta(output) for output in self.engine.step()]
        return rejected, deltas

    def _add_to_engine(self, add: _PendingAdd) -> None:
        """Add the request, checked already (the engine fans out its samples)."""
        self.engine.add_request(add.request_id, add.prompt, arrival_time=add.arrival_time,
                                priority=add.priority)

    @staticmethod
    def _to_delta(output: RequestOutput) -> StreamDelta:
        """The engine streams text (engine.stream_text): each output carries its step's text."""
        completion = output.outputs[0]
        logprobs = completion.logprobs
        if logprobs is not None and output.finished:     # a finished output carries them all
            logprobs = logprobs[len(logprobs) - len(output.new_token_ids):]
        prompt_logprobs = output.prompt_logprobs
        return StreamDelta(output.request_id, list(output.new_token_ids), completion.new_text,
                           output.finished, completion.finish_reason, len(output.prompt_token_ids),
                           completion.num_tokens, output.metrics, output.error, completion.index,
                           logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                           prompt_token_ids=None if prompt_logprobs is None
                           else list(output.prompt_token_ids))

    def _abort_everything(self) -> None:
        for request_id in self.engine.request_ids():
            self.engine.abort(request_id)
        if self.engine.has_unfinished_requests() or self.engine.request_ids():
            self.engine.step()

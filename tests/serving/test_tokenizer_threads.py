"""No tokenizer is used by two threads at once.

A Hugging Face fast tokenizer is a Rust object behind a borrow check: while one thread encodes
or decodes with it, another that changes a setting (truncation, padding; transformers does so on
every call when the tokenizer has truncation set) fails with "Already borrowed", and an error on
the engine's step would end every open stream. The async engine tokenises prompts on one thread
with a tokenizer of its own and detokenises only inside the step call.

`Borrowed` makes the hazard deterministic: it raises the same error whenever a second thread
enters it while another is inside (each call holds it for a moment, so overlaps happen), and it
records every thread that calls it: through the HTTP server too (chat templates, echoed token-id
prompts, log-probabilities' token texts), each tokenizer object is called by one thread.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serving_common import SIMPLE_CHAT_TEMPLATE, run, text_checkpoint

from minicb import LLM, EngineConfig, LLMEngine, SamplingParams
from minicb.serving.async_engine import AsyncLLMEngine
from minicb.serving.server import ServerThread, build_app


class Borrowed:
    """A tokenizer wrapper that fails like a Rust-backed one when two threads use it at once."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._inside = 0
        self.threads: set[int] = set()

    def _use(self, method: str, *args, **kwargs):
        if self._inside:
            raise RuntimeError("Already borrowed")
        self._inside += 1
        try:
            self.threads.add(threading.get_ident())
            time.sleep(0.0005)
            return getattr(self._tokenizer, method)(*args, **kwargs)
        finally:
            self._inside -= 1

    def __getattr__(self, name):
        """Every method call goes through _use (recorded, and refused if another thread is
        inside); plain attributes are read as they are."""
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._tokenizer, name)
        return functools.partial(self._use, name) if callable(value) else value


@pytest.fixture(scope="module")
def truncating_checkpoint(tiny_llama, tmp_path_factory) -> str:
    """The tiny model with a BPE tokenizer whose tokenizer.json sets truncation."""
    path = Path(text_checkpoint(tiny_llama, tmp_path_factory.mktemp("truncating")))
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 64, "strategy": "LongestFirst",
                          "stride": 0}
    (path / "tokenizer.json").write_text(json.dumps(spec))
    return str(path)


PROMPTS = [("for index in range(10):\n    print(index)\n" * (3 + i)) for i in range(6)]
STOPS = [["e"], ["in"], [")"], ["pr", "x"], ["\n\n"], ["="]]


def params(index: int) -> SamplingParams:
    return SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=STOPS[index])


def test_concurrent_long_prompts_with_stops_stream_what_generate_returns(truncating_checkpoint):
    engine = LLMEngine(EngineConfig(model=truncating_checkpoint, max_model_len=256))
    assert engine.tokenizer.backend_tokenizer.truncation is not None   # the hazard is armed
    async_engine = AsyncLLMEngine(engine)      # copies the tokenizer for its front end
    engine.tokenizer = Borrowed(engine.tokenizer)
    async_engine._tokenizer = Borrowed(async_engine._tokenizer)

    async def stream(index: int):
        deltas = [d async for d in async_engine.generate(PROMPTS[index], params(index))]
        return deltas

    async def everyone():
        try:
            return await asyncio.gather(*(stream(i) for i in range(len(PROMPTS))))
        finally:
            await async_engine.shutdown()

    streamed = run(everyone())
    twins = LLM(truncating_checkpoint, max_model_len=256).generate(
        PROMPTS, [params(i) for i in range(len(PROMPTS))], use_tqdm=False)
    stopped = 0
    for deltas, twin in zip(streamed, twins):
        assert all(d.error is None for d in deltas), [d.error for d in deltas]
        completion = twin.outputs[0]
        assert "".join(d.text for d in deltas) == completion.text
        assert [t for d in deltas for t in d.token_ids] == completion.token_ids
        assert deltas[-1].finish_reason == completion.finish_reason
        stopped += completion.finish_reason == "stop"
    assert stopped >= 2, "the stop strings must really end some requests"
    # the front end's tokenizer stayed on its one thread; the steps' did the detokenising
    assert len(async_engine._tokenizer.threads) == 1 and engine.tokenizer.threads


def test_one_tokenizer_shared_by_two_threads_is_the_error_guarded_against(truncating_checkpoint):
    """The arrangement the async engine avoids: prompts tokenised on one thread while the step
    thread detokenises, with one tokenizer between them. It fails."""
    engine = LLMEngine(EngineConfig(model=truncating_checkpoint, max_model_len=256))
    shared = engine.tokenizer = Borrowed(engine.tokenizer)
    errors: list[str] = []
    deadline = time.monotonic() + 5

    def tokenise():
        while time.monotonic() < deadline and not errors:
            try:
                engine.processor.process(PROMPTS[-1], params(0), shared)
            except RuntimeError as error:
                errors.append(str(error))

    ids = engine.processor.process(PROMPTS[0], params(0), shared).prompt_token_ids
    thread = threading.Thread(target=tokenise)
    thread.start()
    while time.monotonic() < deadline and not errors:
        try:
            shared.decode(ids)
        except RuntimeError as error:
            errors.append(str(error))
    thread.join()
    assert errors and "Already borrowed" in errors[0]


def test_through_the_server_each_tokenizer_is_called_by_one_thread(truncating_checkpoint):
    """Chats (the template rendered), echoed token-id prompts (decoded), log-probabilities (the
    token-text table) and stop strings, all at once: the front end's tokenizer is called on one
    thread, never the event loop's, and the engine's only where the steps run."""
    path = Path(truncating_checkpoint)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(config | {
        "chat_template": SIMPLE_CHAT_TEMPLATE}))
    engine = LLMEngine(EngineConfig(model=str(path), max_model_len=256, max_num_seqs=8))
    async_engine = AsyncLLMEngine(engine)
    engine.tokenizer = steps = Borrowed(engine.tokenizer)
    async_engine._tokenizer = front = Borrowed(async_engine._tokenizer)
    base = {"model": "m", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    bodies = [("chat/completions", base | {"messages": [{"role": "user", "content": PROMPTS[i]}],
                                           "stop": STOPS[i]}) for i in range(3)]
    bodies += [("completions", base | {"prompt": [5, 6, 7 + i], "echo": True, "logprobs": 2})
               for i in range(3)]
    with ServerThread(build_app(engine=async_engine, served_model_name="m")) as server:
        loop_thread = server.thread.ident

        def post(item):
            endpoint, body = item
            return httpx.post(f"{server.url}/v1/{endpoint}", json=body, timeout=60)

        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(post, bodies))
    assert [a.status_code for a in answers] == [200] * len(bodies), [a.text for a in answers]
    echoed = answers[3].json()["choices"][0]
    assert echoed["text"].startswith(front._tokenizer.decode([5, 6, 7]))
    assert echoed["logprobs"]["tokens"]
    assert len(front.threads) == 1 and loop_thread not in front.threads, front.threads
    assert steps.threads and not steps.threads & front.threads

"""LLM: the offline entry point, `LLM(...).generate(prompts, params)` as in vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tqdm.auto import tqdm

from minicb.config import EngineConfig
from minicb.engine.inputs import Prompt
from minicb.engine.llm_engine import LLMEngine
from minicb.engine.outputs import RequestOutput
from minicb.metrics import StepTotals
from minicb.params import SamplingParams


class LLM:
    """Load a model and serve a list of prompts through one engine.

    >>> llm = LLM(scheduler="continuous", kv_cache="paged")          # the shipped default model
    >>> out = llm.generate(["def fib(n):"], SamplingParams(max_tokens=32, temperature=0))
    """

    def __init__(self, model: str | None = None, **knobs):
        self.llm_engine = LLMEngine(EngineConfig(model=model, **knobs))
        self._counter = 0

    @property
    def tokenizer(self):
        return self.llm_engine.tokenizer

    @property
    def step_stats(self) -> StepTotals:
        """The engine's per-step counts since it started (or its last `reset()`):
        `llm.step_stats.summary()` gives slot utilisation, padding waste and KV utilisation."""
        return self.llm_engine.step_stats

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the prompts' order.

        Every prompt is validated before any is queued, so one bad prompt raises a ValueError
        naming it and nothing runs.
        """
        engine = self.llm_engine
        processed = engine.processor.process_batch(prompts, sampling_params, priority)

        request_ids: list[str] = []
        finished: dict[str, list[RequestOutput]] = {}
        try:
            for index, prompt in enumerate(processed):
                request_id = str(self._counter)
                self._counter += 1
                engine.add_request(request_id, prompt, priority=priority[index] if priority else 0,
                                   stream=False)
                request_ids.append(request_id)
                finished[request_id] = []
            total = sum(prompt.params.n for prompt in processed)
            with tqdm(total=total, desc="requests", disable=not use_tqdm) as bar:
                while engine.has_unfinished_requests():
                    for output in engine.step():
                        if output.finished and output.request_id in finished:
                            finished[output.request_id].append(output)
                            bar.update(1)
        except BaseException:
            self._clear(request_ids)      # nothing of a failed call stays behind
            raise
        results = []
        for request_id in request_ids:
            samples = sorted(finished[request_id], key=lambda output: output.outputs[0].index)
            results.append(replace(samples[0], outputs=[sample.outputs[0] for sample in samples]))
        return results

    def _clear(self, request_ids: list[str]) -> None:
        """Abort this call's requests and let the engine report them, so their blocks are free
        and the next generate() starts clean."""
        engine = self.llm_engine
        for request_id in request_ids:
            if engine.has_request(request_id):
                engine.abort(request_id)
        try:
            while any(engine.has_request(request_id) for request_id in request_ids):
                engine.step()
        except Exception:     # the engine cannot even step: drop what is left of this call
            for request_id in request_ids:
                engine.discard(request_id)

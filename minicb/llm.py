"""LLM: the offline entry point, `LLM(...).generate(prompts, params)` as in vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tqdm.auto import tqdm

from minicb.config import EngineConfig
from minicb.engine import LLMEngine, Prompt
from minicb.metrics import StepTotals
from minicb.outputs import RequestOutput
from minicb.sampling import SamplingParams


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
                 use_tqdm: bool = True, priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the prompts' order.

        Every prompt is validated before any is queued, so one bad prompt raises a ValueError
        naming it and nothing runs.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params if sampling_params is not None else SamplingParams()
        params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts; "
                             "pass one for all or one per prompt.")
        engine = self.llm_engine
        for index, (prompt, p) in enumerate(zip(prompts, params_list)):
            try:
                engine.validate(prompt, p)
            except ValueError as error:
                raise ValueError(f"prompt {index}: {error}") from None

        groups: list[list[str]] = []
        for index, (prompt, p) in enumerate(zip(prompts, params_list)):
            ids = []
            for sample in range(p.n):
                request_id = f"{self._counter}"
                self._counter += 1
                # each of n samples is its own request with its own seed stream; the samples
                # after the first fork it, sharing the prompt's KV blocks
                seed = None if p.seed is None else p.seed + sample
                engine.add_request(request_id, prompt, replace(p, n=1, seed=seed),
                                   priority=priority[index] if priority else 0,
                                   fork_of=ids[0] if ids else None)
                ids.append(request_id)
            groups.append(ids)

        final: dict[str, RequestOutput] = {}
        total = sum(len(g) for g in groups)
        with tqdm(total=total, desc="requests", disable=not use_tqdm) as bar:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        final[output.request_id] = output
                        bar.update(1)
        results = []
        for ids in groups:
            first = final[ids[0]]
            completions = []
            for sample, request_id in enumerate(ids):
                completion = final[request_id].outputs[0]
                completion.index = sample
                completions.append(completion)
            results.append(replace(first, outputs=completions))
        return results

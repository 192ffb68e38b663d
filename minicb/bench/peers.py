"""The peers minicb is measured against: three ways transformers serves a list of prompts.

- `generate`, one request at a time: what a first script does.
- `generate` in padded static batches: left padding and an attention mask; a batch runs to its
  longest member, and shorter members are cut to their own length afterwards (the tokens computed
  past that point are exactly static batching's waste).
- `generate_batch`'s engine: transformers' own continuous batching over a paged cache. Its
  `generate_batch` gives every prompt the same max_new_tokens, so requests are submitted through
  the same manager it uses (`continuous_batching_context_manager` + `add_request`), one
  max_new_tokens each.

Every peer decodes greedily with end-of-sequence switched off, so each request produces exactly
its workload's output length, like minicb's `ignore_eos=True`. Token timestamps are taken as the
tokens appear, so TTFT and TPOT mean the same thing for every system.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from minicb.metrics import RequestMetrics


@dataclass
class SystemRun:
    """What one system produced for the workload, in the workload's order."""

    outputs: list[list[int]]
    metrics: list[RequestMetrics]
    settings: dict = field(default_factory=dict)
    # CPU time of this process (all threads) while serving: on a machine shared with other work,
    # wall-clock time depends on the neighbours, CPU time much less
    cpu_seconds: float = 0.0


def request_metrics(arrival: float, token_times: list[float], finished: float,
                    prompt_len: int) -> RequestMetrics:
    """minicb's RequestMetrics for a request served elsewhere (wall clock only, no engine steps)."""
    return RequestMetrics(arrival, arrival, token_times[0] if token_times else None,
                          token_times[-1] if token_times else None, finished, list(token_times),
                          0, None, None, None, [], prompt_len, len(token_times))


class TokenClock(StoppingCriteria):
    """Never stops anything: notes the time each time `generate` appends a token to the batch."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def greedy_config(max_new_tokens: int, pad_token_id: int) -> GenerationConfig:
    # no end-of-sequence ids: the model's end-of-text is an ordinary token, as with ignore_eos (None
    # would
    # mean "unset" and bring back the checkpoint's own eos_token_id)
    return GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=[],
                            pad_token_id=pad_token_id)


def _check_length(name: str, index: int, tokens: list[int], wanted: int) -> None:
    if len(tokens) != wanted:
        raise RuntimeError(f"{name} returned {len(tokens)} tokens for request {index}, not "
                           f"{wanted}: it stopped early, so the systems would not be doing the "
                           "same work.")


def external_run(peer: str, result: dict, prompts: list[list[int]], output_lens: list[int],
                 settings: dict) -> SystemRun:
    """What a peer's driver produced in its own environment (every request's tokens and token
    times, `arrival`, `finished`, optionally `cpu_seconds`) as a SystemRun, refused unless every
    request has exactly its output length."""
    outputs, token_times = result["outputs"], result["token_times"]
    if len(outputs) != len(prompts) or any(o is None for o in outputs):
        missing = [i for i, o in enumerate(outputs) if o is None]
        raise RuntimeError(f"{peer} finished {len(prompts) - len(missing)} of {len(prompts)} "
                           f"requests (missing {missing[:5]}).")
    for index, (tokens, wanted) in enumerate(zip(outputs, output_lens)):
        _check_length(peer, index, tokens, wanted)
    metrics = [request_metrics(result["arrival"], times, finished, len(prompt))
               for times, finished, prompt in zip(token_times, result["finished"], prompts)]
    return SystemRun(outputs, metrics, settings, cpu_seconds=result.get("cpu_seconds", math.nan))


# variables that would point a peer's python at another environment's packages
FOREIGN_PYTHON_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")


def peer_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """A peer driver's environment: this one (or `base`) without what would mix minicb's
    environment into the peer's."""
    return {k: v for k, v in (os.environ if base is None else base).items()
            if k not in FOREIGN_PYTHON_VARS}


def run_driver(peer: str, command: Callable[[Path, Path], list[str]], request: dict,
               env: dict[str, str], timeout: float) -> dict:
    """Run a peer's driver, `command(request_file, result_file)`, on `request`; return its
    result, or raise with the end of what it printed."""
    with tempfile.TemporaryDirectory(prefix="minicb-peer-") as work:
        request_file, result_file = Path(work) / "request.json", Path(work) / "result.json"
        request_file.write_text(json.dumps(request))
        done = subprocess.run(command(request_file, result_file),
                              capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0 or not result_file.exists():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise RuntimeError(f"{peer}'s run failed (exit {done.returncode}):\n{tail}")
        return json.loads(result_file.read_text())


def hf_one_at_a_time(model, prompts: list[list[int]], output_lens: list[int], pad_token_id: int,
                     on_done: Callable[[int], None] = lambda n: None) -> SystemRun:
    device = model.device
    outputs, metrics = [], []
    start, cpu_start = time.perf_counter(), time.process_time()
    for index, (prompt, n) in enumerate(zip(prompts, output_lens)):
        clock = TokenClock()
        ids = torch.tensor([prompt], device=device)
        generated = model.generate(ids, attention_mask=torch.ones_like(ids),
                                   generation_config=greedy_config(n, pad_token_id),
                                   stopping_criteria=StoppingCriteriaList([clock]))
        finished = time.perf_counter()
        tokens = generated[0, len(prompt):].tolist()
        _check_length("generate", index, tokens, n)
        outputs.append(tokens)
        metrics.append(request_metrics(start, clock.times, finished, len(prompt)))
        on_done(1)
    settings = {"api": "model.generate, batch of one",
                "attn_implementation": model.config._attn_implementation}
    return SystemRun(outputs, metrics, settings, time.process_time() - cpu_start)


def hf_static_batches(model, prompts: list[list[int]], output_lens: list[int], pad_token_id: int,
                      batch_size: int,
                      on_done: Callable[[int], None] = lambda n: None) -> SystemRun:
    """Batches of `batch_size` requests in arrival order, each run to its longest member."""
    device = model.device
    outputs: list[list[int]] = []
    metrics: list[RequestMetrics] = []
    computed = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for first in range(0, len(prompts), batch_size):
        batch, lens = prompts[first:first + batch_size], output_lens[first:first + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        clock = TokenClock()
        generated = model.generate(ids, attention_mask=mask,
                                   generation_config=greedy_config(max(lens), pad_token_id),
                                   stopping_criteria=StoppingCriteriaList([clock]))
        finished = time.perf_counter()   # generate hands back the whole batch at once
        computed += len(batch) * max(lens)
        for row, (prompt, n) in enumerate(zip(batch, lens)):
            tokens = generated[row, width:width + n].tolist()
            _check_length("generate (static batch)", first + row, tokens, n)
            outputs.append(tokens)
            metrics.append(request_metrics(start, clock.times[:n], finished, len(prompt)))
        on_done(len(batch))
    return SystemRun(outputs, metrics, {
        "api": "model.generate, left-padded batches with attention_mask", "batch_size": batch_size,
        "decode_rows_computed": computed, "attn_implementation": model.config._attn_implementation},
                     time.process_time() - cpu_start)


def hf_continuous(model, prompts: list[list[int]], output_lens: list[int], pad_token_id: int,
                  max_requests: int, max_batch_tokens: int, kv_tokens: int, page_size: int = 256,
                  on_done: Callable[[int], None] = lambda n: None) -> SystemRun:
    """transformers' continuous batching (the engine behind `generate_batch`), with the same
    request slots and KV capacity (in tokens) as minicb and its own per-step token budget."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    num_blocks = max(-(-kv_tokens // page_size), 1)
    config = ContinuousBatchingConfig(page_size=page_size, num_blocks=num_blocks,
                                      max_batch_tokens=max_batch_tokens,
                                      max_requests_per_batch=max_requests,
                                      # minicb runs without prefix caching too
                                      allow_block_sharing=False)
    hints = WorkloadHints(max_prompt_length=max(len(p) for p in prompts),
                          max_generated_length=max(output_lens), num_requests=len(prompts))
    generation = greedy_config(max(output_lens), pad_token_id)
    generation.eos_token_id = -1   # the manager's way of saying "no end-of-sequence token"
    results = {}
    with model.continuous_batching_context_manager(generation_config=generation,
                                                   continuous_batching_config=config,
                                                   workload_hints=hints, block=True,
                                                   timeout=5) as manager:
        attention = model.config._attn_implementation
        start, cpu_start = time.perf_counter(), time.process_time()
        for index, (prompt, n) in enumerate(zip(prompts, output_lens)):
            manager.add_request(prompt, request_id=str(index), max_new_tokens=n,
                                record_timestamps=True, eos_token_id=-1)
        while len(results) < len(prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                results[result.request_id] = (result, time.perf_counter())
                on_done(1)
            elif result is None and not manager.is_running():
                raise RuntimeError(f"transformers' continuous batching stopped with {len(results)} "
                                   f"of {len(prompts)} requests done; see its log above.")
        cpu_seconds = time.process_time() - cpu_start
    outputs, metrics = [], []
    for index, prompt in enumerate(prompts):
        result, received = results[str(index)]
        if result.error is not None:
            raise RuntimeError(f"transformers' continuous batching failed request {index}: "
                               f"{result.error}")
        tokens = list(result.generated_tokens)
        _check_length("generate_batch", index, tokens, output_lens[index])
        outputs.append(tokens)
        metrics.append(request_metrics(start, list(result.timestamps), received, len(prompt)))
    settings = {
        "api": "model.continuous_batching_context_manager + add_request (generate_batch's engine)",
        "attn_implementation": attention, "page_size": page_size, "num_blocks": config.num_blocks,
        "max_batch_tokens": max_batch_tokens, "max_requests_per_batch": max_requests,
        "allow_block_sharing": False}
    return SystemRun(outputs, metrics, settings, cpu_seconds)

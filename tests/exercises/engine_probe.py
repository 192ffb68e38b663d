"""Watch the real engine work, so an exercise can be checked against what minicb itself does.

`record_packed_steps` wraps the engine's ModelRunner.prepare: every step's plan (which tokens of
which request, its block table) and the packed tensors the runner built from it are kept, taken
at the moment the runner saw them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from minicb import LLM, CompletionOutput, SamplingParams
from minicb.model.attention import AttentionMetadata
from minicb.sim.workload import fixed

_probe_ids = itertools.count()


@dataclass
class PackedRow:
    request_id: str
    num_cached: int          # tokens of the request already in the cache before this step
    token_ids: list[int]     # the real tokens this row computes (no padding)
    num_pad: int
    block_table: list[int]
    ghost: bool


@dataclass
class PackedStep:
    rows: list[PackedRow]
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor


def record_packed_steps(llm: LLM) -> list[PackedStep]:
    """From now on, append every step the engine runs to the returned list."""
    engine = llm.llm_engine
    prepare = engine.runner.prepare
    steps: list[PackedStep] = []

    def recording_prepare(plan):
        packed = prepare(plan)
        rows = []
        for seq in plan.seqs:
            request = seq.request
            start = request.num_computed_tokens
            tokens = [] if seq.ghost else request.all_token_ids[start:start + seq.num_tokens]
            rows.append(PackedRow(request.request_id, start, tokens, seq.num_pad,
                                  list(engine.kv.block_table(request)), seq.ghost))
        steps.append(PackedStep(rows, *packed[:4]))   # (the tensors and the metadata)
        return packed

    engine.runner.prepare = recording_prepare
    return steps


def greedy(max_tokens: int) -> SamplingParams:
    """Exactly max_tokens greedy tokens, with the top-5 logprobs that reference.compare reads."""
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=5)


def generate_ids(llm: LLM, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """Greedy outputs of the engine, exactly max_tokens each, in the prompts' order."""
    return [completion.token_ids for completion in generate_completions(llm, prompts, max_tokens)]


def generate_completions(llm: LLM, prompts: list[list[int]],
                         max_tokens: list[int]) -> list[CompletionOutput]:
    """LLM.generate's loop with a step limit: code under test that stalls fails, never hangs."""
    engine = llm.llm_engine
    request_ids = [f"probe-{next(_probe_ids)}" for _ in prompts]
    for request_id, prompt, count in zip(request_ids, prompts, max_tokens):
        engine.add_request(request_id, prompt, greedy(count))
    max_steps = 4 * (sum(map(len, prompts)) + sum(max_tokens)) + 50
    finished: dict[str, CompletionOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0]
    if engine.has_unfinished_requests():
        waiting, running = engine.num_waiting, engine.num_running
        for request_id in request_ids:
            engine.abort(request_id)
        raise AssertionError(
            f"no progress after {max_steps} steps: {len(finished)} of {len(prompts)} requests "
            f"finished, {waiting} still waiting and {running} running. Check that admitted "
            "requests leave the waiting queue and that every step schedules some work.")
    return [finished[request_id] for request_id in request_ids]


def random_prompts(lengths: list[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Seeded random prompts of these lengths (minicb.sim.workload's, so every test draws alike)."""
    return fixed("prompts", lengths, [1] * len(lengths)).prompt_token_ids(vocab_size, seed)

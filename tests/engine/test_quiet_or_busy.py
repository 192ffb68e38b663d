"""A textbook's outputs must not depend on what else the reader's machine is doing.

The thread policy (minicb/runner/threads.py) changes torch's thread count between steps when other
programs load the machine. It may change how many threads run a step, never which arithmetic
runs it: the path a decode step takes (the fused C layer or the torch modules, which differ in
the last bits) is fixed by the plan's shape and the engine's configuration.
"""

from __future__ import annotations

import itertools

import torch

from minicb import LLM, SamplingParams

ROWS = 40      # more than 32 rows per thread with one thread, fewer with two


def serve(busy: bool) -> list:
    """A greedy workload of ROWS requests at once on the shipped model; with `busy`, a neighbour
    comes and goes, and the policy alternates between one and two threads at every step."""
    llm = LLM(max_num_seqs=ROWS, max_model_len=64, cpu_threads=2)
    engine = llm.llm_engine
    if busy:
        counts = itertools.cycle([1, 2])

        def before_step() -> int:
            threads = next(counts)
            torch.set_num_threads(threads)
            return threads

        engine.threads.before_step = before_step
    prompts = [[(7 * i + 3 * j) % 500 + 3 for j in range(6 + i % 5)] for i in range(ROWS)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=3)
    before = torch.get_num_threads()
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        torch.set_num_threads(before)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


def test_a_busy_neighbour_changes_no_output():
    quiet, busy = serve(busy=False), serve(busy=True)
    assert [tokens for tokens, _ in busy] == [tokens for tokens, _ in quiet]
    # the logprobs bit for bit: a different path would differ in the last bits even where the
    # greedy tokens happen to agree
    assert [logprobs for _, logprobs in busy] == [logprobs for _, logprobs in quiet]

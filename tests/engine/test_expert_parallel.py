"""Expert parallelism on a CPU (gloo): a mixture of experts over two processes, each holding half
of every sparse layer's experts (attention tensor-parallel over the same two), gives the tokens
of the one-process engine, with every KV block back.

The experts' exchange is exact (each (token, slot) pair's output comes from one rank, zeros from
the other); what the two runs may differ by is the tensor-parallel attention's sum in two halves,
float32 rounding, within the tolerance below, as in test_tensor_parallel.py.
"""

from __future__ import annotations

import gc
import random
from pathlib import Path

import pytest

from minicb import LLM, SamplingParams

LOGPROB_TOLERANCE = 1e-4
COMMON = dict(attention="torch", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64,
              block_size=8)


def run(llm: LLM, seed: int = 0) -> list:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randint(1, 40))] for _ in range(6)]
    params = [SamplingParams(max_tokens=rng.randint(1, 12), temperature=0, ignore_eos=True,
                             logprobs=5) for _ in prompts]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    kv = llm.llm_engine.kv
    assert kv.num_free_blocks() == kv.num_blocks, "KV blocks leaked after every request ended"
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


def test_two_expert_parallel_ranks_equal_one(tiny_many_experts):
    """32 experts (16 a rank), a dense middle layer (tensor-parallel) and a shared expert (whole
    on both ranks): every part the split touches, in one pair of engines. The split does not
    depend on the family's router rule (each family's rule is proved in test_moe_parity.py), so
    one family is enough here; each further one would cost two more processes."""
    path = tiny_many_experts
    one = run(LLM(path, **COMMON))
    split = LLM(path, tensor_parallel_size=2, **COMMON)
    workers = split.llm_engine.runner.workers.processes
    try:
        block = next(layer.mlp for layer in split.llm_engine.model.model.layers
                     if hasattr(layer.mlp, "split_experts"))
        assert block.w_down.shape[0] == block.moe.num_experts // 2, "each rank holds half"
        two = run(split)
    finally:
        split.llm_engine.runner.shutdown()
    del split
    gc.collect()
    assert not any(p.is_alive() for p in workers)
    for (ids1, lp1), (ids2, lp2) in zip(one, two, strict=True):
        assert ids1 == ids2
        for top1, top2 in zip(lp1, lp2):
            assert max(abs(top1[t] - top2[t]) for t in top1.keys() & top2.keys()) \
                < LOGPROB_TOLERANCE


def test_experts_that_do_not_split_evenly_are_refused(tiny_qwen3_moe):
    from minicb.model.loader import load_model
    from minicb.model.parallel_layers import check_split

    model = load_model(Path(tiny_qwen3_moe), attention="torch")
    with pytest.raises(ValueError, match="cannot split the 8 experts evenly"):
        check_split(model, 3)

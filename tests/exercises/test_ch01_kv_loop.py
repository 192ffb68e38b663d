"""Chapter 01: the prefill + decode loop with a KV cache, graded against minicb and transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from adapter import chapter, run_docstring_examples
from engine_probe import generate_ids, random_prompts, record_packed_steps
from reference import hf_greedy

from minicb import LLM
from minicb.model.loader import load_model

ch01 = chapter("01")


@pytest.fixture(scope="module")
def llama(tiny_llama):
    return load_model(Path(tiny_llama))


def test_ch01_worked_examples():
    run_docstring_examples(ch01)


def test_ch01_kv_cache_holds_kv_heads_per_layer(llama):
    args = llama.args
    cache = ch01.allocate_kv_cache(args, max_tokens=21, block_size=8)
    expected = (3, 8, args.num_kv_heads, args.head_dim)
    assert len(cache) == args.num_layers, \
        f"expected one (k, v) pair per layer ({args.num_layers}), got {len(cache)}"
    for layer, (k, v) in enumerate(cache):
        assert tuple(k.shape) == expected and tuple(v.shape) == expected, (
            f"layer {layer}: expected k and v of shape {expected} = [ceil(21 / 8) blocks, "
            f"block_size, "
            f"num_kv_heads, head_dim], got {tuple(k.shape)} and {tuple(v.shape)}. Hint: GQA keeps "
            f"{args.num_kv_heads} KV heads for {args.num_heads} query heads.")
        assert not k.any() and not v.any() and k.data_ptr() != v.data_ptr(), \
            f"layer {layer}: k and v must be two separate tensors of zeros"


def test_ch01_pack_step_matches_the_engine(tiny_llama):
    """A prefill and decodes of one request: the tensors the engine's own runner packs."""
    llm = LLM(tiny_llama, max_num_seqs=1, block_size=4)
    steps = record_packed_steps(llm)
    generate_ids(llm, random_prompts([6], 512, seed=1), [5])
    assert len(steps) == 5
    for number, step in enumerate(steps, start=1):
        row = step.rows[0]
        assert row.block_table == list(range(len(row.block_table))), \
            f"the exercise assumes a fresh pool hands out blocks 0, 1, ...; " \
            f"the engine used {row.block_table}"
        input_ids, positions, meta = ch01.pack_step(row.token_ids, row.num_cached, block_size=4)
        kind = "prefill" if number == 1 else "decode"
        where = f"step {number} ({kind}: {len(row.token_ids)} token(s) " \
                f"after {row.num_cached} cached)"
        for name, got, expected in [
            ("input_ids", input_ids, step.input_ids), ("positions", positions, step.positions),
            ("slot_mapping", meta.slot_mapping, step.meta.slot_mapping),
            ("cu_seqlens_q", meta.cu_seqlens_q, step.meta.cu_seqlens_q),
            ("seq_lens", meta.seq_lens, step.meta.seq_lens),
            ("block_tables", meta.block_tables, step.meta.block_tables),
        ]:
            assert got.dtype == expected.dtype and got.tolist() == expected.tolist(), (
                f"{where}: {name} should be {expected.tolist()} ({expected.dtype}), got "
                f"{got.tolist()} "
                f"({got.dtype}). See the contract in pack_step's docstring.")
        assert (meta.max_seqlen_q, meta.max_seqlen_k) == (step.meta.max_seqlen_q,
                                                          step.meta.max_seqlen_k), (
            f"{where}: max_seqlen_q, max_seqlen_k should be {step.meta.max_seqlen_q}, "
            f"{step.meta.max_seqlen_k}, got {meta.max_seqlen_q}, {meta.max_seqlen_k}")


def test_ch01_greedy_generate_equals_transformers(tiny_model):
    model = load_model(Path(tiny_model))
    prompts, lengths = random_prompts([5, 19], 512, seed=2), [9, 6]
    got = [ch01.greedy_generate(model, prompt, n, block_size=4)
           for prompt, n in zip(prompts, lengths)]
    expected = [reference.token_ids for reference in hf_greedy(tiny_model, prompts, lengths)]
    for index, (g, e) in enumerate(zip(got, expected)):
        assert g == e, (f"prompt {index}: transformers' greedy generate gives {e}, yours gave {g}. "
                        "Hint: check the positions and that every call writes its tokens to the "
                        "cache.")


def test_ch01_decode_feeds_only_the_newest_token(llama):
    calls: list[int] = []
    forward = llama.forward

    def counting_forward(input_ids, *args, **kwargs):
        calls.append(int(input_ids.shape[0]))
        return forward(input_ids, *args, **kwargs)

    llama.forward = counting_forward
    try:
        ch01.greedy_generate(llama, random_prompts([7], 512, seed=3)[0], 5, block_size=4)
    finally:
        del llama.forward
    expected = [7, 1, 1, 1, 1]
    assert calls == expected, (f"expected model calls with {expected} input tokens (one prefill of "
                               "the prompt, then one token per decode: the cache holds the rest), "
                               f"got {calls}.")


def test_ch01_decode_reads_the_cache(llama):
    """The same decode with an emptied cache must change the answer: the cache is really read."""
    prompt = random_prompts([8], 512, seed=4)[0]
    cache = ch01.allocate_kv_cache(llama.args, 16, block_size=4)
    ids, positions, meta = ch01.pack_step(prompt, 0, block_size=4)
    first = int(llama(ids, positions, cache, meta, torch.tensor([7]))[0].argmax())
    ids, positions, meta = ch01.pack_step([first], 8, block_size=4)
    with_cache = llama(ids, positions, cache, meta, torch.tensor([0]))
    empty = ch01.allocate_kv_cache(llama.args, 16, block_size=4)
    without = llama(ids, positions, empty, meta, torch.tensor([0]))
    assert not torch.allclose(with_cache, without), \
        "a decode after the prefill gave the same logits as one over an empty cache: " \
        "the prefill's K/V never reached the slots the decode reads. Check slot_mapping and " \
        "block_tables."

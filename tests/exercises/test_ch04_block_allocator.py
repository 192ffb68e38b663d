"""Chapter 04: the block allocator and slot mapping, plugged into minicb's paged KV cache."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from adapter import chapter, must_raise, run_docstring_examples
from engine_probe import generate_ids, greedy, random_prompts, record_packed_steps
from reference import compare, hf_greedy

from minicb import LLM
from minicb.kv.blocks import BlockAllocator as MinicbAllocator

ch04 = chapter("04")


def test_ch04_worked_examples():
    run_docstring_examples(ch04)


def test_ch04_allocator_never_double_allocates():
    allocator = ch04.BlockAllocator(6)
    taken = [allocator.allocate() for _ in range(6)]
    assert sorted(taken) == list(range(6)), \
        f"6 allocations from a pool of 6 should hand out each block 0-5 once, got {taken}"
    assert allocator.num_free() == 0, ("all 6 blocks are taken, yet num_free() = "
                                       f"{allocator.num_free()}")
    with must_raise(RuntimeError, "allocate() on a pool with no free block"):
        allocator.allocate()
    for block in taken[:3]:
        assert allocator.release(block), f"block {block} had one holder: release should return True"
        allocator.push_free(block)
    again = [allocator.allocate() for _ in range(3)]
    assert sorted(again) == sorted(taken[:3]), \
        f"after freeing {taken[:3]}, the next three allocations should reuse exactly them, got " \
        f"{again}"


def test_ch04_allocator_refuses_misuse():
    allocator = ch04.BlockAllocator(3)
    block = allocator.allocate()
    with must_raise(RuntimeError, "share(2) of a block never allocated"):
        allocator.share(2)              # never allocated: sharing it would resurrect a free block
    assert allocator.release(block) is True
    with must_raise(RuntimeError, f"a second release({block}) of a block with no holder"):
        allocator.release(block)        # a second release of a block with no holder left


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ch04_allocator_behaves_like_minicbs(seed):
    """A random run of allocate/share/release/push_free, side by side with minicb's allocator."""
    rng = random.Random(seed)
    yours, minicb = ch04.BlockAllocator(8), MinicbAllocator(8)
    live: list[int] = []        # one entry per reference held
    history: list[str] = []
    for _ in range(300):
        move = rng.choice(["allocate", "allocate", "share", "release", "release"])
        if move == "allocate":
            if minicb.num_free() == 0:
                history.append("allocate() on an empty pool")
                with must_raise(RuntimeError, "after these operations:\n  "
                                + "\n  ".join(history[-6:]) + "\nallocate()"):
                    yours.allocate()
                continue
            expected, got = minicb.allocate(), yours.allocate()
            live.append(expected)
        elif not live:
            continue
        else:
            block = rng.choice(live)
            if move == "share":
                expected, got = minicb.share(block), yours.share(block)
                live.append(block)
            else:
                expected, got = minicb.release(block), yours.release(block)
                live.remove(block)
                if expected:
                    minicb.push_free(block)
                    yours.push_free(block)
                move = f"release({block}) then push_free if unreferenced"
        recent = "\n  ".join(history[-5:])
        history.append(f"{move} (returned {got})")
        assert got == expected, (f"{move} should return {expected}, yours returned {got}, after "
                                 f"these operations:\n  {recent}")
        assert (list(yours.ref_counts) == minicb.ref_counts and yours.num_free()
                == minicb.num_free()), (
            f"after these operations:\n  {recent}\nexpected ref_counts {minicb.ref_counts} and "
            f"{minicb.num_free()} free, got {list(yours.ref_counts)} and {yours.num_free()} free. "
            "Hint: the free list is a stack: the block pushed last is allocated first.")


def test_ch04_real_engine_on_your_allocator_equals_transformers(tiny_model):
    """Your allocator drives minicb's paged cache through evictions and parallel samples (which
    share their prompt's blocks); every output still equals transformers'."""
    llm = LLM(tiny_model, kv_cache="paged", block_size=4, num_kv_blocks=10, max_num_seqs=3)
    kv = llm.llm_engine.kv
    kv.allocator = allocator = ch04.BlockAllocator(kv.num_blocks)
    shared: list[int] = []
    share = allocator.share

    def counting_share(block: int) -> None:
        shared.append(block)
        share(block)

    allocator.share = counting_share
    prompts, lengths = random_prompts([10, 7, 12, 5], 512, seed=11), [12, 10, 8, 9]
    samples = [2, 1, 2, 1]
    params = [replace(greedy(n), n=k) for n, k in zip(lengths, samples)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    references = hf_greedy(tiny_model, prompts, lengths)
    for index, (reference, output) in enumerate(zip(references, outputs)):
        for completion in output.outputs:
            label = f"request {index}, sample {completion.index}"
            try:
                compare(reference, completion.token_ids, completion.logprobs, label)
            except AssertionError as error:
                raise AssertionError(f"{error}. With your allocator the engine generated "
                                     f"{completion.token_ids}, transformers {reference.token_ids}: "
                                     "a block was probably handed out while someone still held "
                                     "it.") from None
    assert llm.llm_engine.scheduler.num_preemptions > 0, ("this setting should force evictions; "
                                                          "none happened")
    assert shared, ("parallel samples should have shared their prompt's blocks through share(); "
                    "none were")
    assert allocator.num_free() == kv.num_blocks and not any(allocator.ref_counts), (
        f"every request finished, so all {kv.num_blocks} blocks should be free again (each once); "
        f"num_free() "
        f"= {allocator.num_free()}, ref_counts = {list(allocator.ref_counts)}")


def test_ch04_slot_mapping_matches_the_engine(tiny_llama):
    """Every row of every step of a run with evictions: your slots against the runner's."""
    llm = LLM(tiny_llama, block_size=4, num_kv_blocks=9, max_num_seqs=3, max_num_batched_tokens=8)
    steps = record_packed_steps(llm)
    generate_ids(llm, random_prompts([10, 7, 12], 512, seed=12), [12, 10, 8])
    rows_checked = 0
    for number, step in enumerate(steps, start=1):
        bounds = step.meta.cu_seqlens_q.tolist()
        for index, row in enumerate(step.rows):
            expected = step.meta.slot_mapping[bounds[index]:bounds[index + 1]].tolist()
            got = ch04.slot_mapping(row.block_table, row.num_cached, len(row.token_ids), 4)
            assert list(got) == expected, (
                f"step {number}, request {row.request_id}: positions {row.num_cached}.."
                f"{row.num_cached + len(row.token_ids) - 1} with block table {row.block_table} "
                f"(block_size 4) "
                f"go to slots {expected}, yours {list(got)}")
            rows_checked += 1
    assert rows_checked > 20

"""Chapter 07: the prefix cache, side by side with minicb's and inside the paged KV manager."""

from __future__ import annotations

import random

import pytest
from adapter import chapter, run_docstring_examples
from engine_probe import generate_completions, random_prompts
from reference import compare, hf_greedy

import minicb.kv.paged
from minicb import LLM
from minicb.kv.prefix import PrefixCache as MinicbCache

ch07 = chapter("07")


def test_ch07_worked_examples():
    run_docstring_examples(ch07)


def test_ch07_a_collision_is_a_miss_never_a_wrong_hit(monkeypatch):
    """With every hash equal, only the first block is cached: other tokens must miss."""
    monkeypatch.setattr(ch07, "hash_block", lambda parent_hash, token_ids: 7)
    cache = ch07.PrefixCache(block_size=2)
    first = cache.insert(None, (1, 2), block=0)
    assert first is not None and first.block == 0, "a first insert should create an entry"
    other = cache.insert(None, (3, 4), block=1)
    assert other is None, (f"insert(None, (3, 4)) under a hash already naming (1, 2) returned "
                           f"{other}; it should return None (a collision is never cached)")
    found = cache.lookup(None, (3, 4))
    assert found is None, (f"lookup(None, (3, 4)) returned the entry of block {found.block} "
                           "holding (1, 2): a collision must be a miss (compare the tokens)")
    assert cache.lookup(first, (1, 2)) is None, \
        "lookup(first, (1, 2)) found an entry whose parent is not `first`: compare the parent too"


def random_prompt(rng: random.Random, pieces: list[tuple[int, ...]]) -> list[int]:
    """Blocks drawn from a few token pieces, so the same tokens often follow different parents."""
    return [t for _ in range(rng.randint(1, 4)) for t in rng.choice(pieces)] + [99] * rng.randint(
        0, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ch07_cache_behaves_like_minicbs(seed):
    """Random insert/match/park/unpark/evict, side by side with minicb's PrefixCache."""
    rng, size = random.Random(seed), 2
    pieces = [(1, 2), (3, 4), (1, 2)[::-1]]
    yours, minicb = ch07.PrefixCache(size), MinicbCache(size)
    next_block, history = 0, []
    for _ in range(200):
        move = rng.choice(["insert", "insert", "match", "park", "park", "unpark", "evict"])
        if move == "insert":
            prompt = random_prompt(rng, pieces)
            parents = [None, None]
            for index in range(len(prompt) // size):
                tokens = tuple(prompt[index * size:(index + 1) * size])
                expected = minicb.insert(parents[1], tokens, next_block)
                got = yours.insert(parents[0], tokens, next_block)
                step = f"insert(parent, {tokens}, block={next_block}) of prompt {prompt}"
                history.append(step)
                assert (got is None) == (expected is None) and (
                        got is None or got.block == expected.block), (
                    f"{step} should return the entry of block "
                    f"{getattr(expected, 'block', None)}, yours returned block "
                    f"{getattr(got, 'block', None)}; before it:\n  " + "\n  ".join(history[-6:-1]))
                next_block += 1
                if expected is None:
                    break
                parents = [got, expected]
            continue
        if move == "match":
            prompt = random_prompt(rng, pieces)
            limit = len(prompt) // size
            expected = [e.block for e in minicb.match(prompt, limit)]
            got = [e.block for e in yours.match(prompt, limit)]
            step = f"match({prompt}, max_blocks={limit})"
        elif move == "park":
            block = rng.randrange(next_block + 1)
            if block in minicb.evictable:
                continue
            expected, got = minicb.park(block), yours.park(block)
            step = f"park({block})"
        elif move == "unpark":
            if not minicb.evictable:
                continue
            block = rng.choice(list(minicb.evictable))
            expected, got = minicb.unpark(block), yours.unpark(block)
            step = f"unpark({block})"
        else:
            if not minicb.evictable:
                continue
            expected, got = minicb.evict(), yours.evict()
            step = "evict()"
        recent = "\n  ".join(history[-5:])
        history.append(step)
        assert got == expected, (f"{step} should return {expected}, yours returned {got}; "
                                 f"before it:\n  {recent}")
        assert list(yours.evictable) == list(minicb.evictable), (
            f"after {step}, the evictable blocks (least recently parked first) should be "
            f"{list(minicb.evictable)}, yours are {list(yours.evictable)}; before it:\n  {recent}")
        assert sorted(yours.by_block) == sorted(minicb.by_block), (
            f"after {step}, the cached blocks should be {sorted(minicb.by_block)}, yours are "
            f"{sorted(yours.by_block)}; before it:\n  {recent}")
    assert yours.stats.evictions == minicb.stats.evictions


def serve_shared_prefixes(model: str) -> tuple[LLM, list]:
    """Two rounds of prompts sharing a long prefix, on a pool small enough to evict."""
    llm = LLM(model, block_size=4, num_kv_blocks=14, max_num_seqs=2, enable_prefix_caching=True)
    shared = random_prompts([12], 512, seed=21)[0]
    tails = random_prompts([3, 6, 5, 2], 512, seed=22)
    others = random_prompts([17, 13], 512, seed=23)
    rounds = [[shared + tails[0], others[0]], [shared + tails[1], others[1]],
              [shared + tails[2], shared + tails[3]]]
    results = [(prompts, generate_completions(llm, prompts, [6] * len(prompts)))
               for prompts in rounds]
    return llm, results


def test_ch07_real_engine_on_your_cache_equals_transformers(monkeypatch, tiny_model):
    """minicb's paged KV manager with your PrefixCache: the same hits and evictions as with
    minicb's, the same tokens as transformers, every block free at the end."""
    minicb_llm, _ = serve_shared_prefixes(tiny_model)
    expected = minicb_llm.llm_engine.kv.prefix_stats()
    monkeypatch.setattr(minicb.kv.paged, "PrefixCache", ch07.PrefixCache)
    llm, results = serve_shared_prefixes(tiny_model)
    kv = llm.llm_engine.kv
    assert isinstance(kv.cache, ch07.PrefixCache)
    for prompts, completions in results:
        for index, (reference, completion) in enumerate(zip(hf_greedy(tiny_model, prompts,
                                                                      [6] * len(prompts)),
                                                            completions)):
            compare(reference, completion.token_ids, completion.logprobs, f"request {index}")
    got = kv.prefix_stats()
    assert expected.hit_tokens > 0 and expected.evictions > 0, "the setting should hit and evict"
    assert (got.hit_tokens, got.evictions) == (expected.hit_tokens, expected.evictions), (
        f"with minicb's cache the engine reused {expected.hit_tokens} prompt tokens and evicted "
        f"{expected.evictions} blocks; with yours {got.hit_tokens} and {got.evictions}")
    assert kv.num_free_blocks() == kv.num_blocks, \
        f"{kv.num_blocks - kv.num_free_blocks()} KV blocks still held after every request finished"

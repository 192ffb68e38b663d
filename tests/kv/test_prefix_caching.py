"""Prefix caching and shared blocks: same outputs, fewer blocks, no block ever lost or
double-booked."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Reference, compare, hf_greedy, run_with_arrivals

import minicb.kv.prefix
from minicb import LLM, SamplingParams
from minicb.config import EngineConfig
from minicb.kv import PagedKVManager, make_kv_manager
from minicb.kv.prefix import PrefixCache
from minicb.plan import ModelRunnerOutput
from minicb.request import Request, RequestStatus
from minicb.scheduler import make_scheduler

BLOCK = 16


# --- greedy outputs with the real model ---------------------------------------------------------
def shared_prefix_workload(seed: int = 0):
    """Prompts sharing prefixes of 0, 1, B-1, B, B+1 and several blocks with a 64-token "system
    prompt", exact repeats (the whole prompt cached), and prompts of whole blocks only."""
    rng = random.Random(seed)
    system = [rng.randrange(3, 512) for _ in range(4 * BLOCK)]

    def fresh(n):
        return [rng.randrange(3, 512) for _ in range(n)]

    prompts = [system[:k] + fresh(rng.randint(1, 12))
               for k in (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 3 * BLOCK + 5, 4 * BLOCK)
               * 2]
    prompts += [list(prompts[6]), list(prompts[7]), system[:2 * BLOCK], system[:2 * BLOCK],
                system[:1]]
    max_tokens = [rng.randint(1, 20) for _ in prompts]
    arrival_steps = sorted(rng.randint(0, 30) for _ in prompts)
    return prompts, max_tokens, arrival_steps


@pytest.fixture(scope="module")
def workload():
    return shared_prefix_workload()


def test_greedy_outputs_equal_without_caching_and_transformers(tiny_model, workload):
    """A tight pool (preemption, evictions) and two aborts: caching changes no token."""
    prompts, max_tokens, arrival_steps = workload
    aborts = {3: 8, 12: 20}
    references = hf_greedy(tiny_model, prompts, max_tokens)
    knobs = dict(max_num_seqs=6, max_num_batched_tokens=96, max_model_len=128, block_size=BLOCK,
                 num_kv_blocks=10)
    plain = run_with_arrivals(LLM(tiny_model, **knobs), prompts, max_tokens, arrival_steps, aborts)
    cached_llm = LLM(tiny_model, enable_prefix_caching=True, **knobs)
    cached = run_with_arrivals(cached_llm, prompts, max_tokens, arrival_steps, aborts)

    verdicts = []
    for i, (ref, off, on) in enumerate(zip(references, plain, cached)):
        tokens, logprobs = on.outputs[0].token_ids, on.outputs[0].logprobs
        if on.outputs[0].finish_reason == "abort":
            assert tokens == ref.token_ids[:len(tokens)], (f"aborted request {i} went wrong before "
                                                           "its abort")
            continue
        assert off.outputs[0].finish_reason == "length"
        verdicts.append(compare(ref, tokens, logprobs, f"request {i} vs transformers"))
        compare(Reference(off.outputs[0].token_ids, off.outputs[0].logprobs), tokens, logprobs,
                f"request {i} with vs without caching")
    assert verdicts.count("equal") >= len(verdicts) - 2, ("too many near-ties to be chance: "
                                                          f"{verdicts}")

    engine = cached_llm.llm_engine
    stats = engine.kv.prefix_stats()
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to be tight enough to preempt"
    assert stats.evictions > 0 and stats.hit_tokens > 0
    assert [o.outputs[0].finish_reason for o in cached].count("abort") == len(aborts)
    assert sum(o.metrics.num_cached_tokens > 0 for o in cached) >= len(prompts) // 2
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, ("KV blocks leaked after every "
                                                                 "request ended")
    assert all(count == 0 for count in engine.kv.allocator.ref_counts)


def test_hash_collisions_never_return_wrong_kv(tiny_llama, workload, monkeypatch):
    """Every block hashes alike: only the stored token ids tell blocks apart, so a collision
    costs a miss and outputs stay exact."""
    monkeypatch.setattr(minicb.kv.prefix, "hash_block", lambda parent_hash, token_ids: 0)
    prompts, max_tokens, arrival_steps = workload
    knobs = dict(max_num_seqs=6, max_num_batched_tokens=96, max_model_len=128, block_size=BLOCK)
    plain = run_with_arrivals(LLM(tiny_llama, **knobs), prompts, max_tokens, arrival_steps)
    llm = LLM(tiny_llama, enable_prefix_caching=True, **knobs)
    cached = run_with_arrivals(llm, prompts, max_tokens, arrival_steps)
    for i, (off, on) in enumerate(zip(plain, cached)):
        compare(Reference(off.outputs[0].token_ids, off.outputs[0].logprobs),
                on.outputs[0].token_ids, on.outputs[0].logprobs, f"request {i}")
    assert llm.llm_engine.kv.prefix_stats().queries == len(prompts)


def test_whole_prompt_cached_computes_only_its_last_block(tiny_llama):
    prompt = sample_prompt(2 * BLOCK)
    llm = LLM(tiny_llama, enable_prefix_caching=True, block_size=BLOCK, max_model_len=128)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    first, again, longer = (llm.generate([p], params, use_tqdm=False)[0]
                            for p in (prompt, prompt, prompt + [9, 9, 9]))
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert [o.metrics.num_cached_tokens for o in (first, again, longer)] == [0, BLOCK, 2 * BLOCK]


def test_collision_is_a_miss_in_the_cache(monkeypatch):
    monkeypatch.setattr(minicb.kv.prefix, "hash_block", lambda parent_hash, token_ids: 7)
    cache = PrefixCache(block_size=2)
    first = cache.insert(None, (1, 2), block=0)
    assert cache.insert(None, (3, 4), block=1) is None, "a colliding block must not be cached"
    assert cache.lookup(None, (3, 4)) is None
    assert cache.lookup(None, (1, 2)) is first
    assert cache.lookup(first, (1, 2)) is None, ("same tokens after another parent are another "
                                                 "prefix")


def test_counters_and_lru_eviction():
    """Hit counts follow the rule (full blocks only, the last token always computed), and the
    evictable blocks go least recently used first, a prompt's tail before its head."""
    kv = PagedKVManager(num_blocks=5, block_size=2, enable_prefix_caching=True)
    a = Request("a", [1, 2, 3, 4, 5], SamplingParams())
    assert kv.claim_cached_prefix(a) == 0
    kv.allocate(a, 5)
    a.num_computed_tokens = 5
    kv.cache_full_blocks(a)
    blocks_a = list(kv.block_table(a))
    kv.free(a)                                    # [1,2] and [3,4] stay cached; [5] is freed
    assert kv.num_free_blocks() == 5 and kv.prefix_stats().cached_blocks == 2

    b = Request("b", [1, 2, 3, 4, 9], SamplingParams())
    assert kv.claim_cached_prefix(b) == 4
    assert kv.block_table(b) == blocks_a[:2]
    kv.allocate(b, 5)
    stats = kv.prefix_stats()
    assert (stats.queries, stats.queried_tokens, stats.hit_tokens) == (2, 10, 4)
    assert stats.hit_rate == pytest.approx(0.4)

    c = Request("c", [1, 2], SamplingParams())        # its only block is its last token's
    assert kv.claim_cached_prefix(c) == 0
    kv.free(c)                                          # never admitted: not counted
    assert kv.prefix_stats().queries == 2

    kv.free(b)                    # parks [3,4] (the tail) before [1,2]
    d = Request("d", [8] * 10, SamplingParams())
    kv.allocate(d, 8)             # 3 free blocks, then one eviction: the tail [3,4] goes first
    assert kv.prefix_stats().evictions == 1
    e = Request("e", [1, 2, 3, 4, 6], SamplingParams())
    assert kv.claim_cached_prefix(e) == 2, "the head [1,2] must have outlived the tail [3,4]"


# --- parallel sampling ----------------------------------------------------------------------------
def sample_prompt(length: int = 40) -> list[int]:
    rng = random.Random(5)
    return [rng.randrange(3, 512) for _ in range(length)]


@pytest.mark.parametrize("knobs", [{}, {"enable_prefix_caching": True, "num_kv_blocks": 8},
                                   {"kv_cache": "contiguous"}],
                         ids=["roomy", "cached-tight-pool", "contiguous-no-sharing"])
def test_each_sample_equals_its_seed_alone(tiny_llama, knobs):
    llm = LLM(tiny_llama, block_size=BLOCK, max_model_len=128, **knobs)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=14, ignore_eos=True)
    together = llm.generate([sample_prompt()], params, use_tqdm=False)[0]
    alone = LLM(tiny_llama, block_size=BLOCK, max_model_len=128)
    for i, completion in enumerate(together.outputs):
        single = SamplingParams(temperature=1.0, seed=11 + i, max_tokens=14, ignore_eos=True)
        expected = alone.generate([sample_prompt()], single, use_tqdm=False)[0].outputs[0].token_ids
        assert completion.index == i and completion.token_ids == expected, f"sample {i}"
    assert len({tuple(c.token_ids) for c in together.outputs}) > 1, "samples should differ"
    engine = llm.llm_engine
    if "num_kv_blocks" in knobs:
        assert engine.scheduler.num_preemptions > 0, ("the pool was meant to be tight enough to "
                                                      "preempt")
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks


@pytest.mark.parametrize("share", [True, False])
def test_samples_store_the_prompt_blocks_once(tiny_llama, share):
    """A 40-token prompt in 16-token blocks: tokens 0-31 fill two blocks, the third is partly
    filled.
    Shared: the two full blocks once, a third block per sample (three of them copies) = 2 + 4.
    Not shared: 3 blocks per sample = 12."""
    engine = LLM(tiny_llama, block_size=BLOCK, max_model_len=128).llm_engine
    prompt = sample_prompt(40)
    if share:      # one request with four samples: sample i draws from seed 3 + i
        requests = engine.add_request(
            "0", prompt,
            SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True))
    else:          # four requests, the same seeds
        requests = [request for i in range(4) for request in engine.add_request(
            str(i), prompt,
            SamplingParams(temperature=1.0, seed=3 + i, max_tokens=6, ignore_eos=True))]
    while not all(r.num_output_tokens >= 1 for r in requests):
        engine.step()
    tables = [list(engine.kv.block_table(r)) for r in requests]
    if share:
        assert engine.kv.num_used_blocks() == 2 + 4
        assert all(t[:2] == tables[0][:2] for t in tables)
        assert all(engine.kv.allocator.ref_counts[b] == 4 for b in tables[0][:2])
        assert len({t[2] for t in tables}) == 4, ("each sample writes its own copy of the partial "
                                                  "block")
        assert [r.num_cached_tokens for r in requests] == [0, 39, 39, 39]
    else:
        assert engine.kv.num_used_blocks() == 4 * 3
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks


# --- properties of the manager under the real scheduler (no model) -----------------------------
# A stand-in model: the next token is a function of the whole sequence and the sample's seed, and
# the "KV" of position p is the sequence up to p. Each step, every row must read back exactly its
# own sequence from its block table, so any block handed out, evicted or overwritten while a
# request still reads it shows up as a wrong read.
def next_token(tokens: list[int], seed: int) -> int:
    # a tiny vocabulary: outputs repeat and get cached
    return 3 + hash((tuple(tokens), seed)) % 3


def expected_output(prompt: list[int], seed: int, max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens, seed))
    return tokens[len(prompt):]


def check_blocks(kv: PagedKVManager, running: list[Request], waiting: list[Request]) -> None:
    counts = Counter(b for r in running for b in kv.block_table(r))
    assert all(not kv.block_table(r) for r in waiting), "a waiting request holds blocks"
    refs = kv.allocator.ref_counts
    assert min(refs) >= 0
    assert all(refs[b] == counts[b] for b in range(kv.num_blocks)), ("a count differs from the "
                                                                     "holders")
    free = kv.allocator.free_blocks
    evictable = set(kv.cache.evictable) if kv.cache else set()
    assert len(set(free)) == len(free)
    assert not set(free) & evictable and not (set(free) | evictable) & set(counts), \
        "a block held by a running request is free or evictable"
    assert set(free) | evictable | set(counts) == set(range(kv.num_blocks)), "a block leaked"


PREFIXES = [0, 1, 3, 4, 5, 8, 12]       # block_size 4: 0, 1, B-1, B, B+1, several blocks


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(st.tuples(st.sampled_from(PREFIXES), st.integers(0, 5), st.integers(1, 8),
                                st.integers(1, 3), st.integers(0, 12)), min_size=1, max_size=10),
       aborts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 9)), max_size=3),
       num_blocks=st.integers(8, 24), caching=st.booleans(),
       step_order=st.sampled_from(["decode_first", "prefill_first"]))
def test_blocks_are_never_lost_or_double_booked(specs, aborts, num_blocks, caching, step_order):
    """Random prompts sharing prefixes, parallel samples, aborts and a tight pool."""
    block, system = 4, [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=40,
                          block_size=block, num_kv_blocks=num_blocks, enable_prefix_caching=caching,
                          step_order=step_order)
    config = config.resolve(40)
    kv = make_kv_manager("paged", num_blocks, block, 40, caching)

    scheduler = make_scheduler(config, kv, lambda: 0.0)
    arrivals: dict[int, list[list[Request]]] = {}
    seeds: dict[str, int] = {}
    for index, (prefix, suffix, max_tokens, n, arrival) in enumerate(specs):
        prompt = system[:prefix] + [20 + index] * suffix or [20 + index]
        group = [Request(f"{index}.{s}", prompt,
                         SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                         arrival_index=10 * index + s) for s in range(n)]
        seeds.update({r.request_id: s for s, r in enumerate(group)})
        arrivals.setdefault(arrival, []).append(group)
    everyone = [r for groups in arrivals.values() for group in groups for r in group]
    abort_at = {step: f"{index}.0" for step, index in aborts}     # a first sample: its forks go on
    store: dict[tuple[int, int], tuple[int, ...]] = {}    # (block, offset) → the sequence it holds

    for step in range(3000):
        for group in arrivals.get(step, []):
            for request in group:
                scheduler.add_request(request,
                                      fork_of=group[0] if request is not group[0] else None)
        if step in abort_at:
            scheduler.abort(abort_at[step])       # None when it is not here (yet, or any more)
        if not scheduler.has_unfinished() and step > max(arrivals):
            break
        plan = scheduler.schedule()
        for source, destination in plan.block_copies:
            for offset in range(block):
                store.pop((destination, offset), None)
                if (source, offset) in store:
                    store[destination, offset] = store[source, offset]
        written = {}
        for seq in plan.seqs:
            request, table = seq.request, kv.block_table(seq.request)
            start = request.num_computed_tokens
            for position in range(start, start + seq.num_tokens):
                slot = (table[position // block], position % block)
                assert slot not in written, "two rows write one slot in one step"
                written[slot] = tuple(request.all_token_ids[:position + 1])
        store.update(written)
        for seq in plan.seqs:
            request, table = seq.request, kv.block_table(seq.request)
            for position in range(request.num_computed_tokens + seq.num_tokens):
                assert store.get((table[position // block], position % block)) == \
                    tuple(request.all_token_ids[:position
                                                + 1]), f"{request} reads wrong KV at {position}"
        check_blocks(kv, scheduler.running, scheduler.waiting)
        scheduler.update(plan, ModelRunnerOutput.of([
            next_token(s.request.all_token_ids, seeds[s.request.request_id])
            for s in plan.seqs if s.needs_logits]))
    assert not scheduler.has_unfinished(), "the workload did not finish"
    for request in everyone:
        seed, max_tokens = seeds[request.request_id], request.params.max_tokens
        expected = expected_output(request.prompt_token_ids, seed, max_tokens)
        if request.status is RequestStatus.FINISHED_ABORTED:
            assert request.output_token_ids == expected[:request.num_output_tokens]
        else:
            assert request.output_token_ids == expected
    # every block is free, or cached with a count of zero
    check_blocks(kv, [], [])
    assert all(count == 0 for count in kv.allocator.ref_counts)
    assert kv.num_free_blocks() == kv.num_blocks

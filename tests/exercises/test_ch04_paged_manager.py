"""Chapter 04, second part: your paged KV manager beside minicb's and driving the real engine."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from adapter import chapter
from engine_probe import greedy, random_prompts
from reference import compare, hf_greedy

import minicb.engine.llm_engine
from minicb import LLM
from minicb.kv.paged import PagedKVManager

ch04 = chapter("04")


def state(kv) -> tuple:
    return ({rid: list(table) for rid, table in kv.tables.items()},
            list(kv.allocator.ref_counts), kv.num_free_blocks())


def own_history(history: list[tuple[str, str]], parents: dict[str, str], rid: str) -> str:
    """The calls that made request `rid` what it is: its own, and those of the requests it was
    forked from, up to the fork (the cause of a wrong table is usually there, not in the last
    few calls of other requests)."""
    lineage, cut = {rid: len(history)}, rid
    while cut in parents:
        fork_at = next(i for i, (who, call) in enumerate(history)
                       if who == cut and call.startswith("fork("))
        cut = parents[cut]
        lineage[cut] = fork_at
    calls = [call for i, (who, call) in enumerate(history) if i < lineage.get(who, -1) + 1]
    shown = calls[-12:]
    more = f"({len(calls) - len(shown)} earlier calls not shown)\n  " if len(calls) > 12 else ""
    return f"the calls on {rid}" + (" and the requests it was forked from" if len(lineage) > 1
                                    else "") + ":\n  " + more + "\n  ".join(shown)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ch04_manager_behaves_like_minicbs(seed):
    """Random grow/free/fork of requests, side by side with minicb's PagedKVManager."""
    rng = random.Random(seed)
    yours, minicb = ch04.PagedManager(12, 4), PagedKVManager(12, 4)
    lengths: dict[str, int] = {}           # request id → tokens it holds
    history: list[tuple[str, str]] = []    # (request id, the call), in order
    parents: dict[str, str] = {}           # a fork's child → its parent
    for step in range(250):
        move = rng.choice(["new", "grow", "grow", "grow", "free", "fork"])
        if move in ("grow", "free", "fork") and not lengths:
            move = "new"
        if move == "free":
            rid = rng.choice(sorted(lengths))
            request = SimpleNamespace(request_id=rid)
            call = f"free({rid})"
            yours.free(request), minicb.free(request)
            del lengths[rid]
        else:
            if move == "fork":
                parent = rng.choice(sorted(lengths))
                rid = f"r{step}"
                expected = minicb.fork(SimpleNamespace(request_id=parent),
                                       SimpleNamespace(request_id=rid), lengths[parent])
                got = yours.fork(SimpleNamespace(request_id=parent),
                                 SimpleNamespace(request_id=rid), lengths[parent])
                call = f"fork({parent} → {rid}, {lengths[parent]} tokens)"
                assert got == expected, f"{call} should return {expected}, yours returned {got}"
                lengths[rid] = lengths[parent]
                parents[rid] = parent
                history.append((rid, call))
                grow = 1                   # a sample writes its next token right after the fork
            else:
                rid = f"r{step}" if move == "new" else rng.choice(sorted(lengths))
                lengths.setdefault(rid, 0)
                grow = rng.randint(1, 6)
            request, target = SimpleNamespace(request_id=rid), lengths[rid] + grow
            expected, got = minicb.can_allocate(request, target), yours.can_allocate(request,
                                                                                     target)
            call = f"can_allocate({rid}, {target})"
            assert got == expected, (f"{call} should be {expected}, yours {got}; before it, "
                                     f"{own_history(history, parents, rid)}")
            if expected:
                before = yours.block_table(request)
                held = list(before)           # what a plan made before this call holds
                minicb.allocate(request, target), yours.allocate(request, target)
                call = f"allocate({rid}, {target})"
                assert before == held, (
                    f"{call} changed the list block_table returned before it, from {held} to "
                    f"{before}: a table that changes must become a new list, since a plan "
                    "already made holds the old one (the runner sees a change by identity)")
                lengths[rid] = target
            elif lengths[rid] == 0:
                del lengths[rid]
        history.append((rid, call))
        recent = own_history(history, parents, rid)
        want_copies, got_copies = minicb.pop_block_copies(), yours.pop_block_copies()
        assert got_copies == want_copies, (
            f"after {call}, the block copies (source, destination) should be {want_copies}, "
            f"yours {got_copies}; {recent}")
        assert state(yours) == state(minicb), (
            f"after {call}: block tables, reference counts and free blocks should be "
            f"{state(minicb)}, yours {state(yours)}; {recent}")
    for rid in list(lengths):
        yours.free(SimpleNamespace(request_id=rid))
    assert yours.num_free_blocks() == 12, \
        f"after freeing every request, {12 - yours.num_free_blocks()} blocks are still held"


def test_ch04_real_engine_on_your_manager_equals_transformers(monkeypatch, tiny_model):
    """The engine on your manager: evictions, parallel samples sharing a partly filled prompt
    block (copy-on-write), outputs equal transformers', every block free at the end."""
    managers = []

    def make(kind, num_blocks, block_size, *_):
        managers.append(ch04.PagedManager(num_blocks, block_size))
        return managers[-1]

    monkeypatch.setattr(minicb.engine.llm_engine, "make_kv_manager", make)
    llm = LLM(tiny_model, kv_cache="paged", block_size=4, num_kv_blocks=9, max_num_seqs=3)
    kv = llm.llm_engine.kv
    assert kv is managers[-1]
    copies, pop = [], kv.pop_block_copies

    def counting_pop():
        copies.extend(result := pop())
        return result

    kv.pop_block_copies = counting_pop
    prompts, lengths = random_prompts([10, 7, 13, 5], 512, seed=12), [12, 10, 8, 9]
    params = [replace(greedy(n), n=k) for n, k in zip(lengths, [3, 1, 2, 1])]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for index, (reference, output) in enumerate(zip(hf_greedy(tiny_model, prompts, lengths),
                                                    outputs)):
        for completion in output.outputs:
            try:
                compare(reference, completion.token_ids, completion.logprobs,
                        f"request {index}, sample {completion.index}")
            except AssertionError as error:
                raise AssertionError(f"{error}. On your manager the engine generated "
                                     f"{completion.token_ids}, transformers "
                                     f"{reference.token_ids}: a sample probably wrote into a "
                                     "block another one still reads (copy-on-write).") from None
    assert copies, "parallel samples of prompts ending mid-block should have copied a block"
    assert llm.llm_engine.scheduler.num_preemptions > 0, "this setting should force evictions"
    assert kv.num_free_blocks() == kv.num_blocks and not kv.tables, (
        f"every request finished, yet {kv.num_blocks - kv.num_free_blocks()} blocks are held "
        f"and tables remain for {sorted(kv.tables)}")

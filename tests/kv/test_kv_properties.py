"""Property tests: random workloads, random aborts and tight pools never double-book or leak a
block."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minicb.config import EngineConfig
from minicb.kv import ContiguousKVManager, PagedKVManager, make_kv_manager
from minicb.params import SamplingParams
from minicb.plan import ModelRunnerOutput
from minicb.request import Request, RequestStatus
from minicb.scheduler import make_scheduler


def owned_blocks(kv, requests) -> list[int]:
    return [b for r in requests for b in kv.block_table(r)]


def check_invariants(kv, live) -> None:
    owned = owned_blocks(kv, live)
    assert len(owned) == len(set(owned)), f"a block is owned twice: {sorted(owned)}"
    if isinstance(kv, PagedKVManager):
        free = kv.allocator.free_blocks
        assert not set(free) & set(owned), "a block is both free and owned"
        assert len(set(free)) == len(free), "the free list holds a block twice"
        assert len(free) + len(owned) == kv.num_blocks, "a block is neither free nor owned (leak)"
        assert all(kv.allocator.ref_counts[b] == 1 for b in owned)
    else:
        assert kv.num_free_blocks() + len(owned) == kv.num_blocks


class FakeRequest:
    def __init__(self, request_id: str):
        self.request_id = request_id


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["paged", "contiguous"]),
       operations=st.lists(
           st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 7), st.integers(1, 40)),
           max_size=60))
def test_allocate_grow_free_sequences(kind, operations):
    kv = make_kv_manager(kind, num_blocks=24, block_size=4, max_model_len=32)
    requests = {i: FakeRequest(str(i)) for i in range(8)}
    sizes = {i: 0 for i in requests}
    for op, index, tokens in operations:
        request = requests[index]
        if op == "grow":
            target = min(sizes[index] + tokens, 32)
            if kv.can_allocate(request, target):
                kv.allocate(request, target)
                sizes[index] = target
                assert len(kv.block_table(request)) * kv.block_size >= target
        else:
            kv.free(request)
            sizes[index] = 0
        check_invariants(kv, [requests[i] for i in requests if sizes[i]])
    for request in requests.values():
        kv.free(request)
    assert kv.num_free_blocks() == kv.num_blocks


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["paged", "contiguous"]),
       scheduler=st.sampled_from(["naive", "static", "continuous"]),
       lengths=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=14),
       aborts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 13)), max_size=5),
       num_blocks=st.integers(13, 30))
def test_scheduler_with_aborts_never_leaks(kind, scheduler, lengths, aborts, num_blocks):
    """Drive the real scheduler (no model) with a tight pool, random lengths and random aborts."""
    config = EngineConfig(scheduler=scheduler, kv_cache=kind, max_num_seqs=4,
                          max_num_batched_tokens=16, max_model_len=50, block_size=4,
                          num_kv_blocks=num_blocks)
    config = config.resolve(50)
    kv = make_kv_manager(kind, config.num_kv_blocks, 4, 50)

    sched = make_scheduler(config, kv, lambda: 0.0)
    requests = [Request(str(i), [7] * p, SamplingParams(max_tokens=o, ignore_eos=True))
                for i, (p, o) in enumerate(lengths)]
    for request in requests:
        sched.add_request(request)
    abort_at = {}
    for step, index in aborts:
        abort_at.setdefault(step, []).append(index)
    for step in range(2000):
        for index in abort_at.get(step, []):
            if index < len(requests) and not requests[index].finished:
                sched.abort(str(index))
        if not sched.has_unfinished():
            break
        plan = sched.schedule()
        assert plan.seqs, "an unfinished workload must make progress every step"
        live = [r for r in requests if kv.block_table(r)]
        check_invariants(kv, live)
        if scheduler == "continuous":
            assert plan.num_tokens <= config.max_num_batched_tokens
            assert len(plan.seqs) <= config.max_num_seqs
        sched.update(plan, ModelRunnerOutput.of([7] * sum(s.needs_logits for s in plan.seqs)))
    assert not sched.has_unfinished(), "the workload did not finish"
    assert kv.num_free_blocks() == kv.num_blocks, "blocks leaked after every request ended"
    for request in requests:
        assert request.finished
        if request.status is RequestStatus.FINISHED_LENGTH:
            assert request.num_output_tokens == request.params.max_tokens


def test_contiguous_reserves_the_tail_paged_reuses_freed_blocks_first():
    """Contiguous holds max_model_len slots for a 4-token request; paged holds one block, and hands
    the blocks a finished request freed to the very next request."""
    # 4 blocks each
    contiguous = ContiguousKVManager(num_blocks=10, block_size=4, max_model_len=16)
    a, b, c, d = (FakeRequest(x) for x in "abcd")
    contiguous.allocate(a, 4)
    contiguous.allocate(b, 4)
    assert contiguous.num_reserved_slots() == 32          # for 8 tokens
    assert not contiguous.can_allocate(c, 4), "2 free blocks cannot start a 4-block run"
    paged = PagedKVManager(num_blocks=10, block_size=4)
    for request in (a, b, c):
        paged.allocate(request, 4)
    assert paged.num_reserved_slots() == 12               # for 12 tokens
    paged.allocate(b, 12)
    freed = list(paged.block_table(b))
    paged.free(b)
    paged.allocate(d, 12)
    assert paged.block_table(d) == freed, ("a finished request's blocks are reused first, in its "
                                           "order")

"""The waiting queue's policy order and one step's budget, on their own."""

from __future__ import annotations

import random

from minicb.params import SamplingParams
from minicb.request import Request
from minicb.scheduler.continuous import StepBudget
from minicb.scheduler.queue import WaitingQueue


def make(request_id: str, prompt_len: int = 4, priority: int = 0) -> Request:
    return Request(request_id, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=4),
                   priority=priority)


def test_in_order_is_the_keys_order_with_ties_to_the_queue_position():
    rng = random.Random(0)
    for _ in range(50):
        queue = WaitingQueue(make(str(i), priority=rng.randint(0, 3))
                             for i in range(rng.randint(1, 12)))
        walked = [r.request_id for r in queue.in_order(lambda r: (r.priority,))]
        expected = [
            r.request_id
            for _, r in sorted(enumerate(queue), key=lambda pair: (pair[1].priority, pair[0]))]
        assert walked == expected
        assert ([r.request_id for r in queue]
                       == [str(i) for i in range(len(queue))]), ("walking must not reorder")


def test_the_first_pick_is_one_scan_and_the_heap_is_built_only_for_a_second():
    queue = WaitingQueue(make(str(i), priority=9 - i) for i in range(10))
    calls = []

    def key(request):
        calls.append(request.request_id)
        return (request.priority,)

    walk = queue.in_order(key)
    assert next(walk).request_id == "9"
    assert len(calls) == 10, "one key per waiting request for the first pick"
    assert next(walk).request_id == "8"
    assert len(calls) == 10 + 9, "the rest keyed once, when a second is asked for"
    assert [r.request_id for r in walk] == [str(i) for i in range(7, -1, -1)]


def test_an_empty_queue_yields_nothing_and_remove_all_keeps_the_rest_in_order():
    assert list(WaitingQueue().in_order(lambda r: (0,))) == []
    requests = [make(str(i)) for i in range(6)]
    queue = WaitingQueue(requests)
    queue.remove_all([requests[4], requests[1]])
    assert [r.request_id for r in queue] == ["0", "2", "3", "5"]
    queue.remove_all([requests[0]])
    queue.insert(0, requests[1])         # a preempted request goes back to the front
    assert [r.request_id for r in queue] == ["1", "2", "3", "5"]


def test_the_step_budget_caps_prompt_chunks_and_decodes_and_remembers_who_is_in():
    budget = StepBudget(tokens=10, prefill_tokens=6)
    long_prompt = make("long", prompt_len=20)
    assert budget.tokens_for(long_prompt) == 6, "a prompt is chunked to the prefill cap"
    budget.charge(long_prompt, 6, prompt_tokens=True)
    assert (budget.tokens, budget.prefill_tokens, budget.scheduled) == (4, 0, {"long"})
    other_prompt = make("other", prompt_len=3)
    assert budget.tokens_for(other_prompt) == 0, "no prefill budget left"
    decoding = make("decoding", prompt_len=3)
    decoding.num_computed_tokens, decoding.output_token_ids = 3, [7]
    assert budget.tokens_for(decoding) == 1, "a decode takes its one token from what is left"
    budget.charge(decoding, 1, prompt_tokens=False)
    assert (budget.tokens, budget.prefill_tokens) == (3, 0)

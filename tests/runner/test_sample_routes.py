"""The runner's sampling routes: `ModelRunner.sample` sends each step by one of three routes, and
the two short ones must give exactly what the general one gives on the same logits (tokens,
logprobs, errors and the sampled tensor the next step's placeholders read), for every step they
accept. Each case checks which route the dispatch chose, then compares it with the general
route run on the same rows, with generators seeded alike."""

from __future__ import annotations

import pytest
import torch

from minicb import LLM, SamplingParams
from minicb.plan import ScheduledSeq
from minicb.runner.input_batch import InputBatch
from minicb.runner.logits_process import LogitsState

VOCAB = 512      # tiny_llama's
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def runner(tiny_llama):
    return LLM(tiny_llama, max_num_seqs=8).llm_engine.runner


def rows_of(settings: list[tuple[SamplingParams, LogitsState | None]],
            proposals: dict[int, list[int]] | None = None) -> list[ScheduledSeq]:
    """Decode rows with these settings, each with its own generator, seeded by its row number
    (so two calls give rows whose draws agree)."""
    proposals = proposals or {}
    return [ScheduledSeq(None, 1 + len(proposals.get(i, [])), 10 + i, [5] + proposals.get(i, []),
                         [i], params, torch.Generator().manual_seed(100 + i), needs_logits=True,
                         is_decode=i not in proposals, proposal=proposals.get(i, []),
                         logits_state=state, req_id=f"r{i}")
            for i, (params, state) in enumerate(settings)]


def routed(runner, monkeypatch, rows, logits, decode):
    """`runner.sample`'s result and the name of the route it took."""
    taken = []
    for name in ("_sample_general", "_sample_plain", "_sample_argmax"):
        route = getattr(runner, name)
        monkeypatch.setattr(runner, name, lambda *args, route=route, name=name:
                            taken.append(name) or route(*args))
    result = runner.sample(rows, logits, decode)
    monkeypatch.undo()
    return result, taken[0]


def assert_same_as_general(runner, monkeypatch, settings, route, dtype=torch.float32,
                           through_batch=True, proposals=None):
    torch.manual_seed(len(settings))
    logits = (3 * torch.randn(sum(1 + len((proposals or {}).get(i, []))
                                  for i in range(len(settings))), VOCAB)).to(dtype)
    rows = rows_of(settings, proposals)
    decode = (InputBatch(16, 4, 16).gather(rows) if through_batch else None)
    have, took = routed(runner, monkeypatch, rows, logits, decode)
    have_sampled = runner.sampled
    assert took == route
    want = runner._sample_general(rows_of(settings, proposals), logits)
    assert have.sampled_token_ids == want.sampled_token_ids
    assert have.logprobs == want.logprobs
    assert have.errors == want.errors
    assert torch.equal(have_sampled, runner.sampled)
    return have


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_argmax_route_is_the_general_route_for_greedy_decodes(runner, monkeypatch, dtype):
    assert_same_as_general(runner, monkeypatch, [(GREEDY, None)] * 5, "_sample_argmax", dtype)


def test_the_argmax_route_reads_the_logprobs_rows_ask_for(runner, monkeypatch):
    have = assert_same_as_general(
        runner, monkeypatch, [(GREEDY, None), (SamplingParams(temperature=0, logprobs=3), None),
                              (GREEDY, None)], "_sample_argmax")
    assert have.logprobs[0] is None and len(have.logprobs[1][0][1]) >= 3


def test_a_greedy_row_with_logits_to_process_leaves_the_argmax_route(runner, monkeypatch):
    """A bias changes the argmax: the row is greedy but not a raw argmax, so the step samples by
    the plain route, which applies it, as the general route does."""
    top = 7
    biased = SamplingParams(temperature=0, logit_bias={top: 100.0})
    have = assert_same_as_general(runner, monkeypatch, [(GREEDY, None), (biased, None)],
                                  "_sample_plain")
    assert have.sampled_token_ids[1] == [top]


@pytest.mark.parametrize("through_batch", [True, False])
def test_the_plain_route_is_the_general_route_for_mixed_settings(runner, monkeypatch,
                                                                 through_batch):
    """Seeded draws, top-k and top-p, greedy rows and logprobs, in a decode step (settings read
    off the persistent batch) and in any step without verification rows."""
    settings = [(SamplingParams(temperature=0.8, seed=1), None),
                (GREEDY, None),
                (SamplingParams(temperature=1.2, top_k=5, logprobs=2), None),
                (SamplingParams(temperature=0.7, top_p=0.5, logprobs=0), None),
                (SamplingParams(temperature=0, logprobs=1), None)]
    assert_same_as_general(runner, monkeypatch, settings, "_sample_plain",
                           through_batch=through_batch)


def test_the_plain_route_fails_the_same_row_alone(runner, monkeypatch):
    """A row whose settings break the batch's sampling (a penalty without its state) fails by
    itself on both routes; the others keep their tokens."""
    broken = SamplingParams(temperature=0.9, repetition_penalty=1.3)
    settings = [(SamplingParams(temperature=0.9, logprobs=1), None), (broken, None),
                (GREEDY, None)]
    have = assert_same_as_general(runner, monkeypatch, settings, "_sample_plain")
    assert have.sampled_token_ids[1] is None and "LogitsState" in have.errors[1]
    assert have.sampled_token_ids[0] is not None and have.errors[0] is None


def test_the_plain_route_applies_penalties_as_the_general_route(runner, monkeypatch):
    penalised = SamplingParams(temperature=0.5, presence_penalty=1.5, logprobs=2)
    state = LogitsState(penalised, [3, 9], VOCAB)
    for token in (3, 4, 4):
        state.accept(token)
    assert_same_as_general(runner, monkeypatch, [(penalised, state), (GREEDY, None)],
                           "_sample_plain")


def test_a_step_with_a_verification_row_takes_the_general_route(runner, monkeypatch):
    rows = rows_of([(GREEDY, None), (SamplingParams(temperature=0, logprobs=1), None)],
                   {1: [8, 9]})
    logits = torch.randn(4, VOCAB)
    result, took = routed(runner, monkeypatch, rows, logits, None)
    assert took == "_sample_general"
    assert result.sampled_token_ids[0] == [int(logits[0].argmax())]
    assert 1 <= len(result.sampled_token_ids[1]) <= 3 and len(result.logprobs[1]) == len(
        result.sampled_token_ids[1])

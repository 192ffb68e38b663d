"""The sampler's distributions, measured: thousands of seeded draws against the probabilities
each setting promises. The draws are seeded, so a run is deterministic, and a tolerance of 5
standard deviations of a binomial count keeps a correct sampler far from failing while a wrong
distribution (a token off by a few percent) fails."""

from __future__ import annotations

import math

import pytest
import torch

from minicb.params import SamplingParams
from minicb.runner.sampler import Sampler

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
ROWS, ROUNDS = 1000, 20   # 20,000 draws per setting


def draw(params: SamplingParams, rows: int = ROWS, rounds: int = ROUNDS,
         logits: torch.Tensor = LOGITS) -> torch.Tensor:
    """How often each token was drawn: `rows` requests with their own generators, `rounds` steps."""
    generators = [torch.Generator().manual_seed(1000 + i) for i in range(rows)]
    counts = torch.zeros(len(logits))
    sampler = Sampler()
    for _ in range(rounds):
        tokens = sampler(logits.expand(rows, -1).clone(), [params] * rows, generators).token_ids
        counts += torch.bincount(torch.tensor(tokens), minlength=len(logits))
    return counts


def assert_frequencies(counts: torch.Tensor, expected: torch.Tensor) -> None:
    total = counts.sum().item()
    for token, (count, p) in enumerate(zip(counts.tolist(), expected.tolist())):
        if p == 0:
            assert count == 0, f"token {token} has probability 0 but was drawn {count:.0f} times"
            continue
        sd = math.sqrt(total * p * (1 - p))
        assert abs(count - total * p) <= 5 * sd, \
            f"token {token}: drawn {count:.0f} times of {total:.0f}, expected {total * p:.0f} ± " \
            f"{5 * sd:.0f}"


def renormalised(probs: torch.Tensor, keep: list[int]) -> torch.Tensor:
    kept = torch.zeros_like(probs)
    kept[keep] = probs[keep]
    return kept / kept.sum()


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_samples_the_softmax_of_logits_over_temperature(temperature):
    assert_frequencies(draw(SamplingParams(temperature=temperature)),
                       (LOGITS / temperature).softmax(-1))


def test_top_k_keeps_the_k_most_likely_tokens_in_proportion():
    probs = LOGITS.softmax(-1)
    assert_frequencies(draw(SamplingParams(top_k=3)), renormalised(probs, [0, 1, 2]))


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p():
    probs = (LOGITS / 0.7).softmax(-1)
    # the three most likely hold 0.84 of the mass at temperature 0.7 and the two most likely 0.70
    # (< 0.8), so top_p=0.8 keeps exactly three
    assert probs[:2].sum() < 0.8 < probs[:3].sum()
    assert_frequencies(draw(SamplingParams(temperature=0.7, top_p=0.8)),
                       renormalised(probs, [0, 1, 2]))


def test_top_p_is_applied_to_the_top_k_renormalised():
    probs = LOGITS.softmax(-1)
    top3 = renormalised(probs, [0, 1, 2])
    # renormalised over the top 3, two tokens reach 0.8; over the whole vocabulary they would not
    assert top3[:2].sum() >= 0.8 > probs[:2].sum()
    assert_frequencies(draw(SamplingParams(top_k=3, top_p=0.8)), renormalised(probs, [0, 1]))


def test_tokens_in_a_shuffled_vocabulary_keep_their_probabilities():
    """The draw runs over token ids in order: the most likely token sitting last must not matter."""
    order = torch.tensor([5, 7, 0, 3, 6, 1, 4, 2])
    shuffled = LOGITS[order]
    assert_frequencies(draw(SamplingParams(), logits=shuffled), shuffled.softmax(-1))
    assert_frequencies(draw(SamplingParams(top_k=2), logits=shuffled),
                       renormalised(shuffled.softmax(-1), [2, 5]))


def test_a_mixed_batch_gives_each_row_its_own_distribution():
    """Greedy, plain and top-k rows in one call: each row gets what its own parameters promise."""
    settings = [SamplingParams(temperature=0), SamplingParams(), SamplingParams(top_k=2)]
    rows = 600
    generators = [torch.Generator().manual_seed(i) for i in range(rows)]
    params = [settings[i % 3] for i in range(rows)]
    sampler = Sampler()
    counts = torch.zeros(3, len(LOGITS))
    for _ in range(30):
        tokens = sampler(LOGITS.expand(rows, -1).clone(), params, generators).token_ids
        for i, token in enumerate(tokens):
            counts[i % 3, token] += 1
    probs = LOGITS.softmax(-1)
    assert counts[0, 0] == counts[0].sum()          # greedy: always the argmax
    assert_frequencies(counts[1], probs)
    assert_frequencies(counts[2], renormalised(probs, [0, 1]))


def test_a_token_of_probability_zero_is_never_drawn():
    logits = torch.tensor([float("-inf"), 0.0, float("-inf"), 0.0, float("-inf")])
    counts = draw(SamplingParams(), logits=logits, rows=200, rounds=10)
    assert counts[[0, 2, 4]].sum() == 0 and counts[[1, 3]].min() > 800


def test_logprobs_come_to_the_host_in_one_copy_and_match_each_row_alone(monkeypatch):
    """Sampler.logprobs reads the whole batch with one device-to-host copy (not one per row), and
    each row's values are those of its own log_softmax and topk."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=generator) * 3
    tokens = torch.randint(0, 50, (6,), generator=generator)
    wanted = [0, 3, None, 5, 1, 20]
    params = [SamplingParams(logprobs=w) for w in wanted]
    copies = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: copies.append(self.shape) or
                        tolist(self))
    result = Sampler.logprobs(logits, tokens, params)
    monkeypatch.undo()
    assert len(copies) == 1
    for row, w in enumerate(wanted):
        if w is None:
            assert result[row] is None
            continue
        logprobs = logits[row].float().log_softmax(dim=-1)
        values, ids = logprobs.topk(max(w, 1))
        expected = dict(zip(ids[:w].tolist(), values[:w].tolist()))
        expected.setdefault(int(tokens[row]), logprobs[tokens[row]].item())   # as vLLM's
        assert result[row][0] == logprobs[tokens[row]].item()
        assert result[row][1] == expected
        assert list(result[row][1])[:w] == ids[:w].tolist()      # in rank order


def test_seeded_draws_are_pinned():
    """Each seeded row draws one uniform per step from its own generator: the tokens below were
    drawn by this sampler, and any change to how a seed maps to tokens shows here."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 100, generator=generator) * 2
    settings = [(1.0, -1, 1.0, 1), (0.7, 10, 1.0, 2), (1.3, -1, 0.8, 3), (0, -1, 1.0, 4),
                (1.0, 5, 0.5, 5), (0.5, -1, 1.0, 6)]
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=s) for t, k, p, s in settings]
    generators = [torch.Generator().manual_seed(p.seed) for p in params]
    drawn = [Sampler.sample(logits, params, generators).tolist() for _ in range(3)]
    assert drawn == [[70, 57, 1, 7, 46, 83], [44, 25, 13, 7, 31, 75], [44, 59, 22, 7, 46, 92]]

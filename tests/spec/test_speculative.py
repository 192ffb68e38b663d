"""Speculative decoding's proposer and acceptance rule, on their own.

The acceptance rule must leave the output distribution equal to the target model's: a
chi-square test over a tiny vocabulary checks it for a draft model and for prompt lookup, and
shows that a rule which accepts without checking fails the same test.
"""

import pytest
import torch
from spec_common import SIGNIFICANCE, TARGET, acceptance_stream, chi_square_p_value

from minicb.params import SamplingParams
from minicb.spec import accept, propose_ngram, target_probs


# ---------------------------------------------------------------- prompt lookup
def test_ngram_proposes_what_followed_the_last_match():
    #        0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 5, 6, 7, 1, 5, 6, 7]
    # the suffix (5, 6, 7) occurred at 0 and at 5; the later one was followed by 1, 5, 6
    assert propose_ngram(tokens, k=3, min_n=2, max_n=3) == [1, 5, 6]


def test_ngram_prefers_the_longest_match():
    # the 2-gram (3, 4) last occurred at 6 (followed by 9); the 3-gram (2, 3, 4) only at 1
    tokens = [0, 2, 3, 4, 7, 7, 3, 4, 9, 2, 3, 4]
    assert propose_ngram(tokens, k=1, min_n=2, max_n=3) == [7]
    assert propose_ngram(tokens, k=1, min_n=2, max_n=2) == [9]


def test_ngram_stops_at_the_end_and_misses_cleanly():
    assert propose_ngram([1, 2, 3, 1, 2], k=5, min_n=2, max_n=2) == [3, 1, 2]
    assert propose_ngram([1, 2, 3, 4], k=4) == []
    assert propose_ngram([7], k=4) == []
    assert propose_ngram([1, 2, 1, 2], k=0) == []


# ---------------------------------------------------------------- greedy acceptance
def _logits_preferring(tokens, vocab=8):
    logits = torch.zeros(len(tokens), vocab)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


@pytest.mark.parametrize("proposed, target, expected", [
    ([3, 4, 5], [3, 4, 5, 6], [3, 4, 5, 6]),     # all accepted, plus the bonus token
    ([3, 4, 5], [3, 1, 5, 6], [3, 1]),           # the first disagreement is replaced
    ([3, 4, 5], [2, 4, 5, 6], [2]),              # nothing accepted: still one token
    ([], [7], [7]),                              # no proposal: an ordinary decode
])
def test_greedy_keeps_the_longest_agreeing_prefix(proposed, target, expected):
    out = accept(_logits_preferring(target), proposed, SamplingParams(temperature=0))
    assert out == expected


def test_wrong_number_of_logit_rows_is_refused():
    with pytest.raises(ValueError, match="k \\+ 1"):
        accept(torch.zeros(2, 8), [1, 2], SamplingParams(temperature=0))


# ---------------------------------------------------------------- sampled acceptance
def _accept_without_checking(logits, proposed, params, generator, draft_probs):
    """The classic bug: trust the draft, take the target's token only after the proposals."""
    return list(proposed) + [int(torch.multinomial(TARGET, 1, generator=generator))]


@pytest.mark.parametrize("deterministic_proposer", [False, True],
                         ids=["draft-model", "prompt-lookup"])
def test_rejection_sampling_keeps_the_target_distribution(deterministic_proposer):
    first, everything = acceptance_stream(accept, deterministic_proposer=deterministic_proposer)
    assert chi_square_p_value(first, TARGET) > SIGNIFICANCE
    assert chi_square_p_value(everything, TARGET) > SIGNIFICANCE
    # and the draft was really used: more than one token per step on average
    assert everything.sum() > 1.2 * first.sum()


def test_accepting_without_checking_fails_the_same_test():
    first, everything = acceptance_stream(_accept_without_checking)
    assert chi_square_p_value(first, TARGET) < SIGNIFICANCE
    assert chi_square_p_value(everything, TARGET) < SIGNIFICANCE


def test_sampled_acceptance_is_reproducible_from_the_seed():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=0.8, top_k=20, seed=1)
    runs = [accept(logits, [1, 2, 3], params, torch.Generator().manual_seed(9)) for _ in range(2)]
    assert runs[0] == runs[1]


def test_target_probs_applies_top_k_like_the_sampler():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    probs = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert probs[0, 0] == 0 and probs[0, 3] == 0
    assert torch.allclose(probs.sum(dim=-1), torch.ones(1))
    kept = torch.tensor([4.0, 3.0]).softmax(dim=0)
    assert torch.allclose(probs[0, [1, 2]], kept)


# ---------------------------------------------------------------- the shipped draft model
def test_the_draft_model_shares_the_tokenizer_and_agrees_with_the_default_model():
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minicb.model.default import default_model_path, draft_model_path

    target_dir, draft_dir = Path(default_model_path()), Path(draft_model_path())
    assert (draft_dir / "tokenizer.json").read_bytes() == (target_dir /
                                                           "tokenizer.json").read_bytes()
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    assert draft.num_parameters() * 3 < target.num_parameters()
    assert draft.config.vocab_size == target.config.vocab_size
    prompt = tok.encode("def read_config(path):\n    \"\"\"Read a config file.\"\"\"\n")
    with torch.no_grad():
        out = target.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False,
                              pad_token_id=tok.pad_token_id)[0].tolist()
        predicted = draft(torch.tensor([out])).logits[0].argmax(dim=-1).tolist()
    completion = out[len(prompt):]
    agree = [predicted[len(prompt) - 1 + j] == t for j, t in enumerate(completion)]
    # a draft that agreed this rarely would slow decoding down instead of speeding it up
    assert sum(agree) / len(agree) > 0.4, f"draft agreed on {sum(agree)} of {len(agree)} tokens"


def test_tokens_per_step_counts_accepted_runs_plus_one():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from evaluate_draft_model import ngram_tokens_per_step, tokens_per_step

    # agreement T T F T T T with k = 2: a step takes T T and the target's token, then T T and one
    assert tokens_per_step([True, True, False, True, True, True], k=2) == 6 / 2
    assert tokens_per_step([False] * 4, k=4) == 1.0
    # a completion that repeats the prompt is proposed in full by prompt lookup
    assert ngram_tokens_per_step([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], k=4) > 1.5

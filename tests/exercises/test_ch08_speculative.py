"""Chapter 08: prompt lookup and the acceptance rule, alone and inside the real engine."""

from __future__ import annotations

import random

import pytest
import torch
from adapter import chapter, run_docstring_examples
from engine_probe import generate_completions
from reference import compare, hf_greedy
from spec_common import SIGNIFICANCE, TARGET, acceptance_stream, chi_square_p_value

import minicb.runner.model_runner
import minicb.scheduler.continuous
import minicb.spec
from minicb import LLM, SamplingParams
from minicb.model.default import default_model_path

ch08 = chapter("08")


def test_ch08_worked_examples():
    run_docstring_examples(ch08)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ch08_proposer_behaves_like_minicbs(seed):
    """Random sequences over a small vocabulary (so n-grams repeat), every k and n range."""
    rng = random.Random(seed)
    for case in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randint(1, 24))]
        k, min_n = rng.randint(0, 6), rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        expected = minicb.spec.propose_ngram(tokens, k, min_n, max_n)
        got = ch08.propose_ngram(tokens, k, min_n, max_n)
        assert got == expected, (
            f"propose_ngram({tokens}, k={k}, min_n={min_n}, max_n={max_n}) should propose "
            f"{expected}, yours proposed {got} (case {case}). The match is the most recent "
            "earlier one, for the longest n that matches at all.")


def test_ch08_greedy_accept_behaves_like_minicbs():
    rng, generator = random.Random(5), torch.Generator().manual_seed(5)
    greedy = SamplingParams(temperature=0)
    for case in range(300):
        k = rng.randint(0, 5)
        logits = torch.randn(k + 1, 16, generator=generator)
        target = logits.argmax(dim=-1).tolist()
        agree = rng.randint(0, k)              # the proposal agrees for a while, then may not
        proposed = target[:agree] + [rng.randrange(16) for _ in range(k - agree)]
        expected = minicb.spec.accept(logits, proposed, greedy)
        got = ch08.accept(logits, proposed, greedy)
        assert got == expected, (
            f"case {case}: proposed {proposed}, the target's argmax at each row {target}: "
            f"accept should emit {expected}, yours emitted {got}. Keep the longest prefix that "
            "equals the argmax, then add the argmax at the first row that disagreed (or after "
            "the last proposal).")
    with pytest.raises(ValueError):
        ch08.accept(torch.zeros(2, 8), [1, 2], greedy)


# ---------------------------------------------------------------- the sampled rule
@pytest.mark.parametrize("proposer", ["draft-model", "prompt-lookup"])
def test_ch08_sampled_accept_keeps_the_target_distribution(proposer):
    """The target's distribution is the same at every position, so its own samples would be
    independent draws from TARGET: the first token of each step, and all tokens emitted, must
    pass the chi-square test minicb's own rule passes (seeded, so the verdict is deterministic)."""
    first, everything = acceptance_stream(ch08.accept,
                                          deterministic_proposer=proposer == "prompt-lookup")
    for name, counts in [("the first token of each step", first), ("every token", everything)]:
        p_value = chi_square_p_value(counts, TARGET)
        assert p_value > SIGNIFICANCE, (
            f"{name}: counts {counts.long().tolist()} over {int(counts.sum())} tokens, expected "
            f"proportions {TARGET.tolist()}; chi-square p = {p_value:.2g} < {SIGNIFICANCE}. "
            "Accept with probability min(1, p/q); on rejection draw from max(0, p - q).")
    assert everything.sum() > 1.2 * first.sum(), "the proposals were (almost) never accepted"


# ---------------------------------------------------------------- inside the engine
HEADS = ["def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(",
         "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self",
         "import os\n\n\ndef list_python_files(root):\n"]


def test_ch08_real_engine_with_your_rule_equals_transformers(monkeypatch):
    """The shipped model speculating with your proposer and your rule: the same greedy tokens as
    transformers, proposals accepted, and every KV block free at the end."""
    counts = {"proposed": 0, "accepted": 0}

    def counting_accept(logits, proposed, params, generator=None, draft_probs=None):
        kept = ch08.accept(logits, proposed, params, generator, draft_probs)
        counts["proposed"] += len(proposed)
        counts["accepted"] += max(len(kept) - 1, 0)
        return kept

    monkeypatch.setattr(minicb.scheduler.continuous, "propose_ngram", ch08.propose_ngram)
    monkeypatch.setattr(minicb.runner.model_runner, "accept", counting_accept)
    path = default_model_path()
    llm = LLM(path, speculative_method="ngram", num_speculative_tokens=4, block_size=4,
              num_kv_blocks=128, max_model_len=256)
    prompts = [llm.llm_engine.tokenizer.encode(h, add_special_tokens=False) for h in HEADS]
    max_tokens = [40] * len(prompts)
    completions = generate_completions(llm, prompts, max_tokens)
    for index, (reference, completion) in enumerate(zip(hf_greedy(path, prompts, max_tokens),
                                                        completions)):
        compare(reference, completion.token_ids, completion.logprobs, f"prompt {index}")
    assert counts["proposed"] > 0, "the engine never proposed: your propose_ngram found nothing"
    assert counts["accepted"] > 0, "no proposal was ever accepted: speculation bought nothing"
    kv = llm.llm_engine.kv
    assert kv.num_free_blocks() == kv.num_blocks, \
        f"{kv.num_blocks - kv.num_free_blocks()} KV blocks still held after every request finished"

"""Speculative decoding with a draft model: a smaller model drafts k tokens, the target verifies.

Greedy outputs must equal transformers' generate token for token (the shipped model with the
shipped draft, random Llama and Qwen2 with a smaller draft of the same vocabulary), with
preemption forced and prefix caching on, the pool ending with every block free. A draft that is
the target itself must have all its proposals accepted: that holds only if the draft's own KV
(kept in the target's blocks) stays right through rollback, catch-up, preemption and prefix reuse.
Sampled requests must follow the target's distribution (a seeded chi-square test that a rule
ignoring q, or accepting without checking, fails); bad settings are refused.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import Counter

import pytest
import torch
from reference import check_all, compare, hf_greedy, run_with_arrivals
from spec_common import SIGNIFICANCE, chi_square_p_value
from test_speculative_engine import (
    blocks_cover_only_computed_tokens,
    check_budget_and_batch_size,
    repeating_workload,
)

import minicb.runner.model_runner
from minicb import LLM, SamplingParams
from minicb.config import EngineConfig
from minicb.runner.sampler import Sampler
from minicb.spec import accept, target_probs

DRAFT = dict(speculative_method="draft_model", num_speculative_tokens=3)


def _save_first_layer(target: str, path) -> str:
    """A smaller model of the target's architecture and vocabulary: its first layer alone, with
    its embeddings, final norm and head (a layer-skipping draft, so its choices often agree)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    values = model.config.to_dict()
    values["num_hidden_layers"] = 1
    if "layer_types" in values:            # Qwen2 names each layer's attention kind
        values["layer_types"] = values["layer_types"][:1]
    draft = type(model)(type(model.config).from_dict(values))
    draft.load_state_dict(model.state_dict(), strict=False)    # layers past the first: dropped
    draft.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def draft_of(tmp_path_factory):
    """The smaller draft of a random target checkpoint, built once per target."""
    built: dict[str, str] = {}

    def build(target: str) -> str:
        if target not in built:
            built[target] = _save_first_layer(target, tmp_path_factory.mktemp("draft"))
        return built[target]

    return build


def _run(llm, prompts, max_tokens, arrivals):
    return run_with_arrivals(llm, prompts, max_tokens, arrivals,
                             after_step=blocks_cover_only_computed_tokens)


def _assert_equal_and_free(llm, references, outputs):
    verdicts = check_all(references, outputs)
    assert verdicts.count("equal") >= len(references) - 1, verdicts
    engine = llm.llm_engine
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked"


@pytest.mark.parametrize("setting", ["plain", "preempt+prefix"])
def test_greedy_with_a_draft_model_equals_transformers(tiny_model, draft_of, setting):
    prompts, max_tokens, arrivals = repeating_workload()
    references = hf_greedy(tiny_model, prompts, max_tokens)
    extra = dict(num_kv_blocks=16, enable_prefix_caching=True) if setting != "plain" else {}
    llm = LLM(tiny_model, max_num_seqs=6, max_num_batched_tokens=128, max_model_len=320,
              block_size=8, speculative_model=draft_of(tiny_model), **DRAFT, **extra)
    outputs = _run(llm, prompts, max_tokens, arrivals)
    _assert_equal_and_free(llm, references, outputs)
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0, "no draft token accepted"
    if setting != "plain":
        engine = llm.llm_engine
        assert engine.scheduler.num_preemptions > 0, "the small pool forced no preemption"
        assert engine.kv.prefix_stats().hit_tokens > 0, "no prefix was reused"


def test_the_target_as_its_own_draft_has_every_proposal_accepted(tiny_llama):
    """Same weights, so every greedy draft token is the target's own choice, unless the draft's
    KV went wrong: not caught up after a step that accepted everything, stale after a rollback,
    missing after preemption, or never computed in a block claimed from the prefix cache."""
    prompts, max_tokens, arrivals = repeating_workload(seed=5)
    references = hf_greedy(tiny_llama, prompts, max_tokens)
    llm = LLM(tiny_llama, max_num_seqs=6, max_num_batched_tokens=128, max_model_len=320,
              block_size=8, num_kv_blocks=16, enable_prefix_caching=True,
              speculative_model=tiny_llama, **DRAFT)
    outputs = _run(llm, prompts, max_tokens, arrivals)
    _assert_equal_and_free(llm, references, outputs)
    proposed = sum(o.metrics.num_proposed_tokens for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert proposed > 0 and accepted >= 0.98 * proposed, (accepted, proposed)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert llm.llm_engine.kv.prefix_stats().hit_tokens > 0


def test_parallel_samples_copy_the_draft_kv_on_write(tiny_llama):
    """n = 2 samples share their prompt's blocks and copy the last, partly filled one before
    writing: the draft's half of that block must be copied too, or the second sample's draft
    would read zeros there and its proposals would be rejected."""
    prompts, _, _ = repeating_workload(4, seed=6)
    # the samples share all but the last prompt token: leave their last shared block partly full
    prompts = [p[:-2] if (len(p) - 1) % 8 == 0 else p for p in prompts]
    llm = LLM(tiny_llama, max_num_seqs=8, block_size=8, speculative_model=tiny_llama, **DRAFT)
    engine = llm.llm_engine
    params = SamplingParams(n=2, max_tokens=24, temperature=0, ignore_eos=True)
    samples = [engine.add_request(str(i), p, params) for i, p in enumerate(prompts)]
    while engine.has_unfinished_requests():
        engine.step()
    references = hf_greedy(tiny_llama, prompts, [24] * len(prompts))
    for reference, pair in zip(references, samples):
        for sample in pair:
            assert compare(reference, sample.output_token_ids, None, "sample") == "equal"
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks
    for sample in (s for pair in samples for s in pair):      # each sample's own counts
        assert sample.num_proposed_tokens > 0, sample
        assert sample.num_accepted_tokens >= 0.95 * sample.num_proposed_tokens, (
            sample, sample.num_accepted_tokens, sample.num_proposed_tokens)


def test_verification_counts_against_the_token_budget(tiny_llama, draft_of):
    """The k + 1 verification tokens count against max_num_batched_tokens; more running
    requests than speculative_disable_by_batch_size turn the proposals off."""
    check_budget_and_batch_size(tiny_llama, dict(speculative_model=draft_of(tiny_llama), **DRAFT))


def test_default_model_with_the_shipped_draft_equals_transformers():
    """The shipped model and its shipped draft (the default speculative_model) on code prompts,
    with a pool small enough to preempt and prefix caching on."""
    from minicb.model.default import default_model_path

    path = default_model_path()
    heads = ["def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(",
             "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self",
             "import os\n\n\ndef list_python_files(root):\n", "x = ["]
    llm = LLM(path, max_num_seqs=4, max_num_batched_tokens=64, block_size=8, num_kv_blocks=14,
              enable_prefix_caching=True, speculative_method="draft_model")
    prompts = [llm.tokenizer.encode(h, add_special_tokens=False) for h in heads]
    prompts.append(prompts[0])                  # a repeat, for the prefix cache
    max_tokens = [40, 40, 32, 16, 24]
    references = hf_greedy(path, prompts, max_tokens)
    outputs = _run(llm, prompts, max_tokens, [0, 0, 0, 0, 30])
    _assert_equal_and_free(llm, references, outputs)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert llm.llm_engine.kv.prefix_stats().hit_tokens > 0
    metrics = outputs[0].metrics
    assert metrics.num_accepted_tokens > 0 and metrics.mean_accepted_length > 1, vars(metrics)


def test_abort_during_draft_speculation_frees_everything(tiny_llama, draft_of):
    prompts, _, arrivals = repeating_workload(8, seed=4)
    llm = LLM(tiny_llama, max_num_seqs=4, max_num_batched_tokens=64,
              speculative_model=draft_of(tiny_llama), **DRAFT)
    outputs = run_with_arrivals(llm, prompts, [40] * len(prompts), arrivals,
                                aborts={2: 16, 5: 20})
    assert {o.outputs[0].finish_reason for o in outputs[2:6:3]} == {"abort"}
    assert sum(o.metrics.num_proposed_tokens for o in outputs) > 0
    engine = llm.llm_engine
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked after aborts"


# ------------------------------------------------------------ the sampled distribution
TINY_VOCAB, PROMPT, SAMPLES = 8, [3, 5, 1, 6], 3000


def _tiny(path, layers: int, seed: int, context: int = 64) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=context, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():       # logits far from flat, so a wrong rule moves the counts
        model.lm_head.weight.mul_(5.0)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_vocab_pair(tmp_path_factory):
    return (_tiny(tmp_path_factory.mktemp("target8"), 2, 0),
            _tiny(tmp_path_factory.mktemp("draft8"), 1, 1))


def _exact_second_and_third(target: str) -> torch.Tensor:
    """The target's own probability of each (second, third) output token pair after PROMPT,
    summed over the first: every sequence of three tokens, scored by transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target).eval()
    triples = torch.cartesian_prod(*[torch.arange(TINY_VOCAB)] * 3)
    ids = torch.cat([torch.tensor(PROMPT).expand(len(triples), -1), triples], dim=1)
    with torch.no_grad():
        logprobs = model(ids).logits.double().log_softmax(-1)
    start = len(PROMPT) - 1
    joint = sum(logprobs[torch.arange(len(ids)), start + i, triples[:, i]] for i in range(3)).exp()
    return joint.reshape(TINY_VOCAB, TINY_VOCAB * TINY_VOCAB).sum(0)


def _sampled_pairs(target: str, draft: str) -> torch.Tensor:
    """Counts of the (second, third) tokens over SAMPLES seeded requests: the first comes from
    the prompt's step, the next two from one verification of two draft tokens."""
    llm = LLM(target, max_num_seqs=64, speculative_model=draft,
              speculative_method="draft_model", num_speculative_tokens=2)
    params = [SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True, seed=i)
              for i in range(SAMPLES)]
    outputs = llm.generate([PROMPT] * SAMPLES, params, use_tqdm=False)
    assert sum(o.metrics.num_verify_steps for o in outputs) >= SAMPLES
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert accepted > 0, "no draft token was accepted"
    assert accepted < 2 * SAMPLES or accept is not minicb.runner.model_runner.accept, \
        "every draft token was accepted: the rule's rejection branch never ran"
    pairs = Counter(o.outputs[0].token_ids[1] * TINY_VOCAB + o.outputs[0].token_ids[2]
                    for o in outputs)
    return torch.tensor([pairs[i] for i in range(TINY_VOCAB ** 2)], dtype=torch.float64)


def _p_value(counts: torch.Tensor, exact: torch.Tensor) -> float:
    """Chi-square over the pairs expected at least five times; the rarer ones pooled in one cell."""
    common = exact * SAMPLES >= 5
    if not common.all():
        counts = torch.cat([counts[common], counts[~common].sum().reshape(1)])
        exact = torch.cat([exact[common], exact[~common].sum().reshape(1)])
    return chi_square_p_value(counts, exact / exact.sum())


# Two broken rules the test must catch. (A rule that ignores q, treating a sampled proposal x as
# certain, is not one: accepting x with probability p(x) and otherwise drawing from p without x
# still emits exactly p, only less often accepting; so it is no mutant of the distribution.)
def _resampling_from_p(logits, proposed, params, generator=None, draft_probs=None):
    """On a rejection, draw from p itself instead of max(0, p - q): the tokens the draft
    proposes too often come out too often."""
    p = target_probs(logits, params)
    for i, token in enumerate(proposed):
        ratio = float(p[i, token] / draft_probs[i, token])
        if torch.rand(1, generator=generator, dtype=torch.float64).item() >= ratio:
            return list(proposed[:i]) + Sampler.draw(p[i:i + 1], [generator]).tolist()
    return list(proposed) + Sampler.draw(p[-1:], [generator]).tolist()


def _without_checking(logits, proposed, params, generator=None, draft_probs=None):
    return list(proposed) + accept(logits[-1:], [], params, generator)


@pytest.mark.parametrize("rule,passes", [(accept, True), (_resampling_from_p, False),
                                         (_without_checking, False)])
def test_sampled_tokens_follow_the_target(tiny_vocab_pair, monkeypatch, rule, passes):
    target, draft = tiny_vocab_pair
    monkeypatch.setattr(minicb.runner.model_runner, "accept", rule)
    p_value = _p_value(_sampled_pairs(target, draft), _exact_second_and_third(target))
    assert (p_value > SIGNIFICANCE) == passes, p_value


# ------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("knobs,words", [
    (dict(speculative_method="ngram", speculative_model="x"), "speculative_model='x' do not"),
    (dict(speculative_method="draft_model", prompt_lookup_max=6), "prompt_lookup_max=6 do not"),
    (dict(speculative_model="x"), "only apply with speculative_method"),
])
def test_bad_draft_settings_are_refused(knobs, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(**knobs)


def test_the_draft_flags_come_from_the_config():
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    args = parser.parse_args(["--speculative-method", "draft_model", "--speculative-model", "d"])
    config = EngineConfig(**EngineConfig.knobs_from_cli(args))
    assert (config.speculative_method, config.speculative_model) == ("draft_model", "d")


def test_a_random_model_needs_its_draft_named(tiny_llama):
    with pytest.raises(ValueError, match="needs speculative_model"):
        LLM(tiny_llama, speculative_method="draft_model")


def test_a_draft_of_another_vocabulary_is_refused(tiny_llama, tiny_vocab_pair):
    with pytest.raises(ValueError, match="vocabulary of 8 tokens .* has 512"):
        LLM(tiny_llama, speculative_method="draft_model", speculative_model=tiny_vocab_pair[1])


def test_a_draft_with_another_tokenizer_is_refused(tmp_path):
    from minicb.model.default import draft_model_path

    shutil.copytree(draft_model_path(), tmp_path / "draft")
    tokenizer = json.loads((tmp_path / "draft" / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]          # two ids swapped: the same size, other text
    (tmp_path / "draft" / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match="another tokenizer"):
        LLM(speculative_method="draft_model", speculative_model=str(tmp_path / "draft"))


def test_a_draft_with_a_shorter_context_is_refused(tiny_vocab_pair, tmp_path):
    draft = _tiny(tmp_path, 1, 1, context=32)
    with pytest.raises(ValueError, match="reads at most 32 tokens but max_model_len is 64"):
        LLM(tiny_vocab_pair[0], speculative_method="draft_model", speculative_model=draft)

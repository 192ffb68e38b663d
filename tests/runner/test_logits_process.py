"""Penalties and filters (minicb.runner.logits_process) against transformers' LogitsProcessors on
the same logits and histories, rows that ask for nothing untouched bit for bit, and every setting's
validation naming the field."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from minicb.params import SamplingParams
from minicb.runner.logits_process import LogitsState, apply_logits_processors
from minicb.runner.sampler import Sampler

VOCAB = 64
EOS = 2


def batch(histories: list[tuple[list[int], list[int]]], params: list[SamplingParams],
          seed: int = 0) -> tuple[torch.Tensor, list[LogitsState | None]]:
    """Random logits [rows, VOCAB] and each row's state after its prompt and output tokens."""
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    states = []
    for (prompt, output), p in zip(histories, params):
        state = LogitsState(p, prompt, VOCAB, [EOS] + p.stop_token_ids)
        for token in output:
            state.accept(token)
        states.append(state)
    return logits, states


HISTORIES = [([5, 6, 7, 5], [9, 9, 10]), ([1, 2, 3], [3, 3, 3, 4]), ([11], []), ([8, 8], [8])]


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_equals_transformers(penalty):
    """Over prompt + output tokens, divide positive logits, multiply negative ones."""
    params = [SamplingParams(repetition_penalty=penalty)] * len(HISTORIES)
    logits, states = batch(HISTORIES, params)
    ours = apply_logits_processors(logits, params, states)
    processor = RepetitionPenaltyLogitsProcessor(penalty)
    for row, (prompt, output) in enumerate(HISTORIES):
        theirs = processor(torch.tensor([prompt + output]), logits[row:row + 1].clone())
        assert torch.equal(ours[row], theirs[0]), f"row {row}"


def test_presence_and_frequency_penalties_follow_openai():
    """logit[t] -= frequency * count_out(t) + presence * [count_out(t) > 0]; prompt not counted."""
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
              SamplingParams(presence_penalty=-1.0), SamplingParams(frequency_penalty=2.0),
              SamplingParams(presence_penalty=1.5, frequency_penalty=-0.5)]
    logits, states = batch(HISTORIES, params)
    ours = apply_logits_processors(logits, params, states)
    for row, ((_, output), p) in enumerate(zip(HISTORIES, params)):
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=VOCAB).float()
        want = logits[row] - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
        torch.testing.assert_close(ours[row], want, rtol=0, atol=1e-6)
        untouched = counts == 0
        assert torch.equal(ours[row][untouched], logits[row][untouched])


def test_logit_bias_equals_transformers_sequence_bias():
    bias = {3: 5.0, 17: -100.0, 40: 0.5}
    params = [SamplingParams(logit_bias=bias)]
    logits, states = batch(HISTORIES[:1], params)
    ours = apply_logits_processors(logits, params, states)
    processor = SequenceBiasLogitsProcessor([[[token], value] for token, value in bias.items()])
    theirs = processor(torch.tensor([HISTORIES[0][0]]), logits.clone())
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_min_p_equals_transformers(temperature):
    """min_p after temperature: the tokens transformers' MinPLogitsWarper removes are removed."""
    params = [SamplingParams(min_p=0.1, temperature=temperature)] * 3
    logits, states = batch(HISTORIES[:3], params)
    ours = apply_logits_processors(logits, params, states)
    theirs = MinPLogitsWarper(0.1)(None, logits / temperature)
    assert torch.equal(ours.isinf(), theirs.isinf())
    assert ours.isinf().any() and (~ours.isinf()).sum(dim=-1).min() >= 1
    assert torch.equal(ours[~ours.isinf()], logits[~ours.isinf()])


def test_min_tokens_equals_transformers():
    """EOS and the stop token ids are masked until min_tokens tokens came out, then not."""
    params = [SamplingParams(min_tokens=4, stop_token_ids=[7])] * len(HISTORIES)
    logits, states = batch(HISTORIES, params)
    ours = apply_logits_processors(logits, params, states)
    for row, (prompt, output) in enumerate(HISTORIES):
        processor = MinNewTokensLengthLogitsProcessor(len(prompt), 4, [EOS, 7])
        theirs = processor(torch.tensor([prompt + output]), logits[row:row + 1].clone())
        assert torch.equal(ours[row], theirs[0]), f"row {row} after {len(output)} tokens"
    assert ours[0, EOS].isinf() and not ours[1, EOS].isinf()   # 3 tokens out, then 4


def test_rows_that_do_not_ask_are_untouched_bit_for_bit():
    asking = SamplingParams(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.1,
                            logit_bias={1: 3.0}, min_p=0.2, min_tokens=5, temperature=0.8)
    params = [SamplingParams(), asking, SamplingParams(temperature=0.5, top_k=3), asking]
    logits, states = batch(HISTORIES, params)
    before = logits.clone()
    ours = apply_logits_processors(logits, params, states)
    assert torch.equal(logits, before), "the raw logits (for logprobs) must stay as they were"
    for row in (0, 2):
        assert torch.equal(ours[row], logits[row]) and ours[row].data_ptr() != logits.data_ptr()
    for row in (1, 3):
        assert not torch.equal(ours[row], logits[row])
    plain = [SamplingParams()] * 4
    assert apply_logits_processors(logits, plain, [None] * 4) is logits


def test_a_row_alone_equals_the_row_in_a_batch():
    """Vectorised over the asking rows: each row's result does not depend on its neighbours."""
    params = [SamplingParams(repetition_penalty=1.5, frequency_penalty=0.4),
              SamplingParams(presence_penalty=0.7, min_tokens=10, logit_bias={4: -3.0}),
              SamplingParams(min_p=0.3, temperature=0.9, repetition_penalty=0.8),
              SamplingParams()]
    logits, states = batch(HISTORIES, params)
    together = apply_logits_processors(logits, params, states)
    for row in range(len(params)):
        alone = apply_logits_processors(logits[row:row + 1], params[row:row + 1],
                                        states[row:row + 1])
        assert torch.equal(alone[0], together[row]), f"row {row}"


def test_sampler_logprobs_are_the_raw_models():
    """The sampler draws from the processed logits, and reports the raw log-softmax (vLLM's
    default logprobs mode), the sampled token included in the dict."""
    params = [SamplingParams(temperature=0, logit_bias={5: 100.0}, logprobs=2)]
    logits, states = batch(HISTORIES[:1], params)
    out = Sampler()(logits, params, [torch.Generator()], states)
    assert out.token_ids == [5]
    chosen, top = out.logprobs[0]
    raw = logits[0].log_softmax(-1)
    assert chosen == pytest.approx(raw[5].item()) and top[5] == chosen
    assert set(top) == set(raw.topk(2).indices.tolist()) | {5}


@pytest.mark.parametrize("field,value,words", [
    ("presence_penalty", 2.5, "presence_penalty must be a finite number from -2 to 2"),
    ("frequency_penalty", float("nan"), "frequency_penalty must be"),
    ("repetition_penalty", 0, "repetition_penalty must be a finite number from 0.01"),
    ("repetition_penalty", -1.0, "repetition_penalty must be"),
    ("min_p", 1.5, "min_p must be"),
    ("min_tokens", 17, "min_tokens must be an integer from 0 to 16"),
    ("min_tokens", -1, "min_tokens must be"),
    ("logit_bias", {3: 101}, "logit_bias[3] must be a finite number from -100 to 100"),
    ("logit_bias", {-1: 1}, "logit_bias keys must be token ids"),
    ("logit_bias", [1, 2], "logit_bias must be a dict"),
    ("prompt_logprobs", 21, "prompt_logprobs must be an integer from 0 to 20"),
    ("structured_outputs", {"json": "{"}, "structured_outputs.json is not valid JSON"),
    ("structured_outputs", {"regex": "a", "choice": ["b"]}, "exactly one of"),
    ("structured_outputs", {}, "exactly one of"),
    ("structured_outputs", {"choice": []}, "structured_outputs.choice must be"),
    ("structured_outputs", {"json": [1]}, "must be a JSON schema object"),
    ("structured_outputs", {"shape": "x"}, "its fields are json, regex"),
    ("structured_outputs", "json", "must be a StructuredOutputsParams"),
])
def test_bad_settings_are_refused_naming_the_field(field, value, words):
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    assert words in str(error.value)


def test_settings_that_conflict_with_a_grammar_are_refused():
    json_object = {"json_object": True}
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(structured_outputs=json_object, ignore_eos=True)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(structured_outputs=json_object, min_tokens=2)


def test_openai_style_logit_bias_keys_are_token_ids():
    assert SamplingParams(logit_bias={"50": -100}).logit_bias == {50: -100.0}


def hf_generate(model_dir: str, prompt: list[int], max_tokens: int, **kwargs) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             do_sample=False, pad_token_id=0, **kwargs)
    return out[0, len(prompt):].tolist()


def test_the_engine_decodes_as_transformers_with_the_same_processors(tiny_llama):
    """Greedy through the engine with repetition_penalty, min_tokens and logit_bias equals
    transformers' generate with repetition_penalty, min_new_tokens and sequence_bias."""
    from minicb import LLM

    llm = LLM(tiny_llama, max_model_len=128)
    prompts = [[5, 9, 9, 40, 41, 5], [100, 101, 102], [7] * 6, [300, 2, 301]]
    bias = {17: 4.0, 2: 8.0}           # EOS pushed up: min_tokens holds it back
    params = SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.4, min_tokens=6,
                            logit_bias=bias)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        want = hf_generate(tiny_llama, prompt, 12, repetition_penalty=1.4, min_new_tokens=6,
                           sequence_bias={(t,): b for t, b in bias.items()}, eos_token_id=2)
        assert output.outputs[0].token_ids == want, prompt
    assert [len(o.outputs[0].token_ids) for o in outputs] == [7] * 4, "EOS right after min_tokens"


def test_a_logit_bias_outside_the_vocabulary_is_refused(tiny_llama):
    from minicb import LLM

    llm = LLM(tiny_llama, max_model_len=128)
    with pytest.raises(ValueError, match=r"logit_bias names token ids \[512\] outside the "):
        llm.llm_engine.add_request("bad", [5, 6], SamplingParams(logit_bias={512: 1.0}))
    assert not llm.llm_engine.has_request("bad")


def test_sampled_rows_draw_only_what_min_p_and_the_bias_leave():
    """Through the sampler, sampled: min_p removes the unlikely tokens, a -100 bias bans one."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    params = [SamplingParams(temperature=1.0, min_p=0.3, logit_bias={0: -100.0})] * 2000
    generators = [torch.Generator().manual_seed(i) for i in range(2000)]
    drawn = set(Sampler()(logits.expand(2000, -1).clone(), params, generators).token_ids)
    probs = (logits.index_put((torch.tensor([0]),), torch.tensor(-98.0))).softmax(-1)
    assert drawn == set((probs >= 0.3 * probs.max()).nonzero().flatten().tolist()) == {1, 2, 3}


def test_a_repetition_penalty_too_small_for_float32_is_refused():
    """One below float32's range becomes 0 and turns a mask's -inf into NaN: refuse it early."""
    import pytest

    from minicb.params import MIN_REPETITION_PENALTY, SamplingParams

    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=1e-46)
    SamplingParams(repetition_penalty=MIN_REPETITION_PENALTY)


def test_min_tokens_with_a_stop_id_past_the_vocabulary_still_samples():
    """A stop token id the model cannot produce needs no mask; it must not break the row (the
    server's schema fuzzing found one equal to the vocabulary size)."""
    from minicb import LLM, SamplingParams

    llm = LLM(max_model_len=64)
    vocab = llm.llm_engine.vocab_size
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, min_tokens=2, temperature=0,
                                                   stop_token_ids=[vocab, vocab + 7]),
                       use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 3, out

"""Structured outputs through the engine: every output that stopped by itself parses and
validates (jsonschema, re.fullmatch, membership) across schemas, regexes and choices, greedy and
sampled, on the shipped model and a random-weight model with the shipped tokenizer; neighbours
without a constraint are unchanged; a constraint that cannot compile is refused by name."""

from __future__ import annotations

import json
import re
import shutil
import sys

import jsonschema
import pytest
import torch

from minicb import LLM, SamplingParams
from minicb.model.loader import resolve_model_path
from minicb.params import StructuredOutputsParams
from minicb.runner.structured_outputs import StructuredOutputManager

SHIPPED = str(resolve_model_path(None))

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 6},
            "zip": {"type": "integer", "minimum": 0, "maximum": 99999}},
            "required": ["city", "zip"]}},
        "required": ["name", "address"]},
    "enum_and_array": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
        "required": ["color", "sizes"]},
    "numbers": {"type": "object", "properties": {
        "x": {"type": "number", "minimum": -10, "maximum": 10},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"}},
        "required": ["x", "n", "ok"]},
    "pattern": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "level": {"enum": [1, 2, 3]}},
        "required": ["code", "level"]},
}
REGEXES = [r"[0-9]{3}-[a-z]{2,5}", r"(yes|no), [a-z]{1,8}\.", r"def [a-z_]{1,10}\(\):"]
CHOICES = ["alpha", "beta", "gamma delta", 'quote "x"']
PROMPTS = ["def main():\n", "# a JSON object:\n", "x = ", "import json\n\ndata = "]


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> str:
    """A random-weight Llama over the shipped tokenizer's vocabulary, with its tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=4096, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, bos_token_id=0, eos_token_id=0,
                         pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("random-with-tokenizer")
    LlamaForCausalLM(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{SHIPPED}/{name}", path / name)
    return str(path)


@pytest.fixture(scope="module", params=["shipped", "random"])
def llm(request, random_model) -> LLM:
    return LLM(None if request.param == "shipped" else random_model, max_model_len=256)


def constrained(constraint: StructuredOutputsParams, greedy: bool, seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=96, temperature=0 if greedy else 1.0, seed=seed,
                          structured_outputs=constraint)


def run(llm: LLM, constraint: StructuredOutputsParams, check) -> list[str]:
    """Every prompt, greedy and three seeds sampled; every output that stopped passes `check`;
    returns the finish reasons."""
    params = [constrained(constraint, greedy, seed)
              for greedy, seed in [(True, 0), (False, 1), (False, 2), (False, 3)]]
    prompts = [p for p in PROMPTS for _ in params]
    outputs = llm.generate(prompts, params * len(PROMPTS), use_tqdm=False)
    reasons = []
    for output in outputs:
        completion = output.outputs[0]
        reasons.append(completion.finish_reason)
        if completion.finish_reason == "stop":
            check(completion.text)
        else:
            assert completion.finish_reason == "length", (completion.finish_reason, output.error)
    return reasons


def enough_stopped(reasons: list[str]) -> None:
    """The checks must have something to check: most outputs end by themselves."""
    assert reasons.count("stop") >= len(reasons) // 2, reasons


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_outputs_validate(llm, name):
    schema = SCHEMAS[name]
    params = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    enough_stopped(run(llm, params, lambda text: jsonschema.validate(json.loads(text), schema)))


def test_json_schema_given_as_text_and_any_whitespace(llm):
    schema = SCHEMAS["pattern"]
    params = StructuredOutputsParams(json=json.dumps(schema), disable_any_whitespace=False)
    reasons = run(llm, params, lambda text: jsonschema.validate(json.loads(text), schema))
    assert "stop" in reasons


def test_json_object_mode_gives_objects(llm):
    def check(text):
        assert isinstance(json.loads(text), dict)

    reasons = run(llm, StructuredOutputsParams(json_object=True, disable_any_whitespace=True),
                  check)
    assert "stop" in reasons


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_outputs_match(llm, pattern):
    def check(text):
        assert re.fullmatch(pattern, text), text

    enough_stopped(run(llm, StructuredOutputsParams(regex=pattern), check))


def test_choice_outputs_are_one_of_the_choices(llm):
    def check(text):
        assert text in CHOICES, text

    reasons = run(llm, StructuredOutputsParams(choice=CHOICES), check)
    assert reasons.count("stop") == len(reasons)


def test_grammar_outputs_match(llm):
    grammar = 'root ::= "[" item ("," item)* "]"\nitem ::= [0-9] | "x"'

    def check(text):
        assert re.fullmatch(r"\[([0-9]|x)(,([0-9]|x))*\]", text), text

    assert "stop" in run(llm, StructuredOutputsParams(grammar=grammar), check)


def test_unconstrained_neighbours_are_unchanged(llm):
    """Constrained and unconstrained requests in one batch: the unconstrained ones' tokens equal
    a run without the constrained ones, greedy and seeded."""
    free = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=24, temperature=0.9, seed=4, ignore_eos=True)]
    alone = llm.generate(PROMPTS[:2], free, use_tqdm=False)
    schema = StructuredOutputsParams(json=SCHEMAS["nested"], disable_any_whitespace=True)
    mixed_params = [constrained(schema, True, 0), free[0], constrained(schema, False, 9), free[1],
                    SamplingParams(max_tokens=24, structured_outputs={"choice": CHOICES})]
    mixed = llm.generate([PROMPTS[2], PROMPTS[0], PROMPTS[3], PROMPTS[1], PROMPTS[2]],
                         mixed_params, use_tqdm=False)
    assert mixed[1].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert mixed[3].outputs[0].token_ids == alone[1].outputs[0].token_ids
    assert mixed[4].outputs[0].text in CHOICES


def test_bounded_strings_refuse_control_characters():
    """JSON forbids raw control characters in strings; a length-bounded string must too."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 1,
                                                     "maxLength": 4}}, "required": ["a"]}
    manager = LLM(max_model_len=256).llm_engine.structured
    for text, allowed in [('{"a": "\x0b', False), ('{"a": "\t', False), ('{"a": "ab"}', True),
                          ('{"a": "abcde', False), ('{"a": ""', False)]:
        matcher = manager.matcher(StructuredOutputsParams(json=schema, disable_any_whitespace=True))
        assert matcher.matcher.accept_string(text) is allowed, text


def test_a_cut_output_ends_length():
    llm = LLM(max_model_len=256)
    params = SamplingParams(max_tokens=3, temperature=0, structured_outputs={
        "json": SCHEMAS["nested"]})
    output = llm.generate(["{"], params, use_tqdm=False)[0].outputs[0]
    assert output.finish_reason == "length" and len(output.token_ids) == 3


@pytest.mark.parametrize("constraint,words", [
    ({"regex": "(ab"}, "structured_outputs.regex cannot be compiled"),
    ({"json": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}},
     "structured_outputs.json cannot be compiled"),
    ({"grammar": "root ::= undefined_rule"}, "structured_outputs.grammar cannot be compiled"),
])
def test_a_constraint_that_cannot_compile_is_refused_and_others_go_on(constraint, words):
    llm = LLM(max_model_len=256)
    engine = llm.llm_engine
    with pytest.raises(ValueError) as error:
        engine.add_request("bad", "x", SamplingParams(structured_outputs=constraint))
    assert words in str(error.value) and "[" not in str(error.value)[:3]
    assert not engine.has_request("bad")
    ok = llm.generate(["x = "], SamplingParams(max_tokens=4, structured_outputs={
        "choice": CHOICES}), use_tqdm=False)[0]
    assert ok.outputs[0].text in CHOICES


def test_each_constraint_compiles_once(monkeypatch):
    llm = LLM(max_model_len=256)
    manager = llm.llm_engine.structured
    calls = []
    compile_one = manager._compile
    monkeypatch.setattr(manager, "_compile", lambda p: calls.append(p.key) or compile_one(p))
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    params = [SamplingParams(max_tokens=8, structured_outputs={"json": schema}),
              SamplingParams(max_tokens=8, structured_outputs={"json": dict(schema)}),
              SamplingParams(max_tokens=8, n=2, structured_outputs={"json": json.dumps(schema)}),
              SamplingParams(max_tokens=8, structured_outputs={"regex": "[ab]+"})]
    llm.generate(["x"] * 4, params, use_tqdm=False)
    assert len(calls) == 2, calls


def test_speculation_skips_constrained_requests():
    """A constrained request under speculative decoding is never given proposals (its mask would
    have to hold at every verified position), and still validates."""
    llm = LLM(max_model_len=256, speculative_method="ngram")
    schema = SCHEMAS["enum_and_array"]
    constraint = {"json": schema, "disable_any_whitespace": True}
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=48, temperature=0,
                                                   structured_outputs=constraint), use_tqdm=False)
    for output in outputs:
        assert output.metrics.num_proposed_tokens == 0
        if output.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(output.outputs[0].text), schema)


def test_without_xgrammar_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ValueError, match=r"pip install 'minicb\[structured\]'"):
        StructuredOutputManager(None, 10, [0])

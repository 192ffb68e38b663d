"""The default structured-output request, as a new user sends it, finishes valid on the shipped
model: three everyday schemas, greedy and sampled, no option beside the schema. The default
whitespace policy (compact JSON, disable_any_whitespace=True) is what makes it: with free
whitespace the shipped model drifts into runs of newlines until max_tokens in about half of
such cases, so this test fails if the default goes back to free whitespace."""

from __future__ import annotations

import json

import jsonschema
import pytest

from minicb import LLM, SamplingParams
from minicb.params import StructuredOutputsParams

CASES = [
    ({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"]},
     '# one person as JSON, e.g. {"name": "Ada", "age": 36}\nperson = '),
    ({"type": "object", "properties": {
        "title": {"type": "string"}, "date": {"type": "string", "format": "date"}},
        "required": ["title", "date"]},
     '# one event as JSON, e.g. {"title": "release", "date": "2024-05-01"}\nevent = '),
    ({"type": "object", "properties": {
        "module": {"type": "string"}, "version": {"type": "string"}, "stable": {"type": "boolean"}},
        "required": ["module", "version", "stable"]},
     '# a package as JSON, e.g. {"module": "os", "version": "1.2", "stable": true}\npackage = '),
]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(max_model_len=256)


def test_the_default_request_finishes_valid_on_the_shipped_model(llm):
    assert StructuredOutputsParams(json_object=True).disable_any_whitespace is True
    prompts, params = [], []
    for schema, prompt in CASES:
        for temperature in (0.0, 1.0):
            prompts.append(prompt)
            params.append(SamplingParams(max_tokens=128, temperature=temperature, seed=1,
                                         structured_outputs=StructuredOutputsParams(json=schema)))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    valid = 0
    for output, p in zip(outputs, params):
        completion = output.outputs[0]
        if completion.finish_reason == "stop":
            # an output that ended by itself must be a valid document, with no free whitespace
            document = json.loads(completion.text)
            jsonschema.validate(document, p.structured_outputs.json)
            assert "\n" not in completion.text, completion.text
            valid += 1
    assert valid >= 5, [o.outputs[0].text[:60] for o in outputs]

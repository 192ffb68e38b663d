"""Bad input at the door, one request's failure kept to itself, and an LLM that stays usable.

Every refusal must name the field (or knob) and say what to do; a request that still fails
inside a step ends alone (finish_reason "error") while the others finish correctly; and after
any failing call the LLM's KV pool is whole again and it serves the next call.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import minicb
import minicb.params
from minicb import LLM, SamplingParams
from minicb.runner.sampler import Sampler

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, max_model_len=128, max_num_seqs=4)


def assert_whole(llm: LLM) -> None:
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and not engine.request_ids(), ("requests were left "
                                                                               "behind")
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked"


@pytest.mark.parametrize("field, value", [("temperature", float("nan")),
                                          ("temperature", float("inf")), ("temperature", 10**400),
                                          ("temperature", True), ("temperature", -1.0),
                                          ("top_p", float("nan")), ("top_p", 0.0), ("top_p", 1.5),
                                          ("top_k", True), ("top_k", 0), ("n", True), ("n", 10**6),
                                          ("seed", True), ("seed", 2**64), ("seed", -1),
                                          ("logprobs", 10**6), ("logprobs", True),
                                          ("max_tokens", 0), ("ignore_eos", "false"), ("stop", 123),
                                          ("stop", ["a\ud800b"]), ("stop", ["x"] * 1000),
                                          ("stop_token_ids", "abc"), ("stop_token_ids", [True]),
                                          ("stop_token_ids", [-3]), ("logit_bias", {"05": 1.0}),
                                          ("logit_bias", {"\uff15": 1.0}),
                                          ("logit_bias", {5: 101}), ("presence_penalty", 2.5),
                                          ("min_tokens", 17)])
def test_bad_sampling_params_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


PACKAGE = Path(minicb.__file__).parent
BOUND = re.compile(r"^(HTTP_)?(MAX|MIN)_[A-Z0-9_]+$")


def _bounds_defined() -> dict[str, list[str]]:
    """Every module-level assignment of a MAX_* / MIN_* / HTTP_MAX_* name in the package, and
    every renaming import of one (`import MAX_X as MAX_Y`): name -> where."""
    where = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            for target in targets:
                if isinstance(target, ast.Name) and BOUND.match(target.id):
                    where[target.id].append(str(path.relative_to(PACKAGE)))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.asname and BOUND.match(alias.name):
                        where[alias.asname].append(f"{path.relative_to(PACKAGE)} (renamed)")
    return where


def test_every_bound_is_defined_once():
    """A request's ranges live in minicb.params alone; caps only the HTTP server has are named
    HTTP_MAX_* and live in minicb.serving; the HTTP modules write no bound of params as a
    literal (they import it)."""
    where = _bounds_defined()
    assert "MAX_N" in where and "HTTP_MAX_N" in where         # the scan sees the real ones
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, f"bounds defined in more than one place: {twice}"
    for name, (place,) in where.items():
        if place.startswith("serving/"):
            assert name.startswith("HTTP_MAX_"), f"{name} in {place}: name an HTTP cap HTTP_MAX_*"
        elif name.startswith("HTTP_"):
            raise AssertionError(f"{name} in {place}: HTTP caps belong to minicb.serving")
    values = {value for name, value in vars(minicb.params).items()
              if BOUND.match(name) and isinstance(value, (int, float)) and abs(value) > 2}
    for module in ("openai_protocol.py", "openai_sampling.py"):
        tree = ast.parse((PACKAGE / "serving" / module).read_text())
        sliced = {id(n) for s in ast.walk(tree) if isinstance(s, ast.Slice) for n in ast.walk(s)}
        literals = [(node.lineno, node.value) for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and type(node.value) in (int, float)
                    and node.value in values and id(node) not in sliced]
        assert not literals, f"serving/{module} repeats params' bounds as literals: {literals}"


def test_limits_of_sampling_behave_as_their_limits():
    """A temperature below float32's reach is greedy; a tiny top_p keeps only the top token; a
    top_k beyond the vocabulary keeps all of it."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    greedy = logits.argmax(dim=-1).tolist()
    sampler = Sampler()
    generators = [torch.Generator().manual_seed(i) for i in range(6)]
    for params in (SamplingParams(temperature=1e-45), SamplingParams(temperature=1.0, top_p=1e-300),
                   SamplingParams(temperature=0.7, top_p=1e-9, top_k=2**63)):
        assert sampler(logits, [params] * 6, generators).token_ids == greedy, params
    wide = sampler(logits, [SamplingParams(temperature=1.0, top_k=2**63)] * 6, generators).token_ids
    assert all(0 <= token < 50 for token in wide)


@pytest.mark.parametrize("prompts, message", [
    (None, "prompts must be"), ({}, "prompts must be"), (torch.tensor([1, 2, 3]), r"\.tolist\(\)"),
    ([torch.tensor([1, 2])], r"\.tolist\(\)"), (["a\ud800b"], "not valid text"), ([[]], "empty"),
])
def test_bad_prompts_are_refused_and_the_llm_stays_usable(llm, prompts, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompts, SamplingParams(max_tokens=2), use_tqdm=False)
    assert_whole(llm)
    again = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False)
    assert again[0].outputs[0].token_ids


def test_add_request_without_params_names_the_fix(llm):
    with pytest.raises(ValueError, match="SamplingParams"):
        llm.llm_engine.add_request("x", [1, 2, 3], None)
    assert_whole(llm)


def test_a_request_whose_sampling_fails_ends_alone(llm, monkeypatch):
    """A fault in one row's sampling ends that request with finish_reason 'error'; the others
    finish with the same tokens as when they run without it."""
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]
    params = [SamplingParams(max_tokens=6, **GREEDY),
              SamplingParams(max_tokens=6, temperature=0.9, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=6, **GREEDY)]
    alone = llm.generate([prompts[0], prompts[2]], [params[0], params[2]], use_tqdm=False)
    original = Sampler.sample

    def poisoned(logits, row_params, generators, states=None):
        if any(p.seed == 7 for p in row_params):
            raise RuntimeError("a fault in this request's sampling")
        return original(logits, row_params, generators, states)

    monkeypatch.setattr(Sampler, "sample", staticmethod(poisoned))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert outputs[1].outputs[0].finish_reason == "error" and "a fault" in outputs[1].error
    assert [outputs[0].outputs[0].token_ids, outputs[2].outputs[0].token_ids] == \
        [o.outputs[0].token_ids for o in alone]
    assert_whole(llm)


def test_after_a_step_fails_for_everyone_the_llm_is_whole_again(llm, monkeypatch):
    runner = llm.llm_engine.runner
    execute = runner.execute
    calls = {"n": 0}

    def failing_once(plan):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the device went away")
        return execute(plan)

    monkeypatch.setattr(runner, "execute", failing_once)
    with pytest.raises(RuntimeError, match="device went away"):
        llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
    assert_whole(llm)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, **GREEDY), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("knobs, names", [
    (dict(block_size=2**20), "block_size"),
    (dict(max_num_seqs=10**6, max_num_batched_tokens=10**6), "max_num_seqs"),
    (dict(num_kv_blocks=10**9), "num_kv_blocks"),])
def test_a_kv_pool_the_machine_cannot_hold_is_refused_before_allocating(knobs, names):
    with pytest.raises(ValueError, match=f"{names}.*GiB of cpu memory is free"):
        LLM(**knobs)         # the shipped model: each of these asks for more than 100 GiB


def _broken_copy(tiny_llama, tmp_path, config_change=None, weights=None) -> str:
    target = tmp_path / "model"
    shutil.copytree(tiny_llama, target)
    if config_change:
        config = json.loads((target / "config.json").read_text())
        config_change(config)
        (target / "config.json").write_text(json.dumps(config))
    if weights:
        weights(target)
    return str(target)


def _corrupt(target: Path) -> None:
    (weights,) = target.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[:100])


def _nan(target: Path) -> None:
    from safetensors.torch import load_file, save_file

    (weights,) = target.glob("*.safetensors")
    state = load_file(str(weights))
    name = sorted(state)[0]
    state[name][0] = float("nan")
    save_file(state, str(weights))


@pytest.mark.parametrize("config_change, weights, message", [
    (lambda c: c.pop("hidden_size"), None, "lacks hidden_size"),
    (lambda c: c.update(num_attention_heads=0), None, "positive integers"),
    (lambda c: c.update(intermediate_size=c["intermediate_size"] * 2), None,
     "does not match its config"),
    (None, _corrupt, "cannot read the weights in .*safetensors"),
    (None, _nan, "NaN or infinite weights"),
])
def test_a_broken_checkpoint_is_refused_naming_what_is_wrong(
    tiny_llama, tmp_path, config_change, weights, message):
    with pytest.raises(ValueError, match=message):
        LLM(_broken_copy(tiny_llama, tmp_path, config_change, weights))


def test_an_empty_model_name_or_a_missing_gpu_is_a_clear_error(tiny_llama):
    with pytest.raises(ValueError, match="names no checkpoint"):
        LLM("")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            LLM(tiny_llama, device="cuda")

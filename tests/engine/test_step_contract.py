"""One step's contract: the plan carries everything the runner reads, one definition of a decode
row, one owner for a step's results, one resolved config, one registry per family."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from minicb import LLM, EngineConfig, SamplingParams
from minicb.config import ResolvedConfig
from minicb.engine.detokenizer import IncrementalDetokenizer
from minicb.model.attention import AttentionMetadata
from minicb.plan import ModelRunnerOutput, SamplerOutput
from minicb.registry import ATTENTION_BACKENDS, KV_CACHES, SCHEDULERS
from minicb.request import RequestStatus
from minicb.runner.packing import pack
from minicb.sim import simulate
from minicb.sim.workload import fixed

GREEDY = dict(temperature=0, ignore_eos=True)


# --- the plan ------------------------------------------------------------------------------------
def test_the_runner_packs_a_step_from_the_plan_alone(tiny_llama):
    """The runner holds no KV manager, and a plan whose rows lost their Request packs the same
    tensors: everything it reads travels in the plan."""
    engine = LLM(tiny_llama, max_num_seqs=4, block_size=4).llm_engine
    assert not hasattr(engine.runner, "kv")
    for index, prompt in enumerate([[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]):
        engine.add_request(str(index), prompt, SamplingParams(max_tokens=6, **GREEDY))
    engine.step()
    engine.add_request("late", [20, 21, 22, 23, 24], SamplingParams(max_tokens=4, **GREEDY))
    for _ in range(2):                  # a mixed step (decodes + a prompt), then decodes only
        plan = engine.scheduler.schedule()
        packed = engine.runner.prepare(plan)
        detached = dataclasses.replace(plan, seqs=[dataclasses.replace(s, request=None)
                                                   for s in plan.seqs])
        again = engine.runner.prepare(detached)
        for have, want in zip(again[:4], packed[:4]):   # (the tensors and the metadata)
            if isinstance(want, AttentionMetadata):
                for name in ("slot_mapping", "cu_seqlens_q", "seq_lens", "block_tables"):
                    assert torch.equal(getattr(have, name), getattr(want, name)), name
                assert have.decode_rows == want.decode_rows
            else:
                assert torch.equal(have, want)
        for seq in plan.seqs:           # the plan's table is the KV manager's, copied
            assert seq.block_table == engine.kv.block_table(seq.request)
        engine.scheduler.update(plan, engine.runner.execute(plan))


def test_the_decode_fast_path_packs_what_the_general_path_packs(tiny_llama):
    engine = LLM(tiny_llama, max_num_seqs=4, block_size=4).llm_engine
    for index, prompt in enumerate([[5, 6, 7, 8, 9], [8, 9], [14, 15, 16, 17, 18, 19, 20]]):
        engine.add_request(str(index), prompt, SamplingParams(max_tokens=6, **GREEDY))
    engine.step()
    plan = engine.scheduler.schedule()
    assert plan.num_decode_rows == len(plan.seqs) == 3
    fast = engine.runner.prepare(plan)
    assert fast.decode is not None                       # the decode-only packer took it
    general = pack(plan, engine.config.block_size, engine.runner.pad_token_id,
                   engine.runner.device)
    for have, want in zip(general[:4], fast[:4]):
        if isinstance(want, AttentionMetadata):
            for name in ("slot_mapping", "cu_seqlens_q", "seq_lens", "block_tables"):
                assert torch.equal(getattr(have, name), getattr(want, name)), name
            assert (have.decode_rows, have.num_decode_rows) == (want.decode_rows,
                                                                 want.num_decode_rows)
        else:
            assert torch.equal(have, want)


def test_a_parallel_samples_first_step_is_a_decode_everywhere(tiny_llama):
    """The second sample shares the first one's prompt and computes only its last token: one
    query, so a decode for the plan's counts, the simulator's rows and attention alike."""
    engine = LLM(tiny_llama, max_num_seqs=4, block_size=4).llm_engine
    engine.add_request("r", [5, 6, 7, 8, 9, 10], SamplingParams(n=2, max_tokens=3, seed=1,
                                                                 temperature=1.0, ignore_eos=True))
    engine.step()                        # the first sample's prompt
    plan = engine.scheduler.schedule()
    fork = next(s for s in plan.seqs if s.request.request_id == "r-1")
    assert fork.num_tokens == 1 and fork.start == 5 and fork.is_decode
    assert plan.num_decode_rows == 2 and plan.num_prefill_tokens == 0
    meta = engine.runner.prepare(plan).meta
    assert meta.decode_rows == [s.is_decode for s in plan.seqs] and meta.num_decode_rows == 2
    engine.scheduler.update(plan, engine.runner.execute(plan))


def test_the_torch_plan_follows_its_decodes_argument():
    meta = AttentionMetadata(slot_mapping=torch.tensor([0, 1, 2, 5]),
                             cu_seqlens_q=torch.tensor([0, 1, 4], dtype=torch.int32),
                             seq_lens=torch.tensor([2, 3], dtype=torch.int32),
                             block_tables=torch.tensor([[0], [1]], dtype=torch.int32),
                             max_seqlen_q=3, max_seqlen_k=3)
    assert meta.decode_rows == [True, False] and meta.num_decode_rows == 1
    assert meta.torch_plan(4, decodes=True).decode is not None
    assert meta.torch_plan(4, decodes=False).decode is None      # not the first plan, cached
    assert meta.torch_plan(4, decodes=True).decode is not None


def test_the_simulator_counts_rows_as_the_plan_marks_them():
    """A prompt whose last chunk is one token runs that chunk as a decode (one query): the
    simulator's rows and the step counts say so."""
    result = simulate(fixed("chunks", [9], [2]), max_num_seqs=1, max_num_batched_tokens=8)
    assert [row for step in result.steps for row in step.rows][:2] == [("0", "prefill", 8),
                                                                       ("0", "decode", 1)]
    assert [(s.stats.num_prefill_tokens, s.stats.num_decode_tokens) for s in result.steps] == \
        [(8, 0), (0, 1), (0, 1)]


# --- one owner for a step's results -------------------------------------------------------
def test_update_applies_tokens_logprobs_and_errors(tiny_llama):
    engine = LLM(tiny_llama, max_num_seqs=4).llm_engine
    (ok,) = engine.add_request("ok", [5, 6, 7], SamplingParams(max_tokens=3, **GREEDY))
    (bad,) = engine.add_request("bad", [8, 9], SamplingParams(max_tokens=3, **GREEDY))
    plan = engine.scheduler.schedule()
    top = {11: -0.5}
    touched = engine.scheduler.update(plan, ModelRunnerOutput.of(SamplerOutput(
        [11, None], [(-0.5, top), None], [None, "sampling failed: boom"])))
    assert touched == [ok, bad]
    assert ok.output_token_ids == [11] and ok.logprobs == [(-0.5, top)]
    assert bad.status is RequestStatus.FINISHED_ERROR and bad.error == "sampling failed: boom"
    assert bad.output_token_ids == [] and engine.kv.block_table(bad) == []


def test_eos_stop_ids_and_lengths_are_checked_by_the_scheduler(tiny_llama):
    engine = LLM(tiny_llama, max_num_seqs=4, max_model_len=8).llm_engine
    eos = next(iter(engine.eos_token_ids))
    (by_eos,) = engine.add_request("eos", [5], SamplingParams(max_tokens=5, temperature=0))
    (by_id,) = engine.add_request("id", [5], SamplingParams(max_tokens=5, stop_token_ids=[42],
                                                            temperature=0))
    (by_len,) = engine.add_request("len", [5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=5,
                                                                                 **GREEDY))
    plan = engine.scheduler.schedule()
    engine.scheduler.update(plan, ModelRunnerOutput.of([eos, 42, 7]))
    assert (by_eos.status, by_id.status, by_len.status) == (RequestStatus.FINISHED_STOPPED,
                                                            RequestStatus.FINISHED_STOPPED,
                                                            RequestStatus.FINISHED_LENGTH)
    assert by_id.stop_reason == 42 and by_eos.stop_reason is None


class CountingTokenizer:
    """Decodes token t as the character chr(97 + t % 26); counts the tokens it decodes."""

    def __init__(self):
        self.decoded = 0

    def decode(self, token_ids, skip_special_tokens=True):
        self.decoded += len(token_ids)
        return "".join(chr(97 + t % 26) for t in token_ids)


def test_stop_strings_are_looked_for_in_the_new_text_only():
    """The work per token stays flat however long the output grows, and the stop string is
    found where a search of the whole text finds it."""
    tokenizer = CountingTokenizer()
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["xyz", "zzzz"])
    tokens = [t % 20 for t in range(2000)] + [23, 24, 25, 1, 2]     # ... then "xyzbc"
    sent = ""
    for token in tokens:
        sent += detokenizer.add([token])
        if detokenizer.stop is not None:
            break
    whole = "".join(chr(97 + t % 26) for t in tokens)
    assert detokenizer.stop == "xyz" and detokenizer.text == whole[:whole.find("xyz")]
    assert sent == detokenizer.text              # nothing past the stop string went out
    assert tokenizer.decoded < 4 * len(tokens), "each token's text was decoded a few times at most"


def test_outputs_carry_the_new_tokens_until_the_finish(tiny_llama):
    engine = LLM(tiny_llama).llm_engine
    engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=4, **GREEDY))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    running, last = outputs[:-1], outputs[-1]
    assert [o.outputs[0].token_ids for o in running] == [o.new_token_ids for o in running]
    assert all(len(o.new_token_ids) == 1 and o.metrics is None for o in running)
    assert last.finished and last.metrics is not None
    assert last.outputs[0].token_ids == [t for o in outputs for t in o.new_token_ids]


# --- one resolved config, one registry per family -----------------------------------------
def test_the_callers_config_is_never_changed_and_replace_derives_again(tiny_llama):
    asked = EngineConfig(model=tiny_llama, max_num_seqs=4, max_model_len=64)
    engine = LLM(**{f.name: getattr(asked, f.name) for f in dataclasses.fields(asked)}).llm_engine
    resolved = engine.config
    assert isinstance(resolved, ResolvedConfig) and resolved is not asked
    assert asked.num_kv_blocks is None and asked.attention == "auto"
    assert resolved.num_kv_blocks == 4 * 4 and not resolved.num_kv_blocks_given
    assert resolved.attention in ("torch", "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.num_kv_blocks = 3
    bigger = dataclasses.replace(resolved, max_num_seqs=64)
    assert bigger.num_kv_blocks == 64 * 4 and not bigger.num_kv_blocks_given
    chosen = dataclasses.replace(resolved, num_kv_blocks=10)
    assert chosen.num_kv_blocks == 10 and chosen.num_kv_blocks_given


def test_choices_and_errors_come_from_the_registries():
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    choices = {action.dest: action.choices for action in parser._actions}
    assert tuple(choices["scheduler"]) == SCHEDULERS.choices == tuple(SCHEDULERS)
    assert tuple(choices["kv_cache"]) == KV_CACHES.choices
    assert tuple(choices["attention"]) == ATTENTION_BACKENDS.choices == ("auto", "torch",
                                                                         "triton", "cpu")
    with pytest.raises(ValueError,
                       match=r"kv_cache='ring' is not one of \('contiguous', 'paged'\)"):
        EngineConfig(kv_cache="ring")


def test_a_stop_string_ends_a_static_batch_in_its_own_step():
    """The stop string is found after the scheduler's update: the batch still ends that step,
    never running a step of ghosts only."""
    engine = LLM(scheduler="static", max_num_seqs=2, max_model_len=64).llm_engine
    engine.add_request("r", "def fibonacci(n):", SamplingParams(max_tokens=30, stop=[" "],
                                                                 temperature=0))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert outputs[-1].outputs[0].finish_reason == "stop"
    assert outputs[-1].outputs[0].stop_reason == " "
    assert engine.scheduler.running == [] and engine.kv.num_used_blocks() == 0
    assert engine.scheduler.step_count == len(outputs)      # one step per token, no idle step

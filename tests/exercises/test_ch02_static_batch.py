"""Chapter 02: left padding and waste accounting, graded against transformers and minicb.sim."""

from __future__ import annotations

import pytest
import torch
from adapter import chapter, run_docstring_examples
from engine_probe import generate_ids, random_prompts, record_packed_steps
from reference import compare, hf_greedy

from minicb import LLM
from minicb.sim import simulate
from minicb.sim.workload import mixed, seed_example, three_answers

ch02 = chapter("02")
LENGTHS = [3, 11, 7]


def test_ch02_worked_examples():
    run_docstring_examples(ch02)


def test_ch02_left_padded_batch_generates_like_each_prompt_alone(tiny_model):
    """transformers' own batched generate, fed your padding and mask, must match unbatched runs."""
    from transformers import AutoModelForCausalLM

    prompts, new_tokens = random_prompts(LENGTHS, 512, seed=5), 6
    input_ids, attention_mask = ch02.left_pad(prompts, pad_id=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
    alone = hf_greedy(tiny_model, prompts, [new_tokens] * len(prompts))
    width = input_ids.shape[1]
    for row, reference in enumerate(alone):
        tops = []
        for logits in out.logits:
            values, indices = logits[row].float().log_softmax(-1).topk(5)
            tops.append(dict(zip(indices.tolist(), values.tolist())))
        got = out.sequences[row, width:].tolist()
        try:
            compare(reference, got, tops, f"row {row}")
        except AssertionError as error:
            raise AssertionError(f"{error}.\nprompt {row} alone generates {reference.token_ids}; "
                                 f"in your padded batch it generated {got}. Hint: pads go on the "
                                 "LEFT and the mask must be 0 exactly on them.\nyour input_ids: "
                                 f"{input_ids.tolist()}\nyour mask: "
                                 f"{attention_mask.tolist()}") from None


def test_ch02_padding_and_positions_match_the_static_engine(tiny_llama):
    """The static scheduler's prefill step packs the same rectangle: ids, positions, pad slots."""
    prompts = random_prompts(LENGTHS, 512, seed=6)
    input_ids, attention_mask = ch02.left_pad(prompts, pad_id=0)
    positions = ch02.padded_positions(attention_mask)
    llm = LLM(tiny_llama, scheduler="static", max_num_seqs=len(prompts), block_size=4)
    steps = record_packed_steps(llm)
    generate_ids(llm, prompts, [2] * len(prompts))
    prefill = steps[0]
    width = max(LENGTHS)
    expected_ids = prefill.input_ids.view(len(prompts), width)
    expected_positions = prefill.positions.view(len(prompts), width)
    expected_mask = (prefill.meta.slot_mapping >= 0).long().view(len(prompts), width)
    for name, got, expected in [("input_ids", input_ids, expected_ids),
                                ("attention_mask", attention_mask, expected_mask),
                                ("positions", positions, expected_positions)]:
        assert tuple(got.shape) == tuple(expected.shape) and torch.equal(got.long(), expected), (
            f"the static engine packs {name} = {expected.tolist()} for prompts of lengths "
            f"{LENGTHS}; "
            f"yours: {got.tolist()}")


@pytest.mark.parametrize("workload, batch_size", [
    (seed_example(), 4), (three_answers(), 3), (mixed(n=11, seed=3), 4), (mixed(n=9, seed=4), 2),
], ids=["seed-example-4", "three-answers-3", "mixed-11x4", "mixed-9x2"])
def test_ch02_static_stats_match_the_static_scheduler(workload, batch_size):
    got = ch02.static_batch_stats(workload.prompt_lens, workload.output_lens, batch_size)
    run = simulate(workload, scheduler="static", max_num_seqs=batch_size)
    idle = sum(1 for step in run.steps for _, kind, _ in step.rows if kind == "idle")
    expected = {
        "num_steps": run.num_steps,
        # ghosts count there too
        "num_pad_tokens": sum(step.num_pad_tokens for step in run.steps) - idle,
        "num_idle_slot_steps": idle,
        "slot_utilisation": run.slot_utilisation(),
    }
    for name, value in expected.items():
        assert getattr(got, name) == pytest.approx(value), (f"{workload.name} (prompts "
                                                            f"{workload.prompt_lens}, answers "
                                                            f"{workload.output_lens}, batch size "
                                                            f"{batch_size}): minicb's static "
                                                            f"scheduler gives {name} = {value}, "
                                                            f"yours {getattr(got, name)}. Hint: "
                                                            "one prefill step per batch already "
                                                            "yields each row's first token.")

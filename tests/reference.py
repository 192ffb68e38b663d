"""Comparing minicb with transformers token by token, and treating near-ties honestly.

The near-tie rule (after vLLM's check_logprobs_close): two greedy sequences must be identical,
except that they may part ways at a position where the two candidates are a genuine tie under
the reference: both tokens are in each side's top-5, and the reference's logprobs of the two
differ by less than NEAR_TIE (float32 kernels that sum in a different order can flip such a
choice). After that position the sequences are no longer comparable, so comparison stops there.
Every request is compared; none is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minicb import SamplingParams

NEAR_TIE = 1e-3
# bfloat16 keeps 8 significant bits: a logit between 8 and 16 is rounded to steps of 0.0625, so
# two candidates within 0.1 of each other can trade places on rounding alone
NEAR_TIE_BF16 = 0.1
TOP_K = 5


@dataclass
class Reference:
    token_ids: list[int]
    logprobs: list[dict[int, float]]    # per position: top-5 {token: logprob}


def hf_greedy(model_dir: str, prompts: list[list[int]], max_tokens: list[int],
              dtype: torch.dtype = torch.float32, prepare=None,
              **load_options) -> list[Reference]:
    """transformers' generate(do_sample=False) on each prompt alone, with top-5 logprobs, in
    `dtype`; `load_options` go to from_pretrained (experts_implementation="eager", say), and
    `prepare(model)` runs after loading if given (torchao's quantize_, say)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **load_options).eval()
    if prepare is not None:
        prepare(model)
    # ignore_eos means "do not stop at EOS", not "never pick EOS": min_new_tokens would mask EOS
    # out of the logits, so the reference simply has no EOS to stop at
    model.generation_config.eos_token_id = None
    references = []
    with torch.no_grad():
        for prompt, n in zip(prompts, max_tokens):
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 do_sample=False, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)
            tops = []
            for logits in out.logits:
                values, indices = logits[0].float().log_softmax(-1).topk(TOP_K)
                tops.append(dict(zip(indices.tolist(), values.tolist())))
            references.append(Reference(out.sequences[0, len(prompt):].tolist(), tops))
    return references


def compare(reference: Reference, token_ids: list[int], logprobs: list[dict[int, float]] | None,
            label: str, near_tie: float = NEAR_TIE) -> str:
    """Return "equal" or "near-tie at i"; raise AssertionError on any other difference."""
    assert len(token_ids) == len(reference.token_ids), \
        f"{label}: {len(token_ids)} tokens, transformers made {len(reference.token_ids)}"
    for i, (ours, theirs) in enumerate(zip(token_ids, reference.token_ids)):
        if ours == theirs:
            continue
        ref_top = reference.logprobs[i]
        our_top = logprobs[i] if logprobs else {}
        tie = (ours in ref_top and theirs in our_top
               and abs(ref_top[ours] - ref_top[theirs]) < near_tie)
        assert tie, (f"{label}: token {i} is {ours}, transformers chose {theirs} "
                     f"(reference logprobs {ref_top}); not a near-tie")
        return f"near-tie at {i}"
    return "equal"


def greedy(max_tokens: int) -> SamplingParams:
    """What every parity request asks: greedy, its full length, the top-5 logprobs compared."""
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=5)


def check_all(references: list[Reference], outputs, label: str = "request",
              near_tie: float = NEAR_TIE) -> list[str]:
    """`compare` for each request's first sample, in order: one verdict per request."""
    return [compare(ref, out.outputs[0].token_ids, out.outputs[0].logprobs, f"{label} {i}",
                    near_tie) for i, (ref, out) in enumerate(zip(references, outputs))]


def run_with_arrivals(llm, prompts, max_tokens, arrival_steps,
                      aborts: dict[int, int] | None = None, after_step=None):
    """Drive the engine step by step: request i joins before step arrival_steps[i]; request j is
    aborted before step aborts[j] (if it has not finished); `after_step(engine)`, if given, runs
    after every step (a check of the engine's state)."""
    engine, aborts = llm.llm_engine, aborts or {}
    results, step, added = {}, 0, 0
    while added < len(prompts) or engine.has_unfinished_requests():
        while added < len(prompts) and arrival_steps[added] <= step:
            engine.add_request(str(added), prompts[added], greedy(max_tokens[added]))
            added += 1
        for index, at in aborts.items():
            if (at == step and str(index) in engine.requests and
                not engine.requests[str(index)].finished):
                engine.abort(str(index))
        for output in engine.step():
            if output.finished:
                results[int(output.request_id)] = output
        if after_step is not None:
            after_step(engine)
        step += 1
    return [results[i] for i in range(len(prompts))]

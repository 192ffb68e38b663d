"""Do all systems produce the same greedy tokens? Compare, and explain every disagreement.

Greedy decoding is deterministic in exact arithmetic, but batching changes the order of
floating-point sums, so two systems can pick different tokens where the model's top two logits
are nearly tied; after that their continuations differ. vLLM's test utilities treat such
near-ties as agreement only when the logits show them; here each first disagreement is reported
with the reference model's logit margin between the two tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


@dataclass
class Mismatch:
    request: int          # index in the workload
    position: int         # first output position where the tokens differ
    expected: int | None  # the reference's token (None: the reference ended here)
    got: int | None       # the candidate's token (None: the candidate ended here)


def compare_outputs(reference: list[list[int]], candidate: list[list[int]]) -> list[Mismatch]:
    """The first differing position of every request whose tokens differ from the reference."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(candidate)} outputs to compare with {len(reference)} references; "
                         "every system must answer every request.")
    mismatches = []
    for index, (want, got) in enumerate(zip(reference, candidate)):
        if want == got:
            continue
        position = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b),
                        min(len(want), len(got)))
        mismatches.append(Mismatch(index, position,
                                   want[position] if position < len(want) else None,
                                   got[position] if position < len(got) else None))
    return mismatches


@torch.no_grad()
def logit_margin(model, prompt: list[int], prefix: list[int], expected: int, got: int) -> dict:
    """Logits of the two tokens at the point of disagreement (the model alone, no batching)."""
    ids = torch.tensor([prompt + prefix], device=model.device)
    logits = model(ids).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return {"expected_logit": logits[expected].item(), "got_logit": logits[got].item(),
            "margin": (logits[expected] - logits[got]).item(), "top2_gap": (top[0] - top[1]).item()}


def explain_mismatches(mismatches: list[Mismatch], prompts: list[list[int]],
                       reference: list[list[int]], get_model: Callable[[], object],
                       limit: int = 10) -> list[dict]:
    """Each mismatch as a dict; the first `limit` also carry the logit margin at that position."""
    explained = []
    for number, m in enumerate(mismatches):
        entry = asdict(m)
        if number < limit and m.expected is not None and m.got is not None:
            entry.update(logit_margin(get_model(), prompts[m.request],
                                      reference[m.request][:m.position], m.expected, m.got))
        explained.append(entry)
    return explained


def agreement(reference: list[list[int]], candidate: list[list[int]], prompts: list[list[int]],
              get_model: Callable[[], object]) -> dict:
    """How many requests differ from the reference, and where, with the margins explained."""
    mismatches = compare_outputs(reference, candidate)
    return {"requests": len(reference), "requests_differing": len(mismatches),
            "mismatches": explain_mismatches(mismatches, prompts, reference, get_model)}

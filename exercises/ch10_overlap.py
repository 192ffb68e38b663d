# Generated from solutions/ch10_overlap.py by scripts/make_exercises.py. Replace each
# NotImplementedError with your code, then run `make grade CH=10`.
"""Chapter 10 exercise: the bookkeeping of an overlapped loop: placeholders and late stops.

A synchronous loop makes the device wait while the host plans the next step, and the host wait
while the device computes. An overlapped loop plans step n + 1 while step n runs:

    host    plan n+1 | collect n | plan n+2 | collect n+1 | ...
    device  ......step n........ | ......step n+1........ | ...

Planning step n + 1 needs each sequence's next input token, which step n has not produced yet.
The plan names it instead: placeholder -1 - r stands for "the token row r of step n samples".
The device fills the placeholders from step n's sampled tensor before its forward pass, so the
token never has to visit the host first. The host sees step n's tokens one step late, when it
collects them, and only then can it apply the stops (EOS, max_tokens): a sequence that stopped
at step n was already launched into step n + 1, and the token it computed there must be
dropped, never reported.

`generate_overlapped` (given, at the end) is the two-stage loop: a one-thread worker runs the
steps in order, the main thread plans and collects. You write the three pieces of bookkeeping it
calls. The grader runs your loop on a fake model whose tokens depend on everything each row was
fed, and on the shipped model, and compares every output with a synchronous loop's.

Grade it: make grade CH=10
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass(eq=False)
class Seq:
    """One request, as the host knows it (two requests with the same fields are still two)."""

    prompt: list[int]
    max_tokens: int
    output: list[int] = field(default_factory=list)    # tokens the host has seen
    in_flight: int = 0          # tokens launched on the device that the host has not seen yet
    finished: bool = False      # a stop was seen (EOS or max_tokens)


def fill_placeholders(input_ids: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """The device's side: every negative id -1 - r becomes previous[r], the token row r of the
    step before sampled; ids >= 0 (tokens the host already knew) stay as they are. Returns a new
    tensor of the same shape; `input_ids` is not changed.

    >>> fill_placeholders(torch.tensor([[-2], [7], [-1]]), torch.tensor([40, 41])).tolist()
    [[41], [7], [40]]
    >>> fill_placeholders(torch.tensor([5, 6]), torch.tensor([9])).tolist()
    [5, 6]
    """
    raise NotImplementedError(
        "fill_placeholders: where input_ids < 0, previous[-1 - input_ids]; elsewhere input_ids")


def plan_next(batch: Sequence[Seq]) -> tuple[list[Seq], torch.Tensor]:
    """Plan step n + 1 while step n, whose rows are `batch` in order, is still running.

    A sequence of `batch` continues when, as far as the host knows, it may still need a token:
    it is not finished, and its output plus its tokens in flight are fewer than max_tokens (a
    sequence whose token in flight is its last is not planned again: that step would be wasted).
    Returns the continuing sequences in their order in `batch`, and the input ids of step n + 1,
    shape [len(continuing), 1]: for each, its placeholder -1 - r, r its row in step n (in
    `batch`, not in the new plan: rows move up as sequences leave). Each planned sequence now
    has one more token in flight.

    >>> a, b, c = Seq([1], 4, [3]), Seq([2], 4, [5], finished=True), Seq([3], 2, [7])
    >>> a.in_flight = b.in_flight = c.in_flight = 1      # step n computes a token for each
    >>> following, input_ids = plan_next([a, b, c])
    >>> following == [a], input_ids.tolist(), a.in_flight
    (True, [[-1]], 2)
    >>> d = Seq([4], 9, [8]); d.in_flight = 1
    >>> plan_next([b, d])[1].tolist()
    [[-2]]
    """
    raise NotImplementedError(
        "plan_next: who may need a token, each with -1 - (its row in batch)")


def collect(batch: Sequence[Seq], tokens: Sequence[int], eos: set[int]) -> None:
    """Step n's tokens reach the host, one per row of `batch`: apply them, one step late.

    Each row's token is no longer in flight. A sequence that finished after this step was
    launched discards it (it was computed past a stop: never reported). Any other appends it to
    its output, then checks its stops: the token is in `eos`, or the output reached max_tokens.

    >>> a, b = Seq([1], 3, [4]), Seq([2], 9, [6], finished=True)
    >>> a.in_flight = b.in_flight = 1
    >>> collect([a, b], [0, 8], eos={0})
    >>> a.output, a.finished, b.output, b.in_flight
    ([4, 0], True, [6], 0)
    """
    raise NotImplementedError(
        "collect: in_flight -= 1; skip a finished sequence; else append, then EOS or max_tokens")


class Device(Protocol):
    """A model with a batch of rows in its cache: what `generate_overlapped` runs steps on."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One step: input ids [rows, positions], appended to each row's cache; returns each
        row's next token, shape [rows]."""

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows of the cache, in this order (the next step's rows)."""


def _device_step(device: Device, input_ids: torch.Tensor, rows: list[int],
                 previous: Future) -> torch.Tensor:
    """Step n + 1 on the worker: step n has finished (one worker, steps in order), so its tokens
    are at hand here without the host having seen them."""
    tokens = previous.result()
    device.keep(rows)
    return device.forward(fill_placeholders(input_ids, tokens))


def generate_overlapped(prompts: Sequence[Sequence[int]], max_tokens: Sequence[int],
                        device: Device, eos: set[int]) -> list[list[int]]:
    """Greedy outputs of equal-length prompts, planning step n + 1 while step n runs (given)."""
    seqs = [Seq(list(prompt), limit) for prompt, limit in zip(prompts, max_tokens, strict=True)]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="device") as worker:
        batch = seqs
        for seq in batch:
            seq.in_flight += 1
        in_flight = worker.submit(device.forward, torch.tensor([s.prompt for s in seqs]))
        while in_flight is not None:
            following, input_ids = plan_next(batch)          # while step n runs
            launched = None
            if following:
                rows = [batch.index(seq) for seq in following]
                launched = worker.submit(_device_step, device, input_ids, rows, in_flight)
            collect(batch, in_flight.result().tolist(), eos)    # step n's tokens, one step late
            batch, in_flight = following, launched
    return [seq.output for seq in seqs]

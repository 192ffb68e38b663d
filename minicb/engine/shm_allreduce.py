"""An all-reduce between processes on one host through shared memory (the design of vLLM's CPU
all-reduce), beside gloo's.

gloo sends a message through the kernel's loopback TCP: at a decode step's few kilobytes the
time is two processes waking each other, hundreds of microseconds. Ranks on one host can instead
share memory. Each rank owns a slot of a shared buffer: it copies its tensor into its slot, then
raises its flag to the call's number; once every flag has reached that number, every rank adds
all the slots in rank order, so every rank computes the same sum, bit for bit.

Two buffers alternate between calls. A rank that finished call c and starts c + 1 writes the
other buffer, so it never overwrites a slot a slower rank is still reading for call c; and before
it can come back to the first buffer (call c + 2) it waits at call c + 1 for every rank, each of
which had finished reading call c by then.

Waiting is where the two designs differ. A rank waiting here spins on the flags (a few thousand
checks), then yields its core to the kernel's scheduler between checks, so that on a machine
with fewer free cores than ranks the rank it waits for can run. gloo's waiting rank sleeps in the
kernel instead. scripts/bench_tensor_parallel.py --collectives-only measures the two.

The flags are written after the data and read before it; x86 keeps stores in program order, which
is what makes a raised flag mean "my slot is written" (an ARM host would need a memory fence).
"""

from __future__ import annotations

import os
import time

import torch

SPINS = 2000            # flag checks before the waiting rank starts yielding its core
TIMEOUT = 60.0          # seconds a rank waits for the others before it gives up


class SharedMemoryAllReduce:
    """One rank's end: `slots` [2, ranks, numel] float32 and `flags` [ranks] int64, both in
    shared memory (`buffers`), the same tensors in every rank's process."""

    def __init__(self, rank: int, slots: torch.Tensor, flags: torch.Tensor,
                 timeout: float = TIMEOUT):
        if not (slots.is_shared() and flags.is_shared()):
            raise ValueError("the slots and flags must be in shared memory: build them with "
                             "SharedMemoryAllReduce.buffers(ranks, numel) and pass them to every "
                             "rank's process.")
        self.rank, self.ranks, self.slots = rank, slots.shape[1], slots
        self.flags = flags.numpy()
        self.calls, self.timeout = 0, timeout

    @staticmethod
    def buffers(ranks: int, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared slots (two buffers of `ranks` slots of `numel` float32) and flags."""
        return (torch.zeros(2, ranks, numel).share_memory_(),
                torch.zeros(ranks, dtype=torch.int64).share_memory_())

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Replace `tensor` (float32, at most numel values) by its sum over the ranks, in place.
        Every rank calls it, in the same order, with tensors of the same size."""
        n = tensor.numel()
        if tensor.dtype != torch.float32 or n > self.slots.shape[2]:
            raise ValueError(f"a shared-memory all-reduce takes float32 tensors of at most "
                             f"{self.slots.shape[2]} values (got {tensor.dtype}, {n}).")
        self.calls += 1
        buffer = self.slots[self.calls % 2]
        buffer[self.rank, :n].copy_(tensor.reshape(-1))
        self.flags[self.rank] = self.calls               # after the data: "my slot is written"
        checks, started = 0, 0.0
        while (self.flags < self.calls).any():
            checks += 1
            if checks > SPINS:
                os.sched_yield()
                started = started or time.monotonic()
                if time.monotonic() - started > self.timeout:
                    behind = [r for r in range(self.ranks) if self.flags[r] < self.calls]
                    raise RuntimeError(f"rank {self.rank}: ranks {behind} did not reach "
                                       f"all-reduce {self.calls} within {self.timeout:g} s (a "
                                       "rank died, or called the all-reduce fewer times).")
        torch.sum(buffer[:, :n], dim=0, out=tensor.view(-1))

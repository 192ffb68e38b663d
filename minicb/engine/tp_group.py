"""The ranks of a tensor-parallel engine: their process group, and the plan sent to all of them.

Two channels, two groups, as vLLM keeps them apart:

* the **all-reduce** of the row-parallel linears (minicb/model/parallel_layers.py), on the
  tensors' device: gloo on a CPU, NCCL on CUDA GPUs (one GPU per rank);
* the **plan**: each step, rank 0 (the scheduling process) sends every other rank what its
  forward needs, pickled, through a gloo broadcast of host memory. A worker waits there as long
  as the engine is idle, so this group's timeout is a year; the all-reduce's is two minutes.

Why a broadcast and not a shared-memory queue (vLLM's MessageQueue): a shared-memory queue's
readers poll it, and on a CPU the polling threads take the cores the ranks compute on (on this
2-core machine, all of them). A gloo broadcast waits in the kernel, costs one more collective per
step (tens of microseconds, measured in benchmarks), and its sockets also carry the failure: a
rank that dies closes them, and the others' collectives raise at once instead of hanging.

Each group is an object of its own (`ProcessGroupGloo` on a `TCPStore`), not torch's global
default group, so one process may hold several engines, and an engine that is gone leaves no
global state behind.
"""

from __future__ import annotations

import datetime
import pickle

import numpy as np
import torch
from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

HOST = "127.0.0.1"
# how long an all-reduce may wait for the other ranks before it fails: the ranks run in lockstep,
# so this only bounds a rank stuck without dying (a dead one fails the collective at once)
TIMEOUT = datetime.timedelta(seconds=120)
# how long a worker waits for the next plan: as long as the engine stays idle (a server between
# requests), so without a bound that matters; a scheduling process that dies closes the sockets
IDLE_TIMEOUT = datetime.timedelta(days=365)
# a plan up to this many bytes goes in one broadcast; a bigger one sends its length first
INLINE_BYTES = 4096


def master_store(size: int) -> TCPStore:
    """Rank 0's rendezvous server, on a port the kernel picks (free by construction)."""
    return TCPStore(HOST, 0, size, True, timeout=TIMEOUT, wait_for_workers=False)


class TPGroup:
    """One rank's view of the group: `all_reduce` for the model, `send`/`receive` for the plan.

    Built before the model (whose row-parallel linears keep a reference to it), connected once
    every rank has loaded its shard (`connect`)."""

    def __init__(self, rank: int, size: int, port: int, device: str,
                 store: TCPStore | None = None):
        self.rank, self.size, self.port, self.device = rank, size, port, device
        self._store = store
        self.plans: ProcessGroupGloo | None = None       # the plan's broadcast
        self.reducer = None                              # the all-reduce's group
        self._buffer = torch.zeros(8 + INLINE_BYTES, dtype=torch.uint8)
        self._bytes = self._buffer.numpy()

    def connect(self) -> None:
        """Join the group: blocks until every rank has called it."""
        store = self._store or TCPStore(HOST, self.port, self.size, False, timeout=TIMEOUT)
        self.plans = ProcessGroupGloo(PrefixStore("plan/", store), self.rank, self.size,
                                      IDLE_TIMEOUT)
        if self.device.startswith("cuda"):
            # written for CUDA builds of torch, where ProcessGroupNCCL exists; not run in CI
            from torch.distributed import ProcessGroupNCCL

            self.reducer = ProcessGroupNCCL(PrefixStore("nccl/", store), self.rank, self.size)
        else:
            self.reducer = ProcessGroupGloo(PrefixStore("gloo/", store), self.rank, self.size,
                                            TIMEOUT)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the ranks, in place (every rank calls it, in the same order)."""
        self.reducer.allreduce([tensor]).wait()

    def send(self, message: object) -> None:
        """Rank 0: broadcast `message` (any picklable object) to every other rank."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._bytes[:8].view(np.int64)[0] = len(data)
        if len(data) <= INLINE_BYTES:
            self._bytes[8:8 + len(data)] = np.frombuffer(data, dtype=np.uint8)
            self._broadcast(self._buffer)
            return
        self._broadcast(self._buffer)                     # the length, then the bytes
        self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def receive(self) -> object:
        """Ranks 1..size-1: the next message rank 0 sent."""
        self._broadcast(self._buffer)
        length = int(self._bytes[:8].view(np.int64)[0])
        if length <= INLINE_BYTES:
            return pickle.loads(self._bytes[8:8 + length].tobytes())
        data = torch.empty(length, dtype=torch.uint8)
        self._broadcast(data)
        return pickle.loads(data.numpy().tobytes())

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self.plans.broadcast(tensor, 0).wait()

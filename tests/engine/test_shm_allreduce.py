"""The shared-memory all-reduce in one process, its peers faked by writing their slots and flags:
the sum in rank order, the alternating buffers, and the refusals (a dead peer, a bad tensor)."""

from __future__ import annotations

import pytest
import torch

from minicb.engine.shm_allreduce import SharedMemoryAllReduce


def test_sums_every_slot_in_rank_order_and_alternates_buffers():
    slots, flags = SharedMemoryAllReduce.buffers(3, 4)
    group = SharedMemoryAllReduce(1, slots, flags)
    peers = {0: torch.tensor([1e8, 1.0, 2.0]), 2: torch.tensor([-1e8, 3.0, 4.0])}
    for call in (1, 2):
        for rank, tensor in peers.items():            # the peers wrote this call's buffer
            slots[call % 2, rank, :3] = tensor * call
        flags[[0, 2]] = call
        mine = torch.tensor([1.0, 10.0, 20.0])
        group.all_reduce(mine)
        # rank order: (1e8 + 1) + (-1e8) loses the 1, a sum in another order would keep it
        expected = (peers[0] * call + torch.tensor([1.0, 10.0, 20.0])) + peers[2] * call
        assert torch.equal(mine, expected)
        assert flags[1] == call
    assert torch.equal(slots[1, 1, :3], slots[0, 1, :3])   # both buffers hold rank 1's tensor


def test_a_peer_that_never_arrives_raises_naming_it():
    slots, flags = SharedMemoryAllReduce.buffers(2, 4)
    group = SharedMemoryAllReduce(0, slots, flags, timeout=0.05)
    with pytest.raises(RuntimeError, match=r"ranks \[1\] did not reach all-reduce 1"):
        group.all_reduce(torch.ones(4))


def test_refuses_private_memory_and_tensors_it_cannot_hold():
    with pytest.raises(ValueError, match="shared memory"):
        SharedMemoryAllReduce(0, torch.zeros(2, 2, 4), torch.zeros(2, dtype=torch.int64))
    group = SharedMemoryAllReduce(0, *SharedMemoryAllReduce.buffers(2, 4))
    for tensor in (torch.ones(5), torch.ones(4, dtype=torch.float64)):
        with pytest.raises(ValueError, match="at most 4 values"):
            group.all_reduce(tensor)

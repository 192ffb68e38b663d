# Generated from solutions/ch13_tensor_parallel.py by scripts/make_exercises.py. Replace each
# NotImplementedError with your code, then run `make grade CH=13`.
"""Chapter 13 exercise: the row-parallel linear and its all-reduce, then an all-reduce of your own.

A linear y = x Wᵀ + b, with W of shape [out_features, in_features], split over `size` ranks by
its input features: rank r holds W's columns [start, stop), the matching slice of x (what the
column-parallel layer before it produced, with no communication) and the whole bias. Its product
is a partial sum of every output feature; an all-reduce adds the ranks' partial sums, and the
bias is added once, after the sum:

    W = [[1, 2, 3, 4]], x = [[1, 1, 1, 1]], b = [10], two ranks
    rank 0 holds columns 0-1: partial 1 + 2 = 3     rank 1 holds columns 2-3: partial 3 + 4 = 7
    the all-reduce leaves 10 on both ranks; plus the bias once: 20, the unsplit layer's answer

The all-reduce itself, for ranks on one host: shared memory instead of gloo's loopback TCP (the
design of vLLM's CPU all-reduce, minicb/engine/shm_allreduce.py). Every rank owns a slot of a
shared buffer; it copies its tensor into its slot, raises its flag to the call's number, waits
until every rank's flag has reached it, then adds all the slots in rank order. Two buffers
alternate between calls, so a rank that runs ahead into the next call never overwrites a slot
that a slower rank is still reading.

The grader runs your functions in two real processes, joined by a gloo process group for the
linear and by shared memory for your all-reduce, and compares what every rank returns with the
unsplit layer and with the exact sum.

Grade it: make grade CH=13
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def feature_range(num_features: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s share [start, stop) of `num_features` features split evenly over `size`
    ranks; a ValueError when they do not split evenly.

    >>> feature_range(8, 0, 2), feature_range(8, 1, 2)
    ((0, 4), (4, 8))
    >>> feature_range(6, 2, 3)
    (4, 6)
    >>> feature_range(7, 0, 2)
    Traceback (most recent call last):
    ...
    ValueError: 7 features do not split evenly over 2 ranks.
    """
    raise NotImplementedError(
        "feature_range: refuse an uneven split, else the rank's equal share")


def shard_columns(weight: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's input-feature columns of `weight` ([out_features, in_features]).

    >>> shard_columns(torch.arange(8.0).reshape(2, 4), 1, 2)
    tensor([[2., 3.],
            [6., 7.]])
    """
    raise NotImplementedError(
        "shard_columns: the columns feature_range gives this rank")


def row_parallel_linear(x_shard: torch.Tensor, weight_shard: torch.Tensor,
                        bias: torch.Tensor | None,
                        all_reduce: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """The layer's output on this rank: the partial product x_shard @ weight_shardᵀ, summed over
    the ranks by `all_reduce` (which replaces a tensor, in place, by the sum of every rank's), then
    `bias` (None: no bias) added once.

    >>> def alone(tensor):  # one rank: the sum over the ranks is its own tensor
    ...     pass
    >>> row_parallel_linear(torch.ones(1, 4), torch.tensor([[1.0, 2.0, 3.0, 4.0]]),
    ...                     torch.tensor([10.0]), alone)
    tensor([[20.]])
    """
    raise NotImplementedError(
        "row_parallel_linear: the partial product, the all-reduce, then the bias once")


def shared_memory_all_reduce(tensor: torch.Tensor, rank: int, slots: torch.Tensor,
                             flags: torch.Tensor, call: int) -> None:
    """Replace `tensor` (float32, 1-D) by its sum over every rank, in place, through shared
    memory. `slots` is [2, ranks, numel] and `flags` [ranks] (int64), the same shared tensors in
    every rank's process; `call` is this rank's call number, 1 for its first call. In order:

    1. copy `tensor` into this rank's slot of buffer `call % 2`;
    2. only then raise this rank's flag to `call` (the flag says "my slot is written");
    3. wait until every rank's flag is at least `call` (a rank may already be one call ahead);
    4. write the sum of the buffer's slots, in rank order, into `tensor`: every rank then holds
       the same sum, bit for bit.

    Faked in one process: rank 1 has already written its slot and raised its flag for call 1.

    >>> slots, flags = torch.zeros(2, 2, 3), torch.zeros(2, dtype=torch.int64)
    >>> slots[1, 1] = torch.tensor([10.0, 20.0, 30.0]); flags[1] = 1
    >>> tensor = torch.tensor([1.0, 2.0, 3.0])
    >>> shared_memory_all_reduce(tensor, 0, slots, flags, 1)
    >>> tensor, flags.tolist()
    (tensor([11., 22., 33.]), [1, 1])
    """
    raise NotImplementedError(
        "shared_memory_all_reduce: copy into your slot, raise your flag, wait for every flag, sum "
        "in rank order")

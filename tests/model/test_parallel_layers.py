"""The split itself, without processes: N shards of a model, each run in a thread of its own with
an all-reduce over threads, give the unsplit model's logits. In threads, so sizes the process
tests cannot afford run here too: four ranks over two KV heads (each KV head on two ranks), four
over one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from minicb.model.attention import AttentionMetadata
from minicb.model.loader import load_model
from minicb.model.parallel_layers import check_split, shard_model, valid_sizes

BLOCK = 16


class ThreadGroup:
    """An all-reduce among `size` threads: each rank leaves its tensor, all wait, each takes the
    sum in rank order (the same on every rank), all wait again before the next one."""

    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=60)
        self.parts: list[torch.Tensor | None] = [None] * size

    def member(self, rank: int):
        group = self

        class Member:
            def all_reduce(self, tensor: torch.Tensor) -> None:
                group.parts[rank] = tensor.clone()
                group.barrier.wait()
                total = group.parts[0].clone()
                for part in group.parts[1:]:
                    total += part
                group.barrier.wait()
                tensor.copy_(total)

        return Member()


def forward(model, tokens: list[int]) -> torch.Tensor:
    """One prompt as one packed step, with a KV pool sized by what the model (or shard) holds."""
    args, n = model.args, len(tokens)
    blocks = -(-n // BLOCK)
    caches = [(torch.zeros(blocks, BLOCK, args.num_kv_heads, args.head_dim),
               torch.zeros(blocks, BLOCK, args.num_kv_heads, args.head_dim))
              for _ in range(args.num_layers)]
    meta = AttentionMetadata(torch.arange(n), torch.tensor([0, n], dtype=torch.int32),
                             torch.tensor([n], dtype=torch.int32),
                             torch.arange(blocks, dtype=torch.int32)[None], n, n)
    return model(torch.tensor(tokens), torch.arange(n), caches, meta, torch.arange(n))


def split_forward(path: str, size: int, tokens: list[int]) -> list[torch.Tensor]:
    group, results, errors = ThreadGroup(size), [None] * size, []
    shards = [shard_model(load_model(Path(path), attention="torch"), rank, size,
                          group.member(rank)) for rank in range(size)]

    def run(rank: int) -> None:
        try:
            results[rank] = forward(shards[rank], tokens)
        except BaseException as error:      # reported below, not lost in the thread
            errors.append(error)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("family,size", [("tiny_llama", 2), ("tiny_llama", 4),
                                         ("tiny_qwen2", 4), ("tiny_qwen3", 2),
                                         ("tiny_llama_bias", 2)])
def test_shards_in_threads_give_the_unsplit_logits(request, family, size):
    path = request.getfixturevalue(family)
    tokens = [5, 17, 99, 3, 250, 41, 7, 8, 300, 12, 64, 65, 66, 200, 201, 9, 10, 11]
    expected = forward(load_model(Path(path), attention="torch"), tokens)
    for rank, logits in enumerate(split_forward(path, size, tokens)):
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5,
                                   msg=lambda m, rank=rank: f"rank {rank} of {size}: {m}")


def test_sizes_the_heads_cannot_take_are_refused_naming_those_that_can(tiny_llama):
    model = load_model(Path(tiny_llama), attention="torch")   # 4 query heads, 2 KV heads, 160
    assert valid_sizes(model.args) == [1, 2, 4]
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 .* are 1, 2, 4"):
        check_split(model, 3)

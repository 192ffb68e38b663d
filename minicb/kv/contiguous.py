"""Contiguous KV (the Orca-era layout): every request reserves max_model_len slots up front."""

from __future__ import annotations

from minicb.kv.base import KVManager


class ContiguousKVManager(KVManager):
    """A request gets one run of consecutive blocks long enough for max_model_len tokens.

    Two kinds of waste follow: the reserved tail a short request never fills (internal), and
    free blocks scattered between reservations, too short for a new run (external).
    """

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_prefix_caching: bool = False):
        if enable_prefix_caching:
            raise ValueError("enable_prefix_caching needs kv_cache='paged': only blocks can be "
                             "shared.")
        super().__init__(num_blocks, block_size)
        self.blocks_per_request = self.blocks_for(max_model_len)
        self.is_free = [True] * num_blocks
        self.runs: dict[str, range] = {}
        self.tables: dict[str, list[int]] = {}    # each run as its block table, made once

    def num_free_blocks(self) -> int:
        return sum(self.is_free)

    def _find_run(self) -> int | None:
        """First fit: the lowest block that starts a free run of blocks_per_request blocks."""
        length = 0
        for block, free in enumerate(self.is_free):
            length = length + 1 if free else 0
            if length == self.blocks_per_request:
                return block - length + 1
        return None

    def can_allocate(self, request, num_tokens: int, reserve_blocks: int = 0) -> bool:
        if num_tokens > self.blocks_per_request * self.block_size:
            return False
        if request.request_id in self.runs:
            return True
        return self._find_run() is not None and \
            self.num_free_blocks() - self.blocks_per_request >= reserve_blocks

    def table_with_room(self, request, num_tokens: int) -> list[int] | None:
        if num_tokens > self.blocks_per_request * self.block_size:
            return None
        return self.tables.get(request.request_id)

    def allocate(self, request, num_tokens: int) -> None:
        if request.request_id in self.runs:
            return
        start = self._find_run()
        if start is None:
            raise RuntimeError("no free contiguous run: the scheduler should have checked "
                               "can_allocate.")
        run = range(start, start + self.blocks_per_request)
        for block in run:
            self.is_free[block] = False
        self.runs[request.request_id] = run
        self.tables[request.request_id] = list(run)

    def free(self, request) -> None:
        self.tables.pop(request.request_id, None)
        for block in self.runs.pop(request.request_id, range(0)):
            self.is_free[block] = True

    def block_table(self, request) -> list[int]:
        return self.tables.get(request.request_id, [])

    def num_reserved_slots(self) -> int:
        return len(self.runs) * self.blocks_per_request * self.block_size

    def can_ever_fit(self, num_tokens: int) -> bool:
        return (num_tokens <= self.blocks_per_request * self.block_size <= self.num_blocks
                * self.block_size)

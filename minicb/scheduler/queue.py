"""The waiting queue: requests in arrival order, taken out in a policy's order."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from minicb.request import Request


class WaitingQueue(list):
    """A list of waiting requests in queue order (arrivals at the back; a preempted request goes
    back to the front), which can also be walked in a policy's order with `in_order`."""

    def in_order(self, key: Callable[[Request], tuple]) -> Iterator[Request]:
        """Yield the requests smallest `key` first; ties go to the earlier queue position.

        Most steps admit at most one request, so the first is found by one scan. Only if the
        caller asks for a second are the rest ordered, once, as a heap (the order cannot change
        while the caller walks it): taking k of W requests costs O(W + k log W), not O(k W). The
        queue itself is not changed; remove what you take with `remove_all`.
        """
        if not self:
            return
        first = min(self, key=key)
        yield first
        heap = [(key(request), position, request) for position, request in enumerate(self)
                if request is not first]
        heapq.heapify(heap)
        while heap:
            yield heapq.heappop(heap)[2]

    def remove_all(self, requests: list[Request]) -> None:
        """Remove the given requests (one pass, however many)."""
        if len(requests) == 1:
            self.remove(requests[0])
        elif requests:
            ids = {id(request) for request in requests}
            self[:] = [request for request in self if id(request) not in ids]

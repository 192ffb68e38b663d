"""The timeline's device lane: marks read only once the device has passed them, in order, none
lost, with no wait per step; the same bookkeeping for CUDA events and the CPU's clock."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from minicb.bench.device_lane import CudaEvents, DeviceLane, HostClock, event_source, resolve_ready


class LateDevice:
    """An event source whose device runs behind the host: a mark is passed only when the test
    moves the device's clock past it, and reading one before that is an error (as CUDA's
    elapsed_time would wait)."""

    name = "a device that runs behind"

    def __init__(self) -> None:
        self.queued: list[float] = []     # the device time each mark will be passed at
        self.now = -1.0                   # the device has passed every mark <= now
        self.settled = 0

    def queue(self, at: float) -> None:
        self.queued.append(at)

    def mark(self) -> int:
        return len(self.queued) - 1 if self.queued else -1

    def ready(self, mark: int) -> bool:
        return self.queued[mark] <= self.now

    def seconds(self, mark: int) -> float:
        assert self.ready(mark), "read a mark the device has not passed: that would wait"
        return self.queued[mark]

    def settle(self) -> None:
        self.settled += 1
        self.now = max(self.queued)


def test_resolve_ready_stops_at_the_first_pair_not_passed():
    times = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0, "f": 6.0}
    passed = {"a", "b", "c", "f"}          # "f" is done but queued behind "d", which is not
    pending = deque([("a", "b", "busy"), ("c", "d", "busy"), ("e", "f", "busy")])
    done = resolve_ready(pending, lambda m: m in passed, times.__getitem__)
    assert done == [(1.0, 2.0, "busy")]
    assert [p[1] for p in pending] == ["d", "f"]


def test_the_lane_reads_steps_late_without_waiting_and_loses_none():
    device = LateDevice()
    lane = DeviceLane(device)
    for step in range(5):                 # each step: queued at 10*step, done 4 units later
        device.queue(10.0 * step)
        start = lane.begin()
        device.queue(10.0 * step + 4)
        lane.end(start)
        device.now = 10.0 * step - 10     # the device is a step behind the host
    assert device.settled == 0            # no wait while the steps ran
    # read at each step's end: what the device had passed then (steps 0 and 1 by step 4's end)
    assert len(lane.intervals) == 2 and lane.num_pending == 3
    lane.poll()                           # the device has since passed step 2
    assert len(lane.intervals) == 3 and lane.num_pending == 2
    assert lane.finish() == [(10.0 * s, 10.0 * s + 4, "busy") for s in range(5)]
    assert device.settled == 1 and lane.num_pending == 0


def test_on_a_cpu_the_lane_is_the_compute_threads_clock():
    assert isinstance(event_source("cpu"), HostClock)
    lane = DeviceLane(HostClock())
    start = lane.begin()
    sum(range(10_000))
    lane.end(start, "busy")
    ((a, b, phase),) = lane.intervals      # read at once: the CPU's marks are never pending
    assert 0 < b - a < 5 and phase == "busy"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (make test-gpu)")
def test_cuda_events_place_a_kernel_on_the_host_clock():
    import time

    source = CudaEvents("cuda")
    lane = DeviceLane(source)
    x = torch.randn(4096, 4096, device="cuda")
    before = time.perf_counter()
    start = lane.begin()
    for _ in range(20):
        x = x @ x / 64
    lane.end(start)
    queued = time.perf_counter()
    ((a, b, _),) = lane.finish()
    after = time.perf_counter()
    # the device started after the host queued the work, and finished after it was queued
    # (the matrix products take longer than launching them) and before the host saw it done
    assert before - 1e-3 <= a < b <= after + 1e-3 and b > queued

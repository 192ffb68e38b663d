"""The timeline's two lanes on a live engine: the host's phases, and when the device was busy,
read without making the host wait for it.

On a GPU the device runs behind the host: `runner.run` returns once its kernels are queued (or,
in a synchronous step, once their result is copied back), so the host's clock says when work was
*handed over*, not when the device did it. A CUDA event recorded on the stream before and after a
step is stamped by the device itself when it gets there. Reading an event's time makes the host
wait for it (`elapsed_time` needs it done), so the lane keeps each step's pair pending and reads
the pairs the device has already passed (`Event.query()`, which does not wait) after later steps,
and the rest once at the end: no synchronisation per step, no change to the loop it measures.

On a CPU "the device" is the thread that runs the model, and a mark is the host's clock when
it is taken. Both are event sources with one interface, so the bookkeeping (pending pairs, read
in order once ready, converted to the host's clock) is the same code on every machine, and its
tests run on a CPU with a source that resolves late on purpose.

An interval spans `runner.run` (the forward and the sampling) from its first queued work to its
last: gaps inside it (a kernel waiting for the host to launch the next) count as busy, and the
input copies `prepare` queued before it do not. torch.profiler's kernel records would split
them; the step-level share is what overlapping the host's work with the device's changes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

Interval = tuple[float, float, str]


class EventSource(Protocol):
    """Marks the device's progress: `mark()` queues a mark, `ready(mark)` says (without waiting)
    whether the device has passed it, `seconds(mark)` its time on the host's perf_counter clock
    (only once ready), `settle()` waits until every mark queued so far is passed."""

    name: str

    def mark(self) -> Any: ...

    def ready(self, mark: Any) -> bool: ...

    def seconds(self, mark: Any) -> float: ...

    def settle(self) -> None: ...


class HostClock:
    """The CPU's device: the thread that runs the model, so a mark is taken when it is made."""

    name = "the compute thread's wall clock"

    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, mark: float) -> bool:
        return True

    def seconds(self, mark: float) -> float:
        return mark

    def settle(self) -> None:
        pass


class CudaEvents:
    """CUDA events on the current stream, placed on the host's clock through one anchor event:
    the device is idle when it is recorded and the host reads its clock right after it
    completes, so an event's host time is the anchor's plus the device's time between them."""

    name = "CUDA events"

    def __init__(self, device) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)
        torch.cuda.synchronize(self.device)
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record()
        self.anchor.synchronize()
        self.anchor_seconds = time.perf_counter()

    def mark(self):
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark) -> bool:
        return mark.query()

    def seconds(self, mark) -> float:
        return self.anchor_seconds + self.anchor.elapsed_time(mark) / 1e3

    def settle(self) -> None:
        self._torch.cuda.synchronize(self.device)


def event_source(device: str) -> EventSource:
    """CUDA events on a GPU, the compute thread's clock elsewhere."""
    return CudaEvents(device) if str(device).startswith("cuda") else HostClock()


def resolve_ready(pending: deque, ready: Callable[[Any], bool],
                  seconds: Callable[[Any], float]) -> list[Interval]:
    """Pop from the front of `pending` ((start mark, end mark, phase), in the order queued) every
    pair whose end the device has passed, as host-clock intervals. It stops at the first pair not
    ready: the stream runs in order, so nothing behind it is done either, and the lane stays in
    order."""
    done = []
    while pending and ready(pending[0][1]):
        start, end, phase = pending.popleft()
        done.append((seconds(start), seconds(end), phase))
    return done


class DeviceLane:
    """The device's busy intervals: `begin()` before a step's work is queued, `end(start,
    phase)` after it; the intervals are read as the device passes them (`poll`, on every `end`),
    and all of them by `finish()`."""

    def __init__(self, source: EventSource) -> None:
        self.source = source
        self.intervals: list[Interval] = []
        self._pending: deque = deque()
        self._lock = threading.Lock()    # the step thread ends steps while the host polls

    def begin(self) -> Any:
        return self.source.mark()

    def end(self, start: Any, phase: str = "busy") -> None:
        with self._lock:
            self._pending.append((start, self.source.mark(), phase))
        self.poll()

    def poll(self) -> None:
        with self._lock:
            self.intervals += resolve_ready(self._pending, self.source.ready, self.source.seconds)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def finish(self) -> list[Interval]:
        """Wait for the device once, read every pending pair; the lane, in order."""
        self.source.settle()
        self.poll()
        return self.intervals


class Recorder:
    """Wraps a live engine's scheduler, runner and executor so every call leaves an interval on
    the host's lane (perf_counter seconds) or the device's (the device lane's clock, placed on
    the host's); each step also notes the thread count the thread policy gave it."""

    def __init__(self, engine, source: EventSource | None = None) -> None:
        self.host: list[Interval] = []
        self.device = DeviceLane(source or HostClock())
        self.threads: list[int] = []
        self._lock = threading.Lock()
        self._main = threading.get_ident()
        self._engine = engine
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(engine.scheduler, "update", "update")
        self._wrap(engine.runner, "prepare", "pack")
        self._wrap_step(engine.runner, "run")
        executor = engine.core.executor
        if hasattr(executor, "pool"):        # overlapped: the step is queued, then waited for
            self._wrap(executor.pool, "submit", "launch")
            execute = executor.execute
            executor.execute = lambda plan: _TimedFuture(execute(plan), self)

    def add(self, start: float, end: float, phase: str) -> None:
        with self._lock:
            self.host.append((start, end, phase))

    def _wrap(self, owner, method: str, phase: str) -> None:
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(start, time.perf_counter(), phase)

        setattr(owner, method, timed)

    def _wrap_step(self, owner, method: str) -> None:
        """The step on the device: its marks around the call, and the thread count; a step run
        on the main thread is synchronous, so the host waits for it."""
        original = getattr(owner, method)
        threads = self._engine.threads

        def timed(*args, **kwargs):
            start, mark = time.perf_counter(), self.device.begin()
            try:
                return original(*args, **kwargs)
            finally:
                self.device.end(mark)
                with self._lock:
                    self.threads.append(threads.threads if threads is not None else 0)
                if threading.get_ident() == self._main:
                    self.add(start, time.perf_counter(), "wait")

        setattr(owner, method, timed)


class _TimedFuture:
    def __init__(self, future, recorder: Recorder) -> None:
        self.future, self.recorder = future, recorder

    def result(self):
        start = time.perf_counter()
        try:
            return self.future.result()
        finally:
            self.recorder.add(start, time.perf_counter(), "wait")

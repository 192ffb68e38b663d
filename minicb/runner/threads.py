"""How many CPU threads a model step uses: the cores nobody else is using.

A model step on a CPU is a few hundred operations, and torch runs each one on a team of threads
that meet at a barrier when the operation ends. On a quiet machine two threads on two cores beat
one (the matrix products split in half). When another program keeps one core busy, the thread that
shares its core is descheduled for whole time slices (milliseconds) while its partner waits at the
barrier, spinning, hundreds of times per step: two threads then run far slower than one. Measured
on a 2-core machine with a busy loop on one core, two threads lost about three quarters of their
throughput and one thread lost a fraction of that (benchmarks/log.md, "A busy neighbour").

So the engine watches the machine. Every `interval` seconds it reads how much CPU time the whole
machine spent (``/proc/stat``) and how much of it was this process's own (``os.times``); the rest
is the neighbours' load, in cores (niced programs included). Every core the
neighbours use, even partly, is taken away, rounding up past a small tolerance, because while
this process runs two threads a busy neighbour only gets half a core and reads as half its
need; the step runs on what is left, at least one thread and at most the thread count torch had
when the engine started (torch's default is the cores; `torch.set_num_threads(1)` before building
an engine keeps it at one). Coming back up needs a clearly lower reading, so a count does not
flap. When the policy starts it takes a first look of a tenth of a second, so the very first
step already runs on the free cores.

Where ``/proc/stat`` does not exist (macOS, Windows) the policy keeps torch's default, which is
what every torch program does there. `EngineConfig.cpu_threads` set to a number fixes the count.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

PROC_STAT = "/proc/stat"
# (the count a policy last set, the ceiling that policy had): a later engine in the same process
# then starts from the same ceiling, not from a count an earlier engine lowered under load
_last_set: tuple[int, int] | None = None


def ceiling() -> int:
    """The most threads a new policy may use: torch's thread count, as the user left it."""
    current = torch.get_num_threads()
    if _last_set is not None and current == _last_set[0]:
        return _last_set[1]
    return current


def _set_threads(count: int, most: int) -> None:
    global _last_set
    torch.set_num_threads(count)
    _last_set = (count, most)


def machine_busy_seconds(path: str = PROC_STAT) -> float | None:
    """CPU seconds the machine has spent busy since boot (all cores; user, nice, system, irq,
    softirq and steal: steal is time the hypervisor gave to another machine), or None. Niced
    programs count too: a low priority does not stop one from holding the core for a time slice
    while a thread of this process waits for it at a barrier (measured: a single nice-19 busy
    program cut two-thread, one-request-at-a-time serving to a seventh of its one-thread speed)."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    busy = sum(ticks[i] for i in (0, 1, 2, 5, 6, 7) if i < len(ticks))
    return busy / os.sysconf("SC_CLK_TCK")


def own_busy_seconds() -> float:
    t = os.times()
    return t.user + t.system


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:       # not on Linux
        return os.cpu_count() or 1


def threads_for(neighbours: float, cores: int, current: int, most: int,
                tolerance: float = 0.25, hysteresis: float = 0.1) -> int:
    """The thread count when other programs keep `neighbours` cores busy: every core they use
    even partly is taken away (past a `tolerance` of stray load), at least one thread, at most
    `most`. Rounding up matters: while this process spins two threads on two cores, a busy
    neighbour only gets about half a core, so its reading understates what it would take.
    Coming back up needs the reading `hysteresis` below the tolerance, so a count does not flap."""
    def count(threshold: float) -> int:
        taken = max(0, math.ceil(neighbours - threshold))
        return max(1, min(most, cores - taken))

    target = count(tolerance)
    if target > current:               # going up: only as far as a stricter reading allows
        return max(current, count(tolerance - hysteresis))
    return target


@dataclass
class ThreadPolicy:
    """Sets torch's intra-op threads before a step (`before_step`), from the neighbours' load."""

    fixed: int | None = None           # a number: always that many; None: follow the machine
    interval: float = 0.25             # seconds between readings
    tolerance: float = 0.25            # stray load (cores) that takes no thread away
    most: int = field(default_factory=ceiling)
    cores: int = field(default_factory=usable_cores)
    threads: int = 0                   # the count in force
    neighbours: float = 0.0            # the last reading: other programs' load, in cores
    changes: int = 0                   # how often the count changed
    first_look: float = 0.1            # seconds of a first reading when the policy starts
    _last: tuple[float, float, float] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.fixed is not None:
            if not isinstance(self.fixed, int) or self.fixed < 1:
                raise ValueError(f"cpu_threads must be an integer >= 1 or None (follow the "
                                 f"machine's load), got {self.fixed!r}.")
            self.threads = self.fixed
        else:
            self.threads = min(self.most, self.cores)
            self.before_step()     # the first reading
            if self.first_look > 0 and self.threads > 1:
                # a short look now, while this process is idle, so the first step already runs on
                # the free cores: a run of a second or two would otherwise spend its first
                # `interval` with a thread that waits for a busy core at every barrier
                time.sleep(self.first_look)
                self._read(time.monotonic())
        _set_threads(self.threads, self.most)

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    def before_step(self, now: float | None = None) -> int:
        """Re-read the machine if `interval` has passed; return the thread count for this step."""
        if self.fixed is not None:
            return self.threads
        now = time.monotonic() if now is None else now
        if self._last is not None and now - self._last[0] < self.interval:
            return self.threads
        return self._read(now)

    def _read(self, now: float) -> int:
        """Read the machine now and act on the load since the previous reading."""
        machine = machine_busy_seconds()
        if machine is None:
            return self.threads
        own = own_busy_seconds()
        if self._last is not None:
            self.observe(now - self._last[0], machine - self._last[1], own - self._last[2])
        self._last = (now, machine, own)
        return self.threads

    def observe(self, wall: float, machine_busy: float, own_busy: float) -> None:
        """One reading: over `wall` seconds the machine was busy `machine_busy` CPU seconds, this
        process `own_busy` of them."""
        if wall <= 0 or self.fixed is not None:
            return
        self.neighbours = max(0.0, (machine_busy - own_busy) / wall)
        threads = threads_for(self.neighbours, self.cores, self.threads,
                              min(self.most, self.cores), self.tolerance)
        if threads != self.threads:
            self.threads = threads
            self.changes += 1
            _set_threads(threads, self.most)

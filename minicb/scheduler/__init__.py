"""Schedulers: decide, every step, which tokens of which requests the model computes."""

from collections.abc import Callable, Iterable

from minicb.kv.base import KVManager
from minicb.registry import SCHEDULERS
from minicb.scheduler.base import Scheduler
from minicb.scheduler.continuous import ContinuousScheduler
from minicb.scheduler.overlap import OverlapScheduler, overlapped
from minicb.scheduler.static import NaiveScheduler, StaticScheduler

# the registry itself (name -> class): a grader swaps in a student's scheduler with setitem
SCHEDULER_CLASSES = SCHEDULERS


def make_scheduler(config, kv_manager: KVManager, clock: Callable[[], float],
                   eos_token_ids: Iterable[int] = (), overlap: bool = False) -> Scheduler:
    """The scheduler `config.scheduler` names, over `kv_manager`; `overlap`: with overlapped
    scheduling's bookkeeping mixed in (minicb.scheduler.overlap), for an engine core that plans
    step n + 1 while step n runs."""
    scheduler_class = SCHEDULERS.get_part(config.scheduler)
    if overlap:
        scheduler_class = overlapped(scheduler_class)
    return scheduler_class(config, kv_manager, clock, eos_token_ids)


__all__ = ["Scheduler", "NaiveScheduler", "StaticScheduler", "ContinuousScheduler",
           "OverlapScheduler", "make_scheduler", "SCHEDULER_CLASSES"]

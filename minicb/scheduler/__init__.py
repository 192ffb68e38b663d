"""Schedulers: decide, every step, which tokens of which requests the model computes."""

from collections.abc import Callable, Iterable

from minicb.kv.base import KVManager
from minicb.registry import SCHEDULERS
from minicb.scheduler.base import Scheduler
from minicb.scheduler.continuous import ContinuousScheduler
from minicb.scheduler.static import NaiveScheduler, StaticScheduler

# the registry itself (name -> class): a grader swaps in a student's scheduler with setitem
SCHEDULER_CLASSES = SCHEDULERS


def make_scheduler(config, kv_manager: KVManager, clock: Callable[[], float],
                   eos_token_ids: Iterable[int] = ()) -> Scheduler:
    """The scheduler `config.scheduler` names, over `kv_manager`."""
    return SCHEDULERS.get_part(config.scheduler)(config, kv_manager, clock, eos_token_ids)


__all__ = ["Scheduler", "NaiveScheduler", "StaticScheduler",
           "ContinuousScheduler", "make_scheduler", "SCHEDULER_CLASSES"]

"""Schedulers: decide, every step, which tokens of which requests the model computes."""

from minicb.scheduler.base import ScheduledSeq, Scheduler, SchedulerOutput
from minicb.scheduler.continuous import ContinuousScheduler
from minicb.scheduler.static import NaiveScheduler, StaticScheduler

SCHEDULER_CLASSES = {"naive": NaiveScheduler, "static": StaticScheduler,
                     "continuous": ContinuousScheduler}


def make_scheduler(config, kv_manager, stop_checker, clock) -> Scheduler:
    return SCHEDULER_CLASSES[config.scheduler](config, kv_manager, stop_checker, clock)


__all__ = ["Scheduler", "SchedulerOutput", "ScheduledSeq", "NaiveScheduler", "StaticScheduler",
           "ContinuousScheduler", "make_scheduler", "SCHEDULER_CLASSES"]

"""The cost-model executor: the engine core's executor with the model replaced by a clock.

Each step costs `step_overhead + prefill_token * prefill tokens + decode_seq * decode rows +
context_token * keys the decode rows read` (padding and a static batch's idle rows included: they
are computed too). `minicb.sim.calibrate` fits those four numbers to the real engine's step times on
this machine, and gives a second set for a GPU from published measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minicb.plan import SchedulerOutput


@dataclass
class CostModel:
    """Virtual time per step. The defaults make one decode step cost 1 unit at any batch size
    (decode is memory-bound: a bigger batch rides along almost free) and a prefill token 1/64.

    A calibrated model (`minicb.sim.calibrate`) counts seconds and adds the cost of attention: every
    decode row reads all the keys its request has cached, `context_token` per key."""

    step_overhead: float = 1.0
    prefill_token: float = 1.0 / 64
    decode_seq: float = 0.0
    context_token: float = 0.0
    name: str = field(default="", compare=False)
    unit: str = field(default="time unit", compare=False)

    def step_time(self, prefill_tokens: int, decode_rows: int, context_tokens: int = 0) -> float:
        return (self.step_overhead + self.prefill_token * prefill_tokens + self.decode_seq
                * decode_rows + self.context_token * context_tokens)

    def plan_time(self, plan: SchedulerOutput) -> float:
        """What one planned step costs."""
        # keys the decode rows read: each request's cache, including this step's token
        context = sum(s.start + s.num_tokens for s in plan.seqs
                      if s.is_decode) if self.context_token else 0
        return self.step_time(plan.num_prefill_tokens + plan.num_pad_tokens,
                              plan.num_decode_rows, context)


class VirtualClock:
    """Simulated time: the scheduler reads it (`clock()`), steps and idle waits move it on."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait_until(self, time: float) -> None:
        """Let time pass until `time` (never backwards)."""
        self.now = max(self.now, time)


@dataclass
class VirtualStep:
    """A step in flight on the virtual device, `duration` from `start`. Waiting for its result
    moves the clock to its end, so `Scheduler.update` stamps the step's tokens with that time."""

    clock: VirtualClock
    start: float
    duration: float
    output: list[int]

    @property
    def end(self) -> float:
        return self.start + self.duration

    def result(self) -> list[int]:
        self.clock.wait_until(self.end)
        return self.output


class CostModelExecutor:
    """Runs a plan on the cost model: the step takes `cost.plan_time(plan)` of virtual time from
    the clock's now, and every row that needs a token gets token 1 (a simulated request has
    ignore_eos and a length, so the token's value never matters)."""

    def __init__(self, cost: CostModel, clock: VirtualClock | None = None):
        self.cost = cost
        self.clock = clock if clock is not None else VirtualClock()

    def execute(self, plan: SchedulerOutput) -> VirtualStep:
        return VirtualStep(self.clock, self.clock.now, self.cost.plan_time(plan),
                           [1] * sum(s.needs_logits for s in plan.seqs))

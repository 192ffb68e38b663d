"""Serving in virtual time: the engine core with the model replaced by a cost model.

`simulate` runs one engine (the real scheduler and KV manager) on a `CostModel`;
`minicb.sim.cluster` runs pools of such instances (co-located or prefill/decode disaggregated)
in one event loop. Both step the same `minicb.engine.core.EngineCore` the real engine steps.
"""

from minicb.sim.cost_model import CostModel, CostModelExecutor, VirtualClock, VirtualStep
from minicb.sim.simulator import SimResult, StepRecord, serve_at_rates, serving_row, simulate

__all__ = ["CostModel", "CostModelExecutor", "VirtualClock", "VirtualStep", "SimResult",
           "StepRecord", "serve_at_rates", "serving_row", "simulate"]

"""One step loop: the engine, the simulator and the cluster simulator's instances all step an
EngineCore (schedule → execute → update) with their own executor, and nothing else plans a step."""

from __future__ import annotations

import ast
from pathlib import Path

from minicb import LLM, SamplingParams
from minicb.config import EngineConfig
from minicb.engine.core import Done, EngineCore
from minicb.kv import make_kv_manager
from minicb.request import Request
from minicb.scheduler import make_scheduler
from minicb.sim import CostModel, CostModelExecutor, simulate
from minicb.sim.cluster import Pool, simulate_cluster
from minicb.sim.workload import seed_example

PACKAGE = Path(__file__).resolve().parents[2] / "minicb"


def test_schedule_is_called_from_one_place_in_the_package():
    callers = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
               for path in sorted(PACKAGE.rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "schedule"]
    assert len(callers) == 1 and callers[0].startswith("engine/core.py:"), callers


def test_the_simulators_patch_neither_the_clock_nor_the_scheduler():
    for module in ("sim/simulator.py", "sim/cluster.py"):
        source = (PACKAGE / module).read_text()
        for patch in ("step_count -=", "check_stop =", "class _Clock", "clock.now ="):
            assert patch not in source, f"{module}: {patch}"


def _core(cost: CostModel, **knobs) -> EngineCore:
    config = EngineConfig(max_model_len=64, **knobs).resolve(64)
    kv = make_kv_manager(config.kv_cache, config.num_kv_blocks, config.block_size,
                         config.max_model_len, config.enable_prefix_caching)
    executor = CostModelExecutor(cost)
    return EngineCore(make_scheduler(config, kv, executor.clock), executor)


def test_the_seed_example_on_a_bare_core_is_simulate():
    """Static 14 steps, continuous 10: the core stepped by hand gives simulate's schedule."""
    for scheduler, steps in (("static", 14), ("continuous", 10)):
        core = _core(CostModel(), scheduler=scheduler, max_num_seqs=4)
        for index, spec in enumerate(seed_example().requests):
            core.scheduler.add_request(Request(str(index), [1] * spec.prompt_len,
                                               SamplingParams(max_tokens=spec.output_len,
                                                              ignore_eos=True),
                                               arrival_index=index))
        ends = []
        while core.has_unfinished():
            result = core.step()
            ends.append(core.executor.clock.now)
            assert result.plan is not None
        sim = simulate(seed_example(), scheduler=scheduler, max_num_seqs=4)
        assert len(ends) == sim.num_steps == steps
        assert ends == [s.end for s in sim.steps]


def test_a_launched_step_ends_when_its_result_is_collected():
    """begin_step plans and launches at the clock's now; the clock reaches the step's end (and
    the tokens are stamped with it) only in end_step: the split overlapped scheduling needs."""
    core = _core(CostModel(step_overhead=2.0, prefill_token=0.0))
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    core.scheduler.add_request(request)
    step = core.begin_step()
    assert (step.future.start, step.future.end, core.executor.clock.now) == (0.0, 2.0, 0.0)
    assert request.output_token_ids == []
    core.end_step(step)
    assert core.executor.clock.now == 2.0 and request.times.token_times == [2.0]


def test_aborts_reach_the_core_as_events_applied_at_the_next_step():
    core = _core(CostModel())
    kept, dropped = (Request(name, [1, 2], SamplingParams(max_tokens=4, ignore_eos=True))
                     for name in ("kept", "dropped"))
    for request in (kept, dropped):
        core.scheduler.add_request(request)
    core.step()
    core.abort(["dropped", "never-seen"])
    assert not dropped.finished                    # nothing happens until the next step
    result = core.step()
    assert result.aborted == [dropped] and dropped.status.value == "abort"
    assert [r.request_id for r in result.touched] == ["kept"]
    assert core.scheduler.kv.num_used_blocks() == len(core.scheduler.kv.block_table(kept))


def test_the_engine_steps_through_its_core(tiny_llama):
    """Swap the engine's executor: every step the engine takes goes to it, with the plan."""
    engine = LLM(tiny_llama, max_num_seqs=2).llm_engine
    real, plans = engine.core.executor, []

    class Recording:
        def execute(self, plan):
            plans.append(plan.step)
            return Done(real.execute(plan).result())

    engine.core.executor = Recording()
    engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=3, temperature=0,
                                                      ignore_eos=True))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert plans == [1, 2, 3] and len(outputs[-1].outputs[0].token_ids) == 3


def test_one_colocated_instance_is_simulate():
    workload = seed_example().with_arrivals([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    cost = CostModel(step_overhead=1.0, prefill_token=0.01)
    cluster = simulate_cluster(workload, colocated=Pool(1, cost, dict(max_num_seqs=4)))
    alone = simulate(workload, cost=cost, max_num_seqs=4)
    assert [(s[0], s[1]) for s in cluster.instances[0].steps] == \
        [(s.start, s.end) for s in alone.steps]
    assert [r.times.token_times for r in cluster.requests] == \
        [r.times.token_times for r in alone.requests]

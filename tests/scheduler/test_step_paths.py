"""The scheduler's named fast paths give their general path's very results, the stop rule is
stated once, and the base scheduler reads without overlapped scheduling's bookkeeping.

- `Scheduler.update` hands a step of plain rows to `_apply_plain_tokens`, any other step to
  `_apply_tokens`: requests driven to every kind of end (EOS, a stop token id, max_tokens,
  max_model_len) come out the same either way.
- `ContinuousScheduler._schedule_running` plans the steady decodes at the head of the queue with
  `_schedule_steady_decodes`: the simulator's schedules (preemption, chunked prefill, prefix
  caching, every policy) are the same step for step without it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from minicb.config import EngineConfig
from minicb.kv import make_kv_manager
from minicb.params import SamplingParams
from minicb.plan import ModelRunnerOutput
from minicb.request import Request
from minicb.scheduler import make_scheduler
from minicb.scheduler.base import Scheduler
from minicb.scheduler.continuous import ContinuousScheduler
from minicb.sim import simulate
from minicb.sim.workload import mixed

SCHEDULER = Path(__file__).resolve().parents[2] / "minicb" / "scheduler"
EOS, STOP_ID = 3, 5


def _token(request: Request) -> int:
    """A deterministic stand-in for the model: a token from the request's tokens so far."""
    tokens = request.all_token_ids
    return (len(tokens) * 7 + sum(tokens) * 3 + int(request.request_id)) % 11


def _requests(one_token: bool = False) -> list[Request]:
    """Prompts of 1 to 16 tokens (`one_token`: all of one token, so every step is plain and
    first tokens come from plain steps); some stop at a stop token id, some ignore EOS, some run
    into max_tokens or max_model_len (24)."""
    requests = []
    for i in range(10):
        params = SamplingParams(max_tokens=4 + 3 * (i % 4), temperature=0,
                                ignore_eos=i % 3 == 0, stop_token_ids=[STOP_ID] if i % 2 else [])
        length = 1 if one_token else 1 + (i * 5) % 13
        requests.append(Request(str(i), [1 + (i + k) % 9 for k in range(length)], params,
                                arrival_index=i))
    requests.append(Request("10", [1] if one_token else list(range(1, 17)),  # max_model_len
                            SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                            arrival_index=10))
    return requests


def _serve(scheduler_name: str, fast: bool, monkeypatch, one_token: bool = False
           ) -> tuple[list, list, list | None, list[int]]:
    """Serve `_requests(one_token)` step by step; `fast=False` sends the plain steps through
    the general path. Returns every request's end state, every plan's rows, the prefix cache's
    blocks and the plain steps."""
    plain_steps = []
    real = Scheduler._apply_plain_tokens

    def apply_plain(self, output, tokens, now, step):
        plain_steps.append(step)
        if fast:
            return real(self, output, tokens, now, step)
        return self._apply_tokens(output, ModelRunnerOutput(tokens, [None] * len(tokens),
                                                            [None] * len(tokens)), now, step)

    monkeypatch.setattr(Scheduler, "_apply_plain_tokens", apply_plain)
    config = EngineConfig(scheduler=scheduler_name, max_model_len=24, max_num_seqs=4,
                          max_num_batched_tokens=16, block_size=4, num_kv_blocks=40,
                          enable_prefix_caching=scheduler_name == "continuous").resolve(24)
    kv = make_kv_manager(config.kv_cache, config.num_kv_blocks, config.block_size,
                         config.max_model_len, config.enable_prefix_caching)
    ticks = iter(range(10_000))
    scheduler = make_scheduler(config, kv, lambda: float(next(ticks)), eos_token_ids=[EOS])
    requests = _requests(one_token)
    for request in requests:
        scheduler.add_request(request)
    plans = []
    while scheduler.has_unfinished():
        plan = scheduler.schedule()
        plans.append([(s.request.request_id, s.start, s.num_tokens, s.ghost) for s in plan.seqs])
        scheduler.update(plan, ModelRunnerOutput.of(
            [_token(s.request) for s in plan.seqs if s.needs_logits]))
    monkeypatch.undo()
    assert kv.num_free_blocks() == kv.num_blocks
    ends = [(r.output_token_ids, r.status, r.stop_reason, r.num_computed_tokens,
             r.times.token_steps, r.times.first_token_step, r.times.finished_step)
            for r in requests]
    cached = sorted(kv.cache.by_hash) if kv.cache is not None else None   # full blocks offered
    return ends, plans, cached, plain_steps


@pytest.mark.parametrize("scheduler_name", ["continuous", "static"])
def test_plain_steps_end_every_request_as_the_general_path_does(scheduler_name, monkeypatch):
    fast = _serve(scheduler_name, True, monkeypatch)
    general = _serve(scheduler_name, False, monkeypatch)
    assert fast == general
    ends, plans, cached, plain_steps = fast
    assert cached is None or len(cached) > 5
    assert 0 < len(plain_steps) < len(plans)           # both paths ran
    # every kind of end was reached: a stop token id, EOS, max_tokens, max_model_len (24)
    assert any(reason == STOP_ID for _, _, reason, *_ in ends)
    assert any(status.value == "stop" and reason is None and out[-1] == EOS
               for out, status, reason, *_ in ends)
    lengths = [(len(r.prompt_token_ids), len(out), r.params.max_tokens)
               for r, (out, status, *_) in zip(_requests(), ends) if status.value == "length"]
    assert any(out == most for _, out, most in lengths)
    assert any(prompt + out == 24 and out < most for prompt, out, most in lengths)


@pytest.mark.parametrize("scheduler_name", ["continuous", "static"])
def test_first_tokens_from_plain_steps_are_the_general_paths(scheduler_name, monkeypatch):
    fast = _serve(scheduler_name, True, monkeypatch, one_token=True)
    assert fast == _serve(scheduler_name, False, monkeypatch, one_token=True)
    ends, _, _, plain_steps = fast
    assert {first_step for *_, first_step, _ in ends} <= set(plain_steps)


def test_a_step_with_any_non_plain_row_takes_the_general_path(monkeypatch):
    """The dispatch: a logprob, an error, a row that samples nothing or more than one query
    sends the whole step down the general path."""
    config = EngineConfig(max_model_len=32, max_num_seqs=4, block_size=4).resolve(32)
    kv = make_kv_manager(config.kv_cache, config.num_kv_blocks, config.block_size,
                         config.max_model_len, config.enable_prefix_caching)
    scheduler = make_scheduler(config, kv, lambda: 0.0)
    for i in range(2):
        scheduler.add_request(Request(str(i), [1, 2, 3], SamplingParams(max_tokens=9,
                                                                       temperature=0)))
    taken = []
    monkeypatch.setattr(Scheduler, "_apply_plain_tokens",
                        lambda self, *args: taken.append("plain") or [])
    monkeypatch.setattr(Scheduler, "_apply_tokens",
                        lambda self, *args: taken.append("general") or [])
    scheduler.update(scheduler.schedule(), ModelRunnerOutput.of([7, 7]))   # two prompts
    assert taken == ["general"]
    for request in scheduler.running:          # (the stand-ins applied nothing: do it here)
        request.num_computed_tokens, request.output_token_ids = 3, [7]
    plan = scheduler.schedule()
    assert plan.num_decode_rows == len(plan.seqs) == 2
    for sampled, path in [(ModelRunnerOutput([[7], [8]], [None, None], [None, None]), "plain"),
                          (ModelRunnerOutput([[7], [8]], [None, [(-0.1, {8: -0.1})]],
                                             [None, None]), "general"),
                          (ModelRunnerOutput([[7], None], [None, None], [None, "boom"]),
                           "general")]:
        taken.clear()
        scheduler.update(plan, sampled)
        assert taken == [path]


def _simulated_rows(fast: bool, monkeypatch, **knobs) -> tuple[list, list, int]:
    planned = []
    real = ContinuousScheduler._schedule_steady_decodes

    def steady(self, output, budget):
        if fast:
            before = len(output.seqs)
            rest = real(self, output, budget)
            planned.append(len(output.seqs) - before)
            return rest
        return list(self.running)

    monkeypatch.setattr(ContinuousScheduler, "_schedule_steady_decodes", steady)
    result = simulate(mixed(48, seed=3), **knobs)
    monkeypatch.undo()
    return ([(s.rows, s.preempted) for s in result.steps], list(result.finish_steps().items()),
            sum(planned))


@pytest.mark.parametrize("knobs", [
    dict(max_num_seqs=16, num_kv_blocks=60, block_size=8, max_num_batched_tokens=256),
    dict(max_num_seqs=8, step_order="prefill_first", policy="priority", max_num_batched_tokens=40,
         watermark_blocks=2, num_kv_blocks=80, block_size=4),
    dict(max_num_seqs=8, max_num_batched_tokens=96, max_prefill_tokens_per_step=64,
         max_wait_steps=20, num_kv_blocks=70, block_size=4),
    dict(max_num_seqs=12, enable_prefix_caching=True, policy="shortest_prompt_first",
         num_kv_blocks=50, block_size=8, max_num_batched_tokens=128),
])
def test_the_steady_decode_fast_path_plans_what_the_general_loop_plans(knobs, monkeypatch):
    fast_rows, fast_ends, planned = _simulated_rows(True, monkeypatch, **knobs)
    general_rows, general_ends, _ = _simulated_rows(False, monkeypatch, **knobs)
    assert fast_rows == general_rows and fast_ends == general_ends
    assert planned > len(fast_rows)                      # it planned most decodes
    assert any(preempted for _, preempted in fast_rows)  # under memory pressure too


def _attribute_uses(path: Path) -> list[tuple[str, str]]:
    """(attribute name, enclosing function) for every attribute in the file's code."""
    uses = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef,
                                                     ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Attribute):
                uses.append((child.attr, function))
            visit(child, inner)

    visit(ast.parse(path.read_text()), "<module>")
    return uses


def test_the_stop_rule_is_stated_once():
    """EOS, stop token ids and max_tokens are read by check_stop alone, in every scheduler
    file: a fast path that asked them itself would state the rule a second time."""
    for path in sorted(SCHEDULER.glob("*.py")):
        for attr, function in _attribute_uses(path):
            if attr in ("eos_token_ids", "stop_token_ids", "ignore_eos", "max_tokens"):
                assert function == "check_stop" or (attr, function) == (
                    "eos_token_ids", "__init__"), f"{path.name}: {function} reads .{attr}"


def test_the_base_schedulers_read_without_overlap_bookkeeping():
    """Placeholders, commits and late stops live in minicb/scheduler/overlap.py alone."""
    overlap_words = {"placeholders", "committed", "commit", "last_token_in_flight",
                     "awaits_last_token"}
    for name in ("base.py", "continuous.py", "static.py"):
        found = {attr for attr, _ in _attribute_uses(SCHEDULER / name)} & overlap_words
        assert not found, f"{name} uses {found}"
    in_overlap = {attr for attr, _ in _attribute_uses(SCHEDULER / "overlap.py")}
    assert {"placeholders", "committed", "last_token_in_flight"} <= in_overlap

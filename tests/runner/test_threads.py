"""The CPU thread policy: the cores other programs leave free, read from the machine."""

from __future__ import annotations

import time

import pytest
import torch

from minicb.bench.neighbour import BusyNeighbour
from minicb.config import EngineConfig
from minicb.runner import threads as policy_module
from minicb.runner.threads import ThreadPolicy, machine_busy_seconds, threads_for


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    saved = policy_module._last_set
    yield
    torch.set_num_threads(before)
    policy_module._last_set = saved


@pytest.mark.parametrize("neighbours, current, cores, most, expected", [
    (0.0, 2, 2, 2, 2), (1.0, 2, 2, 2, 1), (1.8, 2, 2, 2, 1),   # a busy core takes one thread away
    (0.5, 2, 2, 2, 1),   # half a core read while two threads spin: the neighbour needs the core
    (0.2, 2, 2, 2, 2),   # stray load within the tolerance takes nothing
    (0.2, 1, 2, 2, 1),   # coming back up needs a clearly lower reading
    (0.05, 1, 2, 2, 2),
    (0.0, 4, 8, 8, 8), (2.3, 8, 8, 8, 5), (0.0, 2, 16, 4, 4),   # never above the ceiling
    (9.0, 4, 8, 8, 1),   # never below one
])
def test_threads_for(neighbours, current, cores, most, expected):
    assert threads_for(neighbours, cores, current, most) == expected


def test_observe_lowers_and_restores_the_count():
    policy = ThreadPolicy(most=2, cores=2, interval=0.0, first_look=0)
    assert policy.threads == 2 and torch.get_num_threads() == 2
    # over one second the machine was busy 1.9 CPU seconds, 0.9 of them ours: a neighbour
    policy.observe(1.0, 1.9, 0.9)
    assert policy.neighbours == pytest.approx(1.0)
    assert policy.threads == 1 and torch.get_num_threads() == 1
    policy.observe(1.0, 1.02, 1.0)         # the neighbour left
    assert policy.threads == 2 and torch.get_num_threads() == 2
    assert policy.changes == 2


def test_a_fixed_count_never_moves():
    policy = ThreadPolicy(fixed=1, most=2, cores=2)
    policy.observe(1.0, 0.0, 0.0)
    assert policy.threads == 1 and policy.before_step() == 1 and torch.get_num_threads() == 1
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="cpu_threads must be"):
            ThreadPolicy(fixed=bad)
    with pytest.raises(ValueError, match="cpu_threads must be None"):
        EngineConfig(cpu_threads=0)


def test_a_later_engine_starts_from_the_users_ceiling():
    torch.set_num_threads(2)
    first = ThreadPolicy(most=2, cores=2, first_look=0)
    first.observe(1.0, 2.0, 1.0)           # lowered to one under load
    assert torch.get_num_threads() == 1
    second = ThreadPolicy(cores=2, first_look=0)
    assert second.most == 2                # not the 1 the first one left behind
    torch.set_num_threads(1)               # but a user's own choice is the ceiling
    policy_module._last_set = None
    assert ThreadPolicy(cores=2, first_look=0).most == 1


def test_proc_stat_parsing(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice (niced time counts: a niced
    # program still holds the core for whole time slices)
    stat.write_text("cpu  100 20 30 5000 70 4 6 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    import os
    assert machine_busy_seconds(str(stat)) == pytest.approx(170 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("intr 1 2 3\n")
    assert machine_busy_seconds(str(stat)) is None
    assert machine_busy_seconds(str(tmp_path / "missing")) is None


@pytest.mark.skipif(machine_busy_seconds() is None, reason="needs Linux's /proc/stat")
def test_a_real_busy_neighbour_is_seen():
    policy = ThreadPolicy(most=2, cores=2, interval=0.0, first_look=0)
    with BusyNeighbour(deadline=30):
        policy.before_step()
        time.sleep(1.0)
        policy.before_step()
    # the busy loop is one whole core; other programs can only add to it
    assert policy.neighbours > 0.6
    assert policy.threads == 1


@pytest.mark.skipif(machine_busy_seconds() is None, reason="needs Linux's /proc/stat")
def test_the_first_step_already_sees_a_busy_neighbour():
    """A short run must not spend its first quarter second waiting at barriers for a busy core:
    the policy looks before the first step."""
    with BusyNeighbour(deadline=30):
        policy = ThreadPolicy(most=2, cores=2)
        assert policy.neighbours > 0.6 and policy.threads == 1
        assert torch.get_num_threads() == 1


def test_engine_step_consults_the_policy(monkeypatch):
    from minicb import LLM, SamplingParams

    llm = LLM(max_num_seqs=4)
    calls = []
    original = llm.llm_engine.threads.before_step
    monkeypatch.setattr(llm.llm_engine.threads, "before_step",
                        lambda: calls.append(1) or original())
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
                 use_tqdm=False)
    assert len(calls) == 3                 # one prefill step and two decode steps
    fixed = LLM(max_num_seqs=4, cpu_threads=1).llm_engine.threads
    assert not fixed.adaptive and fixed.threads == 1


def test_the_busy_neighbour_dies_with_the_benchmark(tmp_path):
    """A benchmark killed mid-run must not leave its busy loop spinning on the machine."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "bench.py"
    script.write_text("import time\nfrom minicb.bench.neighbour import BusyNeighbour\n"
                      "with BusyNeighbour(deadline=60) as n:\n"
                      "    print(n.process.pid, flush=True)\n    time.sleep(60)\n")
    bench = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(bench.stdout.readline())
    os.kill(bench.pid, signal.SIGKILL)             # no __exit__, no cleanup
    bench.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the busy loop outlived the benchmark that started it")

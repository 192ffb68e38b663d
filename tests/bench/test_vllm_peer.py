"""vLLM as a measured peer: the hand-over to its own environment and back, without vLLM, and
for real where `make peer-vllm` has built it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

from minicb.bench import vllm_peer
from minicb.bench.vllm_peer import VLLMUnavailable, driver_request, parse_result


def load_driver():
    spec = importlib.util.spec_from_file_location("vllm_driver", vllm_peer.DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_request_carries_the_same_workload_and_merged_settings():
    request = driver_request("/models/x", [[1, 2, 3], [4]], [5, 2], 512, {"max_num_seqs": 8})
    assert request["prompts"] == [[1, 2, 3], [4]] and request["output_lens"] == [5, 2]
    assert request["settings"]["max_num_seqs"] == 8             # the caller's knob wins
    assert request["settings"]["max_model_len"] == 512
    assert request["settings"]["dtype"] == "float32"            # the default stays
    json.dumps(request)                                         # all plain JSON
    with pytest.raises(ValueError, match="2 prompts but 1 output"):
        driver_request("/models/x", [[1], [2]], [3], 512)


def test_missing_environment_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICB_VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(VLLMUnavailable, match="make peer-vllm"):
        vllm_peer.check_available()
    from minicb.bench import offline

    with pytest.raises(VLLMUnavailable, match="make peer-vllm"):   # before any system runs
        offline.main(["--num-prompts", "2", "--systems", "continuous-paged", "--peers", "vllm",
                      "--out-dir", str(tmp_path)])


def result_for(outputs, times):
    return {"vllm_version": "0.0-test", "settings": {"max_num_seqs": 4}, "startup_s": 1.0,
            "wall_s": 2.0, "arrival": 100.0, "outputs": outputs, "token_times": times,
            "finished": [t[-1] if t else None for t in times]}


def test_parse_result_checks_the_work_and_times_each_token():
    run = parse_result(result_for([[7, 8, 9], [5]], [[100.5, 100.6, 100.7], [100.2]]),
                       [[1, 2], [3]], [3, 1])
    assert run.outputs == [[7, 8, 9], [5]]
    assert run.metrics[0].ttft == pytest.approx(0.5)
    assert run.metrics[0].tpot == pytest.approx(0.1)
    assert run.settings["vllm_version"] == "0.0-test"
    with pytest.raises(RuntimeError, match="2 tokens for request 0, not 3"):
        parse_result(result_for([[7, 8], [5]], [[100.5, 100.6], [100.2]]), [[1], [3]], [3, 1])
    with pytest.raises(RuntimeError, match="finished 1 of 2"):
        parse_result(result_for([[7, 8, 9], None], [[100.5, 100.6, 100.7], []]), [[1], [3]],
                     [3, 1])


def fake_config(kwargs: dict) -> types.SimpleNamespace:
    """The parts of vLLM's configuration the driver reads back, as LLM(**kwargs) would set them."""
    ns = types.SimpleNamespace
    return ns(model_config=ns(dtype=f"torch.{kwargs['dtype']}",
                              max_model_len=kwargs["max_model_len"], enforce_eager=False),
              scheduler_config=ns(max_num_seqs=kwargs["max_num_seqs"], max_num_batched_tokens=2048),
              cache_config=ns(block_size=128),
              compilation_config=ns(mode="CompilationMode.DYNAMO_TRACE_ONCE", backend="inductor"))


class FakeOutput:
    def __init__(self, request_id, token_ids, finished):
        self.request_id, self.finished = request_id, finished
        self.outputs = [types.SimpleNamespace(token_ids=token_ids)]


class FakeEngine:
    """Steps like vLLM's engine: every unfinished request gains one token per step, outputs are
    cumulative, a request is reported finished when it has max_tokens."""

    def __init__(self):
        self.requests = {}

    def add_request(self, request_id, prompt, params):
        self.requests[request_id] = (prompt["prompt_token_ids"], params.max_tokens, [])

    def has_unfinished_requests(self):
        return any(len(done) < wanted for _, wanted, done in self.requests.values())

    def step(self):
        outs = []
        for request_id, (prompt, wanted, done) in self.requests.items():
            if len(done) < wanted:
                done.append(prompt[0] + len(done))
                outs.append(FakeOutput(request_id, list(done), len(done) == wanted))
        return outs


def test_driver_collects_every_token_and_its_time(monkeypatch):
    fake = types.ModuleType("vllm")
    fake.__version__ = "fake"
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)

    class LLM:
        def __init__(self, **kwargs):
            self.kwargs, self.llm_engine = kwargs, FakeEngine()
            self.llm_engine.vllm_config = fake_config(kwargs)

        def generate(self, prompts, params, use_tqdm=False):
            return []

    fake.LLM = LLM
    monkeypatch.setitem(sys.modules, "vllm", fake)
    driver = load_driver()
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "40")     # inherited: the request must win
    request = driver_request("/m", [[10, 1], [20], [30, 3, 3]], [3, 1, 2], 64,
                             {"omp_threads_bind": "0-1", "max_num_seqs": 8})
    result = driver.run(request)
    assert result["outputs"] == [[10, 11, 12], [20], [30, 31]]
    # the engine settings are read back from the engine, the CPU knobs from the environment
    assert result["engine"]["max_num_seqs"] == 8 and result["engine"]["dtype"] == "float32"
    assert result["engine"]["max_model_len"] == 64
    assert result["engine"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert result["engine"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert result["settings"]["omp_threads_bind"] == "0-1"      # recorded as asked
    assert result["cpu_seconds"] >= 0 and len(result["load_average"]["before"]) == 3
    assert [len(t) for t in result["token_times"]] == [3, 1, 2]
    assert all(t == sorted(t) for t in result["token_times"])
    assert result["finished"][1] <= result["finished"][0]      # the 1-token request ends first
    run = parse_result(result, request["prompts"], request["output_lens"])
    assert run.outputs == result["outputs"]


def test_driver_counts_the_cpu_time_of_the_processes_it_started():
    """vLLM computes in child processes: their CPU time must count, not only the driver's."""
    driver = load_driver()
    burn = ("import sys, time\n"
            "while time.process_time() < 0.5: pass\n"
            "print('done', flush=True); sys.stdin.read()")
    before = driver.process_cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"      # 0.5 CPU seconds spent, alive
        after = driver.process_cpu_seconds()
    finally:
        child.communicate("")
    assert child.pid in after and child.pid not in before
    assert after[child.pid] >= 0.45       # /proc counts in ticks of 10 ms
    assert driver.cpu_seconds_between(before, after) >= 0.45
    # a process alive at both readings counts only what it spent in between
    assert driver.cpu_seconds_between({1: 2.0}, {1: 2.5}) == pytest.approx(0.5)


def test_the_driver_runs_in_vllms_environment_alone(tmp_path, monkeypatch):
    """The command is the launcher (which preloads vLLM's libraries) on the driver; the
    environment keeps what is set here but drops what would point vLLM's python at minicb's
    packages, and names the environment that was checked."""
    monkeypatch.setenv("MINICB_VLLM_VENV", str(tmp_path / "venv"))
    cmd = vllm_peer.command(tmp_path / "d.py", tmp_path / "in.json", tmp_path / "out.json")
    assert cmd == [str(vllm_peer.LAUNCHER), str(tmp_path / "d.py"), str(tmp_path / "in.json"),
                   str(tmp_path / "out.json")]
    assert vllm_peer.LAUNCHER.exists() and os.access(vllm_peer.LAUNCHER, os.X_OK)
    env = vllm_peer.environment({"PATH": "/bin", "PYTHONPATH": "/minicb", "VIRTUAL_ENV": "/v",
                                 "VLLM_CPU_OMP_THREADS_BIND": "0-1"})
    assert env == {"PATH": "/bin", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                   "MINICB_VLLM_VENV": str(tmp_path / "venv")}


def test_the_launcher_preloads_vllms_openmp_and_runs_the_environments_python(tmp_path):
    """peers/vllm_python on a stand-in environment: its python is run with the arguments, and
    the environment's libiomp5 is on LD_PRELOAD."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    lib = venv / "lib" / "python3.12" / "site-packages" / "intel" / "lib"
    lib.mkdir(parents=True)
    (lib / "libiomp5.so").write_text("")
    fake_python = venv / "bin" / "python"
    fake_python.write_text('#!/bin/sh\necho "args=$*"\necho "preload=$LD_PRELOAD"\n')
    fake_python.chmod(0o755)
    done = subprocess.run([str(vllm_peer.LAUNCHER), "driver.py", "a b"], capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"],
                                          "MINICB_VLLM_VENV": str(venv), "LD_PRELOAD": "x.so"},
                          check=True)
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines["args"] == "driver.py a b"
    preload = lines["preload"].split(":")
    assert str(lib / "libiomp5.so") in preload and preload[-1] == "x.so"


def test_driver_refuses_to_run_without_arguments(capsys):
    assert load_driver().main([]) == 2


def test_driver_reports_vllms_version(monkeypatch, capsys):
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.0.test"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    assert load_driver().main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "0.0.test"


def test_what_runs_in_vllms_environment_lives_outside_the_package():
    """The driver and its launcher sit in peers/; nothing in the package imports vLLM, and the
    driver imports nothing of minicb (vLLM's environment does not have it)."""
    root = vllm_peer.ROOT
    assert vllm_peer.DRIVER.parent == vllm_peer.LAUNCHER.parent == root / "peers"
    importing = [str(path.relative_to(root)) for path in (root / "minicb").rglob("*.py")
                 if any(line.lstrip().startswith(("import vllm", "from vllm"))
                        for line in path.read_text().splitlines())]
    assert not importing, f"the package imports vLLM in {importing}: move that code to peers/"
    assert "minicb" not in "".join(line for line in vllm_peer.DRIVER.read_text().splitlines()
                                   if line.startswith(("import ", "from ")))


needs_vllm = pytest.mark.skipif(not (vllm_peer.venv_dir() / ".installed").exists(),
                                reason="vLLM's environment is not built (make peer-vllm); the "
                                       "tests above cover the hand-over")


@needs_vllm
def test_vllm_agrees_with_transformers_on_the_default_model():
    from minicb import default_model_path
    from tests.reference import hf_greedy

    prompts = [[5, 6, 7, 8, 9], [100, 200, 300]]
    run = vllm_peer.run_vllm(str(default_model_path()), prompts, [6, 4], 64)
    references = hf_greedy(str(default_model_path()), prompts, [6, 4])
    assert run.outputs == [r.token_ids for r in references]

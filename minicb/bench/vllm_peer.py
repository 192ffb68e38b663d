"""vLLM's CPU build as a peer in `python -m minicb bench offline --peers vllm`: the side of it
that runs in minicb's environment.

vLLM lives in its own environment (`make peer-vllm` builds `.venv-vllm`): it pins its own torch
and would not share minicb's. What runs there lives outside the package, in `peers/`: the driver
(`peers/vllm_driver.py`) and its launcher (`peers/vllm_python`, `.venv-vllm`'s python with
tcmalloc and vLLM's OpenMP preloaded). This module writes the workload (the same token-id
prompts, output lengths and checkpoint every other system gets) to a file, runs the driver, and
reads back vLLM's tokens and each token's time, which become a `SystemRun` like any other: the
same table, the same greedy-agreement check against transformers.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from minicb.bench.peers import SystemRun, external_run, peer_environment, run_driver

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "peers"          # what runs in a peer's environment, outside the package
DRIVER = PEERS / "vllm_driver.py"
LAUNCHER = PEERS / "vllm_python"
# what vLLM ran best with on a 2-core CPU (benchmarks/vllm.md): its default scheduler limits,
# compiled model (its default), 1 GiB of KV cache, which holds the whole workload
DEFAULT_SETTINGS = {"max_num_seqs": 64, "dtype": "float32", "kv_cache_gib": 1}


class VLLMUnavailable(RuntimeError):
    pass


def venv_dir() -> Path:
    return Path(os.environ.get("MINICB_VLLM_VENV") or ROOT / ".venv-vllm")


def check_available() -> None:
    """Raise VLLMUnavailable, naming the fix, unless vLLM's environment is built."""
    python = venv_dir() / "bin" / "python"
    if not python.exists():
        raise VLLMUnavailable(f"vLLM's environment {venv_dir()} does not exist; build it with "
                              "`make peer-vllm` (about 5 minutes, needs the package index).")
    if not (LAUNCHER.exists() and DRIVER.exists()):
        raise VLLMUnavailable(f"{PEERS} is missing; vLLM runs only from a source checkout of "
                              "minicb (its driver and launcher live in peers/).")


def driver_request(model_path: str, prompts: list[list[int]], output_lens: list[int],
                   max_model_len: int, settings: dict | None = None) -> dict:
    """The JSON the driver reads: one workload, one set of engine settings."""
    if len(prompts) != len(output_lens):
        raise ValueError(f"{len(prompts)} prompts but {len(output_lens)} output lengths")
    merged = {**DEFAULT_SETTINGS, "max_model_len": max_model_len, **(settings or {})}
    return {"model": str(model_path), "prompts": [list(map(int, p)) for p in prompts],
            "output_lens": [int(n) for n in output_lens], "settings": merged}


def command(driver: Path, request_file: Path, result_file: Path) -> list[str]:
    return [str(LAUNCHER), str(driver), str(request_file), str(result_file)]


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's environment: this one, without what would mix minicb's environment into
    vLLM's, and naming the vLLM environment the launcher must use (the one checked)."""
    return {**peer_environment(base), "MINICB_VLLM_VENV": str(venv_dir())}


def parse_result(result: dict, prompts: list[list[int]], output_lens: list[int]) -> SystemRun:
    """vLLM's result as a SystemRun (token ids, and per-request metrics from token times)."""
    settings = {"vllm_version": result["vllm_version"], **result["settings"],
                "startup_s": result["startup_s"]}
    for key in ("engine", "load_average", "processes"):       # what the driver read back
        if key in result:
            settings[key] = result[key]
    return external_run("vLLM", result, prompts, output_lens, settings)


def drive(request: dict, timeout: float = 3600) -> dict:
    """Run the driver on `request` in vLLM's environment; return its result."""
    check_available()
    # python puts the script's folder first on the path: peers/ holds no module that could
    # shadow one vLLM imports
    return run_driver("vLLM", lambda request_file, result_file: command(DRIVER, request_file,
                                                                        result_file),
                      request, environment(), timeout)


def version() -> str:
    """vLLM's version, as its own environment reports it."""
    done = subprocess.run([str(LAUNCHER), str(DRIVER), "--version"], capture_output=True,
                          text=True, env=environment())
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "unknown"


def run_vllm(model_path: str, prompts: list[list[int]], output_lens: list[int],
             max_model_len: int, settings: dict | None = None, timeout: float = 3600) -> SystemRun:
    """Serve the workload with vLLM in its own environment; return what it produced."""
    request = driver_request(model_path, prompts, output_lens, max_model_len, settings)
    # the CPU time is that of the driver and the processes it started (vLLM's scheduler and model
    # processes), measured by the driver around the timed run
    return parse_result(drive(request, timeout), prompts, output_lens)


def run_vllm_runs(model_path: str, runs: list[tuple[list[list[int]], list[int], int]],
                  settings: dict | None = None, max_model_len: int | None = None,
                  timeout: float = 3600) -> list[SystemRun]:
    """Several workloads (prompts, output lengths, requests at once) through ONE vLLM engine, one
    after another: a SystemRun each, whose settings carry vLLM's `spec_decode` counts (drafts,
    proposed and accepted tokens) when it speculates."""
    longest = max(len(p) + n for prompts, lens, _ in runs for p, n in zip(prompts, lens))
    request = driver_request(model_path, runs[0][0], runs[0][1], max_model_len or longest,
                             settings)
    request["runs"] = [{"prompts": [list(map(int, p)) for p in prompts],
                        "output_lens": [int(n) for n in lens], "max_concurrency": int(at_once)}
                       for prompts, lens, at_once in runs]
    result = drive(request, timeout)
    out = []
    for (prompts, lens, _), one in zip(runs, result["runs"]):
        common = {k: result[k] for k in ("vllm_version", "settings", "startup_s", "engine")}
        run = parse_result({**common, **one}, prompts, lens)
        run.settings["wall_s"] = one["wall_s"]
        if "spec_decode" in one:
            run.settings["spec_decode"] = one["spec_decode"]
        out.append(run)
    return out

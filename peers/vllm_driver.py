"""Runs one offline workload through vLLM; executed by `.venv-vllm`'s python, never imported.

    peers/vllm_python peers/vllm_driver.py REQUEST.json RESULT.json
    peers/vllm_python peers/vllm_driver.py --version

It imports nothing from minicb (vLLM's environment does not have it). REQUEST.json holds the
checkpoint directory, the prompts as token ids, each request's output length and the engine
settings; RESULT.json receives vLLM's version, the settings it ran with, every request's output
token ids, the time each request's tokens appeared, the wall time of the run and of the engine's
start-up, the CPU seconds its processes spent during the run, and the load average around it.
A request with "runs" (each: prompts, output_lens, max_concurrency) serves them one after
another through one engine and gives one such result per run under "runs"; with a
"speculative_config" in the settings, each also carries vLLM's draft and acceptance counts.
Requests are submitted all at once to vLLM's engine and stepped to completion, so each token's time
is the time the step that produced it returned, as minicb's engine records it.
"""

from __future__ import annotations

import json
import os
import sys
import time


def process_cpu_seconds() -> dict[int, float]:
    """User + system CPU seconds of this process and every process it started (vLLM runs its
    scheduler and its model in child processes), by process id."""
    import psutil

    me = psutil.Process()
    seconds = {}
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:        # a process that ended between the listing and the reading
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def cpu_seconds_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings by the processes alive at the second one (a process
    started in between counts from zero)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def engine_settings(llm) -> dict:
    """The settings vLLM actually ran with, read back from its configuration."""
    config = llm.llm_engine.vllm_config
    compilation = config.compilation_config
    return {"dtype": str(config.model_config.dtype).removeprefix("torch."),
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "max_model_len": config.model_config.max_model_len,
            "block_size": config.cache_config.block_size,
            "enforce_eager": config.model_config.enforce_eager,
            "compilation_mode": str(compilation.mode), "compile_backend": compilation.backend,
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"),
            "LD_PRELOAD": os.environ.get("LD_PRELOAD", "")}


def run(request: dict) -> dict:
    settings = dict(request["settings"])
    # vLLM's CPU knobs are environment variables; the request's values win over inherited ones,
    # so the settings recorded are the settings run
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings.pop("kv_cache_gib", 1))
    for key, variable in (("omp_threads_bind", "VLLM_CPU_OMP_THREADS_BIND"),
                          ("reserved_cpus", "VLLM_CPU_NUM_OF_RESERVED_CPU")):
        value = settings.pop(key, None)
        if value is not None:
            os.environ[variable] = str(value)
    import vllm
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    if "speculative_config" in settings:      # its acceptance counters need statistics on
        settings.setdefault("disable_log_stats", False)
    llm = LLM(model=request["model"], tokenizer=request["model"], skip_tokenizer_init=True,
              **settings)
    startup = time.perf_counter() - started
    prompts, lengths = request["prompts"], request["output_lens"]
    # warm-up: one short request, so the first timed step does not pay for lazy set-up
    warm = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": prompts[0]}], warm, use_tqdm=False)

    common = {"vllm_version": vllm.__version__, "settings": request["settings"],
              "engine": engine_settings(llm), "startup_s": startup}
    if "runs" not in request:
        return {**common, **serve(llm, prompts, lengths)}
    # several workloads through one engine (a start-up takes tens of seconds on a CPU)
    return {**common, "runs": [serve(llm, r["prompts"], r["output_lens"], r["max_concurrency"])
                               for r in request["runs"]]}


def spec_decode_counters(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters so far (drafts, draft tokens, accepted tokens), from
    its metrics; empty when it keeps none (no speculation, or statistics off)."""
    names = {"vllm:spec_decode_num_drafts": "verify_steps",
             "vllm:spec_decode_num_draft_tokens": "proposed_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    try:
        metrics = llm.get_metrics()
    except Exception:           # an engine built without statistics
        return {}
    return {names[m.name]: m.value for m in metrics if m.name in names}


def serve(llm, prompts: list, lengths: list, max_concurrency: int | None = None) -> dict:
    """Step the engine through one workload, at most `max_concurrency` requests at once (a new
    one added as one finishes), timing every token."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    load_before = os.getloadavg()
    counters_before = spec_decode_counters(llm)
    cpu_before = process_cpu_seconds()
    arrival = time.perf_counter()
    waiting = list(range(len(prompts)))
    limit = max_concurrency or len(prompts)
    running = 0
    token_times: list[list[float]] = [[] for _ in prompts]
    outputs: list[list[int] | None] = [None] * len(prompts)
    finished_at: list[float | None] = [None] * len(prompts)
    while waiting or engine.has_unfinished_requests():
        while waiting and running < limit:
            index = waiting.pop(0)
            params = SamplingParams(max_tokens=lengths[index], temperature=0.0, ignore_eos=True,
                                    detokenize=False)
            engine.add_request(str(index), {"prompt_token_ids": prompts[index]}, params)
            running += 1
        step_outputs = engine.step()
        now = time.perf_counter()
        for out in step_outputs:
            index = int(out.request_id)
            ids = list(out.outputs[0].token_ids)
            token_times[index].extend([now] * (len(ids) - len(token_times[index])))
            if out.finished:
                outputs[index] = ids
                finished_at[index] = now
                running -= 1
    wall = time.perf_counter() - arrival
    cpu_after = process_cpu_seconds()
    after = spec_decode_counters(llm)
    result = {"wall_s": wall, "arrival": arrival, "outputs": outputs, "token_times": token_times,
              "finished": finished_at, "cpu_seconds": cpu_seconds_between(cpu_before, cpu_after),
              "processes": len(cpu_after),
              "load_average": {"before": list(load_before), "after": list(os.getloadavg())}}
    if after:
        result["spec_decode"] = {k: v - counters_before.get(k, 0) for k, v in after.items()}
    return result


def main(argv: list[str]) -> int:
    if argv == ["--version"]:       # what minicb records beside a vLLM server's results
        import vllm

        print(vllm.__version__)
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        request = json.load(f)
    result = run(request)
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":      # vLLM starts worker processes: never run this on import
    sys.exit(main(sys.argv[1:]))

"""Runs one offline workload through vLLM; executed by `.venv-vllm`'s python, never imported.

    scripts/vllm_python minicb/bench/vllm_driver.py REQUEST.json RESULT.json

It imports nothing from minicb (vLLM's environment does not have it). REQUEST.json holds the
checkpoint directory, the prompts as token ids, each request's output length and the engine
settings; RESULT.json receives vLLM's version, the settings it ran with, every request's output
token ids, the time each request's tokens appeared, the wall time of the run and of the engine's
start-up. Requests are submitted all at once to vLLM's engine and stepped to completion, so each
token's time is the time the step that produced it returned, as minicb's engine records it.
"""

from __future__ import annotations

import json
import os
import sys
import time


def run(request: dict) -> dict:
    settings = dict(request["settings"])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.pop("kv_cache_gib", 1)))
    threads = settings.pop("omp_threads_bind", None)
    if threads:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", threads)
    import vllm
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=request["model"], tokenizer=request["model"], skip_tokenizer_init=True,
              **settings)
    startup = time.perf_counter() - started
    engine = llm.llm_engine
    prompts, lengths = request["prompts"], request["output_lens"]
    # warm-up: one short request, so the first timed step does not pay for lazy set-up
    warm = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": prompts[0]}], warm, use_tqdm=False)

    arrival = time.perf_counter()
    for index, (prompt, length) in enumerate(zip(prompts, lengths)):
        params = SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True,
                                detokenize=False)
        engine.add_request(str(index), {"prompt_token_ids": prompt}, params)
    token_times: list[list[float]] = [[] for _ in prompts]
    outputs: list[list[int] | None] = [None] * len(prompts)
    finished_at: list[float | None] = [None] * len(prompts)
    while engine.has_unfinished_requests():
        step_outputs = engine.step()
        now = time.perf_counter()
        for out in step_outputs:
            index = int(out.request_id)
            ids = list(out.outputs[0].token_ids)
            token_times[index].extend([now] * (len(ids) - len(token_times[index])))
            if out.finished:
                outputs[index] = ids
                finished_at[index] = now
    wall = time.perf_counter() - arrival
    return {"vllm_version": vllm.__version__, "settings": request["settings"],
            "startup_s": startup, "wall_s": wall, "arrival": arrival, "outputs": outputs,
            "token_times": token_times, "finished": finished_at}


def main(argv: list[str]) -> int:
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

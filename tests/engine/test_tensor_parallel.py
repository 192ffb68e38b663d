"""Tensor parallelism on a CPU (gloo): a model split over two processes gives the tokens of the
unsplit model, with logprobs within LOGPROB_TOLERANCE, on every family of the parity suite, and
with the engine's features on; a split the heads cannot take is refused naming the sizes that
work; a killed worker ends its requests with an error naming it, and nothing hangs or is left
running.

Each test starts one two-rank engine (a spawned worker costs an interpreter and torch's import)
and stops it when done. Together, the families and scheduler × KV layouts below cover every
family (Llama; Qwen2 and a biased Llama with one KV head, which both ranks hold; Qwen3) and every
scheduler × KV layout once.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from reference import Reference, compare

from minicb import LLM, SamplingParams
from minicb.engine.tp_executor import TensorParallelError
from minicb.serving.async_engine import AsyncLLMEngine
from minicb.serving.server import ServerThread, build_app

# the two runs sum each row-parallel product in two halves instead of one: float32 rounding
LOGPROB_TOLERANCE = 1e-4
COMMON = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, block_size=8)


def workload(num: int = 8, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(3, 512) for _ in range(rng.randint(1, 40))], rng.randint(1, 12))
            for _ in range(num)]


def drive(llm: LLM, requests, params=None, aborts: dict[int, int] | None = None
          ) -> dict[str, list]:
    """Add request i before step i // 2 (arrivals mid-run), abort request j before step
    aborts[j]; each request's (token ids, logprobs) per sample, in sample order."""
    engine, aborts = llm.llm_engine, aborts or {}
    finished: dict[str, list] = {}
    step = added = 0
    while added < len(requests) or engine.has_unfinished_requests():
        while added < len(requests) and added // 2 <= step:
            prompt, max_tokens = requests[added]
            engine.add_request(str(added), prompt, (params or greedy)(added, max_tokens))
            added += 1
        for index, at in aborts.items():
            if at == step and engine.has_request(str(index)):
                engine.abort(str(index))
        for output in engine.step():
            if output.finished:
                finished.setdefault(output.request_id, []).append(output.outputs[0])
        step += 1
    return {rid: [(s.token_ids, s.logprobs) for s in sorted(samples, key=lambda s: s.index)]
            for rid, samples in finished.items()}


def greedy(index: int, max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=5)


def assert_same(one: dict, two: dict) -> None:
    """Every request's samples: equal tokens (a near-tie under the one-rank run may part them,
    as the parity suite allows), and the logprobs of each shared top token within tolerance."""
    assert one.keys() == two.keys()
    for rid in one:
        for sample, ((ids1, lp1), (ids2, lp2)) in enumerate(zip(one[rid], two[rid], strict=True)):
            verdict = compare(Reference(ids1, lp1), ids2, lp2, f"request {rid}/{sample}")
            agreed = len(ids1) if verdict == "equal" else int(verdict.rsplit(" ", 1)[1]) + 1
            for top1, top2 in zip(lp1[:agreed], lp2[:agreed]):
                shared = top1.keys() & top2.keys()
                assert shared, f"request {rid}: no top token in common"
                worst = max(abs(top1[t] - top2[t]) for t in shared)
                assert worst < LOGPROB_TOLERANCE, f"request {rid}: logprobs differ by {worst}"


def assert_blocks_back(llm: LLM) -> None:
    kv = llm.llm_engine.kv
    assert kv.num_free_blocks() == kv.num_blocks, "KV blocks leaked after every request ended"


def both(path: str, run, check=None, **knobs) -> tuple[dict, dict]:
    """`run(llm)` on the unsplit engine, then on a two-rank one, checked by `check(llm)` if given
    and then dropped: going out of scope stops its workers."""
    one = run(LLM(path, **COMMON, **knobs))
    split = LLM(path, tensor_parallel_size=2, **COMMON, **knobs)
    workers = split.llm_engine.runner.workers.processes
    try:
        two = run(split)
        assert_blocks_back(split)
        if check is not None:
            check(split)
    except BaseException:
        split.llm_engine.runner.shutdown()
        raise
    del split
    gc.collect()
    assert not any(p.is_alive() for p in workers), "a dropped engine left its workers running"
    return one, two


@pytest.mark.parametrize("family,scheduler,kv_cache,attention", [
    ("tiny_llama", "naive", "paged", "cpu"),          # 2 KV heads: one per rank
    ("tiny_qwen2", "static", "paged", "cpu"),         # 1 KV head, held by both ranks; q/k/v biases
    ("tiny_qwen3", "static", "contiguous", "torch"),  # per-head q/k norms
    ("tiny_llama_bias", "continuous", "contiguous", "cpu"),  # 1 KV head; o_proj, MLP biases
])
def test_two_ranks_equal_one(request, family, scheduler, kv_cache, attention):
    path = request.getfixturevalue(family)
    requests = workload()

    def holds_its_own_heads(llm: LLM) -> None:
        runner = llm.llm_engine.runner
        config = json.loads((Path(path) / "config.json").read_text())
        assert runner.model.args.num_heads == config["num_attention_heads"] // 2
        # each rank's pool holds its own KV heads: half of them, or the one both ranks hold
        assert runner.kv_caches[0][0].shape[2] == max(1, config["num_key_value_heads"] // 2)

    one, two = both(path, lambda llm: drive(llm, requests), holds_its_own_heads,
                    scheduler=scheduler, kv_cache=kv_cache, attention=attention)
    assert len(two) == len(requests)
    assert_same(one, two)


def test_features_on_two_ranks(tiny_llama):
    """Continuous batching on paged KV with the prefix cache, a pool small enough to preempt,
    overlapped scheduling, seeded sampling of n = 2 samples, and aborts mid-run."""
    shared = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    requests = [(shared + prompt, max(tokens, 8)) for prompt, tokens in workload(seed=1)]

    def sampled(index: int, max_tokens: int) -> SamplingParams:
        if index % 3:
            return greedy(index, max_tokens)
        return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=index, n=2,
                              ignore_eos=True, logprobs=5)

    def run(llm):
        result = drive(llm, requests, sampled, aborts={2: 3, 5: 6})
        engine = llm.llm_engine
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to preempt"
        assert engine.kv.prefix_stats().hit_tokens > 0, "the shared prefix was meant to be reused"
        return result

    one, two = both(tiny_llama, run, enable_prefix_caching=True, num_kv_blocks=12,
                    async_scheduling=True)
    assert_same(one, two)


def test_speculative_decoding_serving_and_a_killed_worker(tiny_qwen2):
    """ngram speculation on two ranks gives the unsplit engine's tokens; the server answers the
    openai client from the two ranks with no error and every KV block back; then a worker is
    killed mid-run: the step raises an error naming it, and so does every later step at once (no
    hang), LLM.generate, and the server (500, the cause in the message)."""
    requests = [(prompt * 3, tokens) for prompt, tokens in workload(seed=2)]
    knobs = dict(speculative_method="ngram", num_speculative_tokens=3)
    one = drive(LLM(tiny_qwen2, **COMMON, **knobs), requests)
    split = LLM(tiny_qwen2, tensor_parallel_size=2, **COMMON, **knobs)
    engine = split.llm_engine
    worker = engine.runner.workers.processes[0]
    try:
        assert_same(one, drive(split, requests))
        with ServerThread(build_app(engine=AsyncLLMEngine(engine), served_model_name="m")) as s:
            client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)

            def complete(prompt: list[int]):
                return client.completions.create(model="m", prompt=prompt, max_tokens=6,
                                                 temperature=0)

            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(complete, [p for p, _ in requests]))
                assert [a.usage.completion_tokens for a in answers] == [6] * len(requests)
                assert_blocks_back(split)
                doomed = pool.submit(client.completions.create, model="m", prompt=[5, 6, 7],
                                     max_tokens=100)
                while engine.num_running == 0:      # until it decodes
                    time.sleep(0.01)
                os.kill(worker.pid, signal.SIGKILL)
                started = time.monotonic()
                with pytest.raises(openai.InternalServerError, match="killed by SIGKILL"):
                    doomed.result(timeout=60)
            with pytest.raises(openai.InternalServerError, match="killed by SIGKILL"):
                complete([5, 6])                    # a new request: refused at once
        engine.add_request("late", [5, 6], greedy(0, 4))
        with pytest.raises(TensorParallelError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"):
            engine.step()
        engine.abort("late")
        engine.step()                       # an abort needs no rank: it is applied and reported
        with pytest.raises(TensorParallelError, match="the engine has stopped"):
            split.generate([[5, 6]], greedy(0, 4), use_tqdm=False)
        assert time.monotonic() - started < 30, "the failure waited for a collective's timeout"
    finally:
        engine.runner.shutdown()
    assert not worker.is_alive()


def test_a_split_the_heads_cannot_take_names_the_sizes_that_work(tiny_llama):
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 cannot split.*1, 2, 4"):
        LLM(tiny_llama, tensor_parallel_size=3, **COMMON)
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1"):
        LLM(tiny_llama, tensor_parallel_size=0)


SCRIPT = """
import signal, sys, torch
from minicb import LLM, SamplingParams
if __name__ == "__main__":
    # Ctrl-C raises KeyboardInterrupt, as in a terminal, even where the test runs as a background
    # job (a shell starts those with SIGINT ignored, and Python then leaves it ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(1)
    llm = LLM(sys.argv[1], tensor_parallel_size=2, max_model_len=64, max_num_seqs=2)
    print(llm.llm_engine.runner.workers.processes[0].pid, flush=True)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    while True:                     # busy until Ctrl-C
        llm.generate([[5, 6, 7]], params, use_tqdm=False)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:     # a zombie is gone, just not yet reaped
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ctrl_c_leaves_no_worker_running(tiny_llama, tmp_path):
    script = tmp_path / "serve_until_interrupted.py"
    script.write_text(textwrap.dedent(SCRIPT))
    process = subprocess.Popen([sys.executable, str(script), tiny_llama], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        worker = int(process.stdout.readline())
        time.sleep(0.5)                  # mid-generate
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        process.kill()                   # a process that outlived the test would spin forever
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), "Ctrl-C left the worker process running"


def test_a_worker_waits_for_the_next_plan_longer_than_a_collective_may(monkeypatch):
    """An idle engine (a server between requests) must not lose its workers: the plan's wait has
    no practical bound, while an all-reduce's wait stays bounded. Two ranks in threads, with the
    all-reduce's timeout cut to half a second and the plan sent after a second."""
    from minicb.engine import tp_group

    monkeypatch.setattr(tp_group, "TIMEOUT", datetime.timedelta(seconds=0.5))
    store = tp_group.master_store(2)
    ranks = [tp_group.TPGroup(0, 2, store.port, "cpu", store),
             tp_group.TPGroup(1, 2, store.port, "cpu")]
    received = []

    def worker() -> None:
        ranks[1].connect()
        received.append(ranks[1].receive())

    thread = threading.Thread(target=worker)
    thread.start()
    ranks[0].connect()
    time.sleep(1.0)
    ranks[0].send(("step", list(range(2000))))       # over the inline size: two broadcasts
    thread.join(timeout=30)
    assert received == [("step", list(range(2000)))]

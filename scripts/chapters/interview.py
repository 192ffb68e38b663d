"""Interview preparation: every chapter's questions (read from the chapter sources), a self-quiz,
and a one-page cheat sheet."""

from pathlib import Path

from minicb.viz import book_interview, interview_markdown

QUESTIONS = book_interview(Path(__file__).resolve().parent)
CHAPTERS = list(dict.fromkeys(q.chapter for q in QUESTIONS))

CELLS = [
    ("md", f"""
    # Interview preparation

    Every chapter of the book ends with interview questions, each with the answer a strong
    candidate gives and **a common wrong answer** to avoid. This notebook gathers all
    {len(QUESTIONS)} of them from the chapters, turns them into a self-quiz, and ends with a
    one-page cheat sheet of the definitions, formulas and numbers worth knowing by heart.

    How to use it: run the quiz, answer each question aloud (or on paper) before revealing the
    answer, and note the ones you missed; then reread the chapter they come from. Interviewers
    care less about the exact words than about the *why*: what a technique trades, and what
    would go wrong without it.
    """),
    ("code", """
    from minicb.viz import book_interview, quiz_widget

    questions = book_interview("../scripts/chapters")       # read from the chapter sources
    for chapter in dict.fromkeys(q.chapter for q in questions):
        print(f"{sum(q.chapter == chapter for q in questions)} questions from {chapter}")
    """),
    ("md", """
    ## The self-quiz

    One question at a time, in a shuffled order; the answer stays hidden until you press
    **Show the answer**. (To drill one chapter: `quiz_widget([q for q in questions if
    q.chapter.startswith("04")])`.) Without a running kernel the widget does not show; every
    question follows below, with its answer folded: click **answer** to open it.
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    quiz_widget(questions, seed=0)
    """),
    ("md", "## Every chapter's questions"),
    *[("md", f"### {chapter}\n\n" + interview_markdown([q for q in QUESTIONS if q.chapter == chapter]))
      for chapter in CHAPTERS],
    ("md", """
    ## Cheat sheet

    **Metrics** (chapter 00; the definitions of vLLM's serving benchmark)

    | term | definition |
    |---|---|
    | TTFT | first token − arrival; queueing included |
    | TPOT | (last token − first token) / (output tokens − 1) |
    | ITL | each gap between consecutive tokens (stutter shows here) |
    | E2E | finish − arrival |
    | throughput | output tokens (or requests) per second, over all users |
    | goodput | requests per second that met *every* SLO (say TTFT ≤ 1 s and TPOT ≤ 50 ms) |
    | p95, p99 | the latency one request in 20 (100) exceeds; SLOs are written on these |

    **Scheduling and memory** (chapters 01–04, 07)

    | term | meaning |
    |---|---|
    | prefill / decode | all prompt tokens in one pass (compute-bound) / one token per request per step (memory-bound) |
    | static batching | a fixed batch runs until its longest member ends; finished rows idle, arrivals wait |
    | continuous batching | iteration-level scheduling: the batch is re-formed every step (Orca) |
    | ragged (packed) batch | requests back to back, no padding: `cu_seqlens`, positions, slot mapping |
    | paged KV | fixed-size blocks from a free list; a block table maps logical to physical blocks |
    | preemption | free a running request's blocks when memory runs out; recompute (or swap) it later |
    | reference count | holders of a block; shared blocks (prefix cache, parallel samples) copy on write |
    | prefix caching | full blocks named by a chained hash of their tokens, reused by later prompts |
    | chunked prefill | a long prompt over several steps, decodes first (stall-free): bounded ITL |
    | online softmax | running max and sum, rescaled tile by tile: exact, one pass, no full score matrix |
    | split-KV | a decode's keys split over programs, merged exactly by log-sum-exp weights |
    | speculative decoding | a drafter proposes k tokens, the model verifies them in one pass; same distribution |
    | disaggregated prefill | prefill and decode on separate GPU pools, the KV cache moved between them |

    **Formulas**

    * KV cache per token = 2 (K and V) × layers × KV heads × head_dim × bytes per value;
      Llama-3-8B in bfloat16: 2 × 32 × 8 × 128 × 2 B = 128 KiB, so 4,096 tokens take 512 MiB.
    * Position *p* of a request lives in slot `table[p // block_size] * block_size + p % block_size`;
      paging wastes at most `block_size − 1` slots per request.
    * Arithmetic intensity in bfloat16: a decode step's weights ≈ batch size FLOP per byte; decode
      attention ≈ *g* (query heads per KV head); a prefill chunk of *c* tokens ≈ *c · g*.
      Ridge point = peak FLOP/s ÷ bandwidth: H100 SXM 989 TFLOP/s ÷ 3.35 TB/s ≈ 295 FLOP per byte.
    * Memory-bound floor of a step: bytes read ÷ bandwidth.
    * Split-KV merge: out = Σₛ exp(lseₛ − lse_max) · oₛ / Σₛ exp(lseₛ − lse_max).

    **Numbers worth citing, with their sources**

    | claim | source |
    |---|---|
    | iteration-level scheduling: 36.9× the throughput of FasterTransformer at the same latency | Orca, OSDI '22 |
    | KV memory holding tokens: 20.4–38.2 % before, < 4 % wasted with paging; 2–4× vs FT and Orca | vLLM, SOSP '23 |
    | up to 23× the throughput of static batching with vLLM, ~8× with continuous batching alone | Anyscale blog, 2023 |
    | chunked prefill, stall-free batching: up to 2.6× serving capacity vs vLLM (Mistral-7B) | Sarathi-Serve, OSDI '24 |
    | split-KV decoding: up to 8× faster long-sequence generation | Flash-Decoding, 2023 |
    | speculative decoding: 2–3× on T5-XXL, 2–2.5× on Chinchilla 70B | Leviathan et al., ICML '23; Chen et al., 2023 |
    | up to 7.4× more requests or 12.6× tighter SLOs than colocated serving | DistServe, OSDI '24 |

    **The book's own numbers**, recomputed from minicb (the real scheduler on the cost-model
    runner, so they are exact):
    """),
    ("code", """
    from minicb.bench.memory import occupancy
    from minicb.sim import simulate
    from minicb.workload import chat, seed_example

    static = simulate(seed_example(), scheduler="static", max_num_seqs=4)
    continuous = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    late = continuous.metrics[4:]
    print(f"worked example (4, 4, 10, 10 on 4 slots, two 4s waiting): static {static.num_steps} steps, "
          f"continuous {continuous.num_steps}; the waiting two enter at step {late[0].first_scheduled_step} "
          f"and finish at step {late[0].finished_step}")
    pool = dict(max_num_seqs=32, max_model_len=512, block_size=16, num_kv_blocks=256)
    for kv_cache in ["contiguous", "paged"]:
        o = occupancy(simulate(chat(64, seed=0), kv_cache=kv_cache, **pool), kv_cache)
        print(f"64 chat requests, one pool of 4,096 token slots, {kv_cache:>10} KV: {o['waste_fraction']:.0%} of "
              f"reserved slots empty, at most {o['max_running']} requests running")
    """),
    ("md", """
    ## Apply it: five requests on four slots

    A drill to do on paper before running the cell. Five requests need answers of 2, 9, 4, 12 and
    3 tokens; there are four slots, and each step gives every running request one token. How many
    steps does a static batch take, and how many does continuous batching take? In which step
    does the 3-token request start, and in which does it finish? Then put in five lengths of your
    own and predict again.
    """),
    ("code", """
    from minicb.workload import fixed

    lengths = [2, 9, 4, 12, 3]          # try your own five
    five = fixed("five requests", [4] * 5, lengths)
    for scheduler in ["static", "continuous"]:
        result = simulate(five, scheduler=scheduler, max_num_seqs=4)
        spans = ", ".join(f"{n}: {m.first_scheduled_step}-{m.finished_step}" for n, m in zip(lengths, result.metrics))
        print(f"{scheduler:>10}: {result.num_steps} steps; first-last step of each answer: {spans}")
    """),
    ("md", """
    The static batch keeps the fifth request waiting until its longest member ends, while the
    slots of the short answers sit empty; it takes the longest answer plus the fifth. Continuous
    batching gives the fifth request the first slot that frees, so it starts a few steps in and
    the total is the longest answer alone (when the late request fits beside it). The short
    request's wait, not the batch's size, is what changed.
    """),
    ("md", """
    ## The classics, worked

    The questions below come up in almost every LLM-serving interview. Each is worked with
    numbers (the arithmetic in a cell, so you can change the inputs), followed by the answer in
    words and a common wrong answer. The hardware and model numbers are public specifications:
    Llama-3-8B's `config.json` (32 layers, 8 KV heads of dimension 128, 8.03 B parameters);
    NVIDIA's datasheets for the H100 SXM 80 GB (3.35 TB/s of HBM3, 989 dense BF16 TFLOP/s) and the
    A100 SXM 80 GB (2.04 TB/s, 312 dense BF16 TFLOP/s). Anything derived from them is a
    prediction, not a measurement.
    """),
    ("code", """
    GB, KiB = 1e9, 1024
    llama3_8b = dict(layers=32, kv_heads=8, head_dim=128, params=8.03e9)
    h100 = dict(memory=80 * GB, bandwidth=3.35e12, flops=989e12)
    a100 = dict(memory=80 * GB, bandwidth=2.04e12, flops=312e12)


    def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_value=2):
        return 2 * layers * kv_heads * head_dim * bytes_per_value          # K and V, every layer


    per_token = kv_bytes_per_token(32, 8, 128)
    weights = llama3_8b["params"] * 2                                       # bf16
    print(f"Llama-3-8B: {per_token / KiB:.0f} KiB of KV per token; {weights / GB:.1f} GB of weights")
    """),
    ("md", """
    ### How many requests fit on one GPU?
    """),
    ("code", """
    budget = 0.9 * h100["memory"] - weights - 4 * GB      # 90% of the GPU, minus weights and ~4 GB of activations
    tokens = budget / per_token
    for context in [1_000, 4_000, 32_000]:
        print(f"{tokens:,.0f} tokens of KV: {tokens / context:,.0f} requests of {context:,} tokens at once")

    import json
    from pathlib import Path

    from minicb import default_model_path

    cfg = json.loads((Path(default_model_path()) / "config.json").read_text())
    mine = kv_bytes_per_token(cfg["num_hidden_layers"], cfg["num_key_value_heads"],
                              cfg["hidden_size"] // cfg["num_attention_heads"], bytes_per_value=4)
    print(f"minicb's default model in float32: {mine / KiB:.0f} KiB per token; 1 GiB of RAM holds {2**30 // mine:,} tokens")
    """),
    ("md", """
    **Answer.** Capacity = (GPU memory the engine may use − weights − activation headroom) / KV
    bytes per token, then divide by the tokens a request holds (prompt + answer so far). For
    Llama-3-8B on an 80 GB H100: 128 KiB per token (2 × 32 layers × 8 KV heads × 128 × 2 bytes),
    about 52 GB left for KV, about 400,000 tokens: some 100 requests of 4,000 tokens, or 12 of
    32,000. With paging, the count is of tokens actually held, not of `max_model_len` per request.
    *A common wrong answer:* "80 GB / 16 GB of weights = 5 copies, so 5 requests", or forgetting
    that the KV cost is per token *per request* and grows with the context.

    ### What is the fastest a single user can be served (the TPOT floor)?
    """),
    ("code", """
    for name, gpu in [("H100", h100), ("A100", a100)]:
        floor = weights / gpu["bandwidth"]
        naive = 2 * llama3_8b["params"] / gpu["flops"]
        print(f"{name}: weights / bandwidth = {floor * 1e3:.1f} ms per token (at most {1 / floor:.0f} tokens/s); "
              f"FLOPs / peak would say {naive * 1e3:.3f} ms")
    """),
    ("md", """
    **Answer.** At batch 1 every decode step reads all the weights once: TPOT ≥ weight bytes /
    memory bandwidth, about 4.8 ms on an H100 and 7.9 ms on an A100 for an 8B model in bf16
    (plus the KV read, which grows with the context). Published measurements sit a little above
    the floor: lmdeploy reports 10 ms per token for Llama-2-7B on an A100 (floor 6.6 ms).
    *A common wrong answer:* "2 × 8 GFLOP / 989 TFLOP/s = 0.016 ms": that counts arithmetic, which
    is idle most of the step; it is 300 times too optimistic.

    ### At what batch size does decode turn compute-bound?
    """),
    ("code", """
    for name, gpu in [("H100", h100), ("A100", a100)]:
        ridge = gpu["flops"] / gpu["bandwidth"]
        print(f"{name}: ridge point {ridge:.0f} FLOP per byte -> the weight products turn compute-bound near batch {ridge:.0f}")
    """),
    ("md", """
    **Answer.** A decode step's matrix products do 2 FLOP per weight per request and read each
    2-byte weight once: B FLOP per byte at batch B. They turn compute-bound where that meets the
    GPU's ridge point (peak FLOP/s ÷ bandwidth): about 300 on an H100, 150 on an A100. Attention
    never does: each request reads its own K and V, so its intensity stays about 1 FLOP per byte
    whatever the batch; long contexts keep decode memory-bound even at large batches. (On a CPU
    the ridge is a few FLOP per byte: chapter 03 measured the batch costing much more there.)
    *A common wrong answer:* "batching makes all of decode compute-bound", or "decode is
    compute-bound because GPUs are fast".

    ### Little's law: how many requests are in flight?
    """),
    ("code", """
    from minicb.calibrate import A100_LLAMA2_7B
    from minicb.workload import poisson_arrivals

    rate = 10.0                                           # requests per second
    traffic = chat(300, seed=0).with_arrivals(poisson_arrivals(300, rate, seed=1))
    run = simulate(traffic, cost=A100_LLAMA2_7B, max_num_seqs=256, max_num_batched_tokens=2048)
    busy = sum((s.end - s.start) * len(s.rows) for s in run.steps) / run.steps[-1].end
    e2e = sum(m.finished_time - m.arrival_time for m in run.metrics) / len(run.metrics)
    served = len(run.metrics) / (run.steps[-1].end - run.metrics[0].arrival_time)
    print(f"measured: {busy:.1f} requests in flight on average; Little's law: {served:.2f}/s x {e2e:.2f} s = {served * e2e:.1f}")
    """),
    ("md", """
    **Answer.** In a steady state, requests in the system = arrival rate × time each spends there
    (L = λ·W). At 10 requests/s and 5 s per request, 50 are in flight: the engine needs 50 slots
    (`max_num_seqs`) and KV for 50 contexts, and if each request slows down (longer W) under load,
    concurrency rises with it. The cell checks it on the simulator with the A100 cost model (the
    two sides differ only by the run's start and end). *A common wrong answer:* "concurrency is
    the request rate", or sizing the batch from throughput alone.

    ### Why do small decode steps need CUDA graphs?
    **Answer.** A decode step launches hundreds of small kernels (per layer: norms, projections,
    rotary, attention, MLP; times 32 layers), and each launch from Python and the CUDA driver
    costs a few microseconds of CPU time. When the step itself is a few milliseconds (a small
    model, or a small batch), the GPU waits for the CPU between kernels. A CUDA graph records
    the launches of one step once and replays them with a single call. Shapes must be fixed, so
    engines capture one graph per batch size in a set of buckets and pad a batch up to the next
    one. *A common wrong answer:* "CUDA graphs make kernels run faster": the kernels are the
    same; only the launch gaps disappear (and a prefill with large, variable shapes gains
    little). On a CPU the analogue is per-operation overhead in eager PyTorch, and minicb's cure
    is the same idea by other means: a step of a few decodes runs each layer as one C call,
    which took a one-row step of the default model from 2.9 to 1.2 ms (chapter 07).

    ### What does `gpu_memory_utilization` do, and how does an engine size its block pool?
    **Answer.** It is the fraction of the GPU's memory the engine may use (vLLM's default 0.9).
    At start-up the engine loads the weights, runs a dummy forward pass at the largest step it
    will schedule (`max_num_batched_tokens`) to measure peak activation memory, and gives
    everything left within that fraction to KV blocks: blocks = (total × fraction − weights −
    peak activations − other) / bytes per block. minicb sizes its pool from the knobs instead
    (`num_kv_blocks`, by default enough for `max_num_seqs` requests of `max_model_len`), since a
    CPU's memory is shared with everything else. *A common wrong answer:* "it is the fraction of
    memory given to the KV cache", or "set it to 1.0 for more speed" (no room is left for
    activations, CUDA graphs or the allocator's fragmentation, and the engine fails to start).

    ### How do GQA, MQA and MLA shrink the KV cache?
    """),
    ("code", """
    layers, heads, dim = 80, 64, 128                     # Llama-2-70B
    for name, kv_heads in [("multi-head (MHA)", 64), ("grouped-query, 8 groups (GQA, the real model)", 8),
                           ("multi-query (MQA)", 1)]:
        print(f"{name:>46}: {kv_bytes_per_token(layers, kv_heads, dim) / KiB:7.0f} KiB per token")
    mla = 60 * (512 + 64) * 2                            # DeepSeek-V2: 60 layers, latent 512 + rope key 64
    print(f"{'DeepSeek-V2 multi-head latent (MLA)':>46}: {mla / KiB:7.1f} KiB per token")
    """),
    ("md", """
    **Answer.** KV bytes per token are 2 × layers × KV heads × head dim × bytes. Grouped-query
    attention lets several query heads share one KV head (Llama-2-70B: 64 query heads, 8 KV
    heads: 8× less KV); multi-query attention keeps a single KV head (64× less, at some cost in
    quality); DeepSeek-V2's multi-head latent attention caches one compressed 512-dimensional
    latent plus a 64-dimensional rotary key per layer and rebuilds K and V from it (the paper
    reports 93.3% less KV cache than its 67B dense predecessor). Less KV per token means more
    requests per GPU and less to read per decode step. *A common wrong answer:* "GQA mainly saves
    compute": the projections shrink a little, but the point is the cache.

    ### What do tensor parallelism and quantisation do to the KV budget?
    """),
    ("code", """
    def tokens_per_gpu(tp=1, weight_bytes=2, kv_bytes=2):
        free = 0.9 * h100["memory"] - llama3_8b["params"] * weight_bytes / tp - 4 * GB
        return free / (kv_bytes_per_token(32, 8 // tp, 128, kv_bytes))

    print(f"1 GPU, bf16:              {tokens_per_gpu():>12,.0f} tokens of KV")
    print(f"2 GPUs (TP=2), each:      {tokens_per_gpu(tp=2):>12,.0f} tokens (4 KV heads each)")
    print(f"1 GPU, FP8 KV cache:      {tokens_per_gpu(kv_bytes=1):>12,.0f} tokens")
    print(f"1 GPU, 4-bit weights:     {tokens_per_gpu(weight_bytes=0.5):>12,.0f} tokens")
    """),
    ("md", """
    **Answer.** Tensor parallelism splits each layer's heads over the GPUs, so each GPU caches
    only its share of the KV heads (per-token KV per GPU divides by TP while TP ≤ KV heads; past
    that, KV heads are replicated) and holds only 1/TP of the weights, so the KV budget per GPU
    grows on both counts: with TP=2, each GPU holds more than twice the tokens one GPU did. An FP8 KV cache halves
    the bytes per token (twice the tokens); 4-bit weights free most of the weight memory for KV.
    *A common wrong answer:* "TP only adds compute; each GPU still needs the full cache", or
    "quantising weights does not affect how many requests fit".

    ### Speculative decoding: why does its gain shrink at large batch?
    """),
    ("code", """
    alpha, k = 0.8, 4                                    # acceptance rate, drafted tokens per step
    tokens_per_pass = (1 - alpha ** (k + 1)) / (1 - alpha)
    for batch in [1, 16, 64, 256]:
        normal = A100_LLAMA2_7B.step_time(0, batch, batch * 1000)                   # one token per request
        verify = A100_LLAMA2_7B.step_time(batch * (k + 1), 0, 0) + A100_LLAMA2_7B.context_token * batch * 1000
        speedup = tokens_per_pass * normal / verify
        print(f"batch {batch:>3}: one verify pass yields {tokens_per_pass:.2f} tokens per request; speed-up {speedup:.2f}x")
    """),
    ("md", """
    **Answer.** A drafter proposes k tokens and the large model checks them in one pass; with
    acceptance rate α a pass yields (1 − α^(k+1)) / (1 − α) tokens on average (Leviathan et al.,
    ICML 2023), 3.4 for α = 0.8 and k = 4. At batch 1 the pass costs about as much as one decode
    step, because decode is memory-bound and the extra tokens ride on the same weight read. At
    large batch the step is already using the arithmetic: verifying k + 1 tokens for every
    request costs real FLOPs, so the gain shrinks (here from 3.3× at batch 1 to about 2× at 256,
    with 1,000-token contexts whose KV reads keep even large steps partly memory-bound; shorter
    contexts or larger batches shrink it further, towards nothing once the step is
    compute-bound). The cell estimates it with the A100 cost model of chapter 03 (draft cost
    ignored, so these are upper bounds).
    *A common wrong answer:* "speculative decoding always gives 2–3×", or "it changes the output"
    (the rejection-sampling rule keeps the large model's distribution exactly).

    ### A system-design question
    "Serve 20 requests per second of chat traffic (prompts of 1,000 tokens, answers of 200) with
    Llama-3-8B, TTFT p95 under 1 s and TPOT under 50 ms. How many H100s, and which knobs?"
    """),
    ("code", """
    rate, prompt, answer = 20, 1_000, 200
    prefill_flops = 2 * llama3_8b["params"] * prompt                      # per request
    prefill_s = rate * prefill_flops / (0.5 * h100["flops"])              # at 50% of peak (an assumption)
    tpot = 0.020                                                          # a working TPOT, under the 50 ms SLO
    in_flight = rate * answer * tpot                                      # Little's law on the decode phase
    kv_read = in_flight * (prompt + answer / 2) * per_token / h100["bandwidth"]
    step = weights / h100["bandwidth"] + kv_read                          # one decode step for all of them
    decode_s = rate * answer / in_flight * step                           # steps needed per second x step time
    busy = prefill_s + decode_s
    print(f"prefill: {prefill_s:.2f} GPU-seconds per second; decode: {in_flight:.0f} requests in flight, "
          f"a step of {step * 1e3:.1f} ms, {decode_s:.2f} GPU-seconds per second")
    print(f"total {busy:.2f} GPU-seconds per second -> {busy / 0.6:.1f} H100s at 60% utilisation; "
          f"KV in flight {in_flight * (prompt + answer) * per_token / GB:.0f} GB per replica set")
    """),
    ("md", """
    **Answer (an estimate, to be checked with a load test).** Split the work. Prefill: 20 × 1,000
    tokens × 16 GFLOP per token is 320 TFLOP per second, about 0.65 H100-seconds per second at half
    of peak. Decode: at a working TPOT of 20 ms, Little's law puts 80 requests in flight; one
    step reads the weights (4.8 ms) and their KV (about 3 ms), so the 4,000 tokens per second need
    50 steps, about 0.4 H100-seconds. About 1.1 H100s of work in total (1.8 at 60% busy); run GPUs at no more than
    about 60% so that p95 TTFT survives bursts: **2 H100s**, each a replica with its own engine
    (data parallel; the model fits one GPU, so tensor parallelism would only add communication),
    and a third for failover if the SLO is strict. Knobs: `max_num_seqs` of 128–256 (the KV for
    80 requests of 1,200 tokens is about 13 GB, well within 52 GB); `max_num_batched_tokens` of about
    2,048 with chunked prefill, so a 1,000-token prompt never stalls the streams (each step stays
    well under the 50 ms TPOT); `gpu_memory_utilization` 0.9; prefix caching if the prompts share
    a system prompt (it removes most of the prefill); then a load test at 20 requests per second
    (open loop, chapter 06) to confirm p95 TTFT and TPOT, and admission control (503) for load
    beyond the design. *A common wrong answer:* sizing from throughput alone ("an H100 does
    10,000 tokens per second, 4,000 are needed, so one GPU"), which ignores prefill's compute,
    the headroom p95 latency needs, and failover.
    """),
]

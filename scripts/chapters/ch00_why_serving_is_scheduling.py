"""Chapter 00: why serving is a scheduling problem (metrics, prefill vs decode, the trade-off)."""

CELLS = [
    ("md", """
    # 00 · Why serving is a scheduling problem

    A language model answers one token at a time. A server answers many people at once. Between
    the two sits a scheduler that decides, again and again, whose tokens the model computes next.
    This chapter names what users feel, measures it on a real model, and shows why the model's
    two kinds of work (reading a prompt, writing an answer) make the scheduler matter.

    **Learning goals.** After this chapter you can

    1. define TTFT, TPOT, ITL, end-to-end latency, throughput and goodput, and compute them from
       a request's timestamps;
    2. say why servers report p95 and p99 rather than the mean;
    3. explain why prefill is compute-bound and decode memory-bound, using arithmetic intensity
       and a roofline;
    4. describe the trade-off between throughput and time to first token, and why the product
       decides where to sit on it.
    """),
    ("md", """
    **An analogy for non-specialists.** A restaurant kitchen has a few burners and a rail of
    order tickets. How long a guest waits for the starter (time to first token), how evenly the
    courses arrive (time per output token), and how many meals leave the kitchen per hour
    (throughput) all depend less on how fast the cook is than on *which ticket goes on which
    burner, and when*. An idle burner while tickets wait is lost money; a burner hogged by one
    twelve-course order while everyone else's starter waits is lost guests.
    """),
    ("code", """
    %matplotlib inline
    import torch

    from minicb import LLM, SamplingParams, viz
    from minicb.model.default import natural_output_lengths
    from minicb.metrics import percentiles, summarize
    from minicb.sim import CostModel, simulate
    from minicb.workload import chat, fixed, poisson_arrivals, seed_example

    torch.manual_seed(0)
    # the default model is tiny: one thread is about as fast as several and keeps timings steady
    torch.set_num_threads(1)
    """),
    ("md", """
    ## 1. What a user feels

    Every request carries timestamps: when it arrived, when it was first scheduled, when each
    output token came out, when it finished. The metrics are differences between them
    (`minicb.metrics`, with the definitions of vLLM's serving benchmark):

    | metric | definition | what the user feels |
    |---|---|---|
    | **TTFT**, time to first token | first token − arrival (queueing included) | "is it doing anything?" |
    | **TPOT**, time per output token | (last token − first token) / (output tokens − 1) | reading speed of the stream |
    | **ITL**, inter-token latency | each gap between consecutive tokens | stutter: one slow gap in a smooth stream |
    | **E2E**, end-to-end latency | finish − arrival | how long the whole answer took |
    | **throughput** | output tokens (or requests) per second, over all users | the operator's bill |
    | **goodput** | requests per second meeting *every* target (say TTFT ≤ 1 s, TPOT ≤ 50 ms) | throughput that counts |

    The picture below uses the book's worked example (chapter 03 derives it): six requests, four
    batch slots, times in *engine steps* (virtual time: every step makes one token per running
    request). Request E arrived with the others but found every slot taken.
    """),
    ("code", """
    result = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    viz.request_timelines(result.metrics, names=list("ABCDEF"), annotate=4)
    """),
    ("md", """
    E's time to first token is 5 steps, and 4 of them were spent *waiting for a slot*: queueing
    is part of TTFT, which is why TTFT is the first metric to suffer when a server is busy. The
    same numbers for every request, in steps (these come from the real scheduler, so they are
    exact):
    """),
    ("code", """
    rows = [{"request": name, "output_tokens": m.num_output_tokens, "queue": m.queue_steps, "ttft": m.ttft_steps,
             "tpot": m.tpot_steps, "e2e": m.e2e_steps} for name, m in zip("ABCDEF", result.metrics)]
    print(viz.format_table(rows))
    """),
    ("md", """
    ## 2. Measured on a real model

    The same metrics, in seconds, from the model that ships with minicb: a small Llama trained on
    the Python standard library (`minicb.default_model_path()`). Twelve prompts arrive together;
    the engine runs up to four at a time, greedy decoding, each answer ending when the model emits
    its end-of-text token (or at 48 tokens).
    """),
    ("code", """
    llm = LLM(max_num_seqs=4)      # model=None: the shipped default model; continuous batching
    args = llm.llm_engine.model.args
    num_params = sum(p.numel() for p in llm.llm_engine.model.parameters())
    print(f"{args.num_layers} layers, hidden {args.hidden_size}, {args.num_heads} query heads / "
          f"{args.num_kv_heads} KV heads, vocabulary {args.vocab_size}: {num_params / 1e6:.1f} M parameters")
    """),
    ("code", """
    PROMPTS = ["def is_palindrome(text):", "class Stack:", "def read_lines(path):", "import os\\n",
               "def fibonacci(n):", "def flatten(items):", "class Point:", "def merge(a, b):",
               "def parse_args(argv=None):", "def count_words(text):", "class Timer:", "def clamp(x, lo, hi):"]
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=48, temperature=0), use_tqdm=False)
    print(PROMPTS[0] + outputs[0].outputs[0].text)
    print("output tokens:", [len(o.outputs[0].token_ids) for o in outputs])
    print("finish reasons:", [o.outputs[0].finish_reason for o in outputs])
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    summary = summarize([o.metrics for o in outputs], slo_ttft=1.0, slo_tpot=0.05)
    ms = lambda stats: {k: round(v * 1e3, 1) for k, v in stats.items()}
    print("TTFT ms", ms(summary.ttft))
    print("TPOT ms", ms(summary.tpot))
    print("ITL  ms", ms(summary.itl))
    print("E2E  ms", ms(summary.e2e))
    print(f"throughput {summary.output_throughput:.0f} output tokens/s, {summary.request_throughput:.2f} requests/s")
    print(f"goodput (TTFT <= 1 s and TPOT <= 50 ms) {summary.goodput:.2f} requests/s")
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    viz.request_timelines([o.metrics for o in outputs], virtual=False, names=[f"p{i}" for i in range(12)],
                          annotate=8)
    """),
    ("md", """
    Read the lanes as you read the steps above: the first four prompts start at once, the others
    wait for a free slot, so their TTFT includes a queue. Then look at the percentiles: a mean
    TTFT hides the users at the back of the queue, while p95 ("95 % of requests did at least this
    well") is what the unluckiest regular user sees. Servers publish p50, p95 and p99, and
    goodput counts only the requests that met *every* target, so a server cannot buy throughput
    by making a few users wait forever. (The word is older than LLM serving; its serving sense
    comes from DistServe, OSDI '24, which defines goodput as the highest request rate a system
    sustains while meeting the SLOs. vLLM's benchmark reports it per second, as here.)

    ## 3. How long are answers?

    A scheduler cannot know how long an answer will be: the model decides, token by token. The
    lengths the default model chose by itself for 300 held-out prompts (greedy, stopped by its
    end-of-text token or cut at 256 tokens; recorded in `eval.json` when the model was built):
    """),
    ("code", """
    lengths = natural_output_lengths()
    CAP = 256                      # the evaluation's max_new_tokens: an answer this long never ended
    ended = [n for n in lengths if n < CAP]
    print(f"{len(lengths)} answers: {len(ended)} ended by themselves, {len(lengths) - len(ended)} were cut at {CAP}")
    print("lengths of those that ended:", {k: round(v) for k, v in percentiles(ended, (10, 50, 90)).items()},
          f"min {min(ended)}, max {max(ended)}")
    viz.length_spread(lengths, cap=CAP)
    """),
    ("md", """
    The spread is the point. Among the answers that ended by themselves, the shortest takes a
    handful of tokens and the longest nearly thirty times as many (the left panel, on a log
    scale, so that a cap does not squash it). Most answers, though, never ended at all (the right
    panel): a model this small often repeats itself instead of stopping, and only the cap of 256
    tokens ended them. Real chat answers range from one word to pages, and some never end without
    a limit either. Either way the scheduler learns how long an answer is only when it stops. When
    requests share a batch that ends only with its longest member (chapter 02), the short ones pay
    for the long ones; servers bound answers with `max_tokens` and stop strings, and chapter 03
    lets a finished request leave the batch at once.

    ## 4. Two kinds of work: prefill and decode

    A request is served in two phases:

    * **prefill**: the whole prompt goes through the model in one pass, every layer writing its
      keys and values into the KV cache; the last position's logits give the first output token.
    * **decode**: each later step feeds only the newest token; attention finds everything else in
      the cache. One token per request per step.

    Both phases read every weight of the model once per step. What differs is how much arithmetic
    each read pays for. A weight matrix of *N* parameters multiplied by *T* token vectors costs
    2·N·T floating-point operations and moves about 2·N bytes (bf16 weights), so its **arithmetic
    intensity** is about *T* FLOP per byte. A prefill of 512 tokens has *T* = 512; a decode step
    of one request has *T* = 1; a decode step of a batch of 64 requests has *T* = 64.

    A **roofline** says what a device can attain at a given intensity: `min(peak FLOP/s,
    bandwidth × intensity)`. Below, an H100 SXM (989 TFLOP/s dense BF16 and 3.35 TB/s of HBM3,
    from NVIDIA's datasheet):
    """),
    ("code", """
    H100_FLOPS, H100_BYTES_PER_S = 989e12, 3.35e12
    points = {"decode, 1 request": 1, "decode, batch of 64": 64, "prefill, 512-token prompt": 512}
    viz.roofline(H100_FLOPS, H100_BYTES_PER_S, points, title="H100 SXM roofline (bf16 weights)")
    """),
    ("md", """
    Decode at batch size 1 sits far left of the ridge (≈ 295 FLOP/byte): the arithmetic units
    wait for memory and reach about 1/300 of their peak. Prefill sits right of the ridge: it is
    compute-bound. The cure for decode is to give every weight read more work, by decoding many
    requests in the same step. That is batching, and deciding *which* requests share a step is
    the scheduler's job.

    The same asymmetry shows on a CPU. Below, one 256-token prompt is prefilled (TTFT of a
    request with `max_tokens=1`), then one request decodes 64 tokens alone (its TPOT):
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    vocab = llm.llm_engine.vocab_size
    long_prompt = fixed("one long prompt", [256], [1]).prompt_token_ids(vocab, seed=0)[0]   # 256 random ids
    llm.generate([long_prompt], SamplingParams(max_tokens=1), use_tqdm=False)          # warm-up
    prefill = llm.generate([long_prompt], SamplingParams(max_tokens=1), use_tqdm=False)[0].metrics
    decode = llm.generate(["def main():"], SamplingParams(max_tokens=64, temperature=0, ignore_eos=True),
                          use_tqdm=False)[0].metrics
    prefill_rate = 256 / prefill.ttft
    decode_rate = 1 / decode.tpot
    print(f"prefill: 256 tokens in {prefill.ttft * 1e3:.0f} ms = {prefill_rate:,.0f} tokens/s")
    print(f"decode:  one token every {decode.tpot * 1e3:.1f} ms = {decode_rate:,.0f} tokens/s")
    print(f"prefill moves {prefill_rate / decode_rate:.0f}x more tokens per second than a lone decode")
    """),
    ("md", """
    Same model, same machine, same weights read: the prefill pushes far more tokens through per
    second than a lone decode, because one pass over the weights serves 256 tokens instead of
    one (on a 2-core CPU the per-step overhead of launching a forward pass widens the gap further).
    Chapter 01 measures the same effect for decode alone: one step that decodes *B* requests
    costs far less than *B* steps that decode one each.

    ## 5. The trade-off: throughput versus the first token

    More concurrent work per step means more tokens per second, up to the device's limit. But
    once requests arrive faster than the server can finish them, they queue, and TTFT grows
    without bound while throughput stops growing. Below, the real continuous scheduler serves 200
    chat-like requests (prompts 16–128 tokens, answers mostly short with a long tail) arriving
    as a Poisson process at rising rates, in the cost model's virtual time: each step costs 1 unit,
    plus 0.05 per request in the batch, plus 1/64 per prompt token.
    """),
    ("code", """
    cost = CostModel(step_overhead=1.0, decode_seq=0.05, prefill_token=1 / 64)
    workload = chat(200, seed=0)
    rows = []
    for rate in [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5]:
        arrivals = poisson_arrivals(len(workload), rate, seed=1)
        run = simulate(workload.with_arrivals(arrivals), cost=cost, max_num_seqs=16)
        s = run.summary(virtual=False, slo_ttft=20, slo_tpot=2.0)
        rows.append({"offered_rate": rate, "tokens_per_unit": s.output_throughput, "ttft_p50": s.ttft["p50"],
                     "ttft_p95": s.ttft["p95"], "tpot_p50": s.tpot["p50"], "goodput": s.goodput})
    print(viz.format_table(rows, digits=3))
    """),
    ("code", """
    viz.tradeoff_curve(rows, x="tokens_per_unit", y="ttft_p95", label="offered_rate", logy=True,
                       xlabel="throughput (output tokens per time unit)", ylabel="TTFT p95 (time units)",
                       title="200 chat requests, 16 slots: each point is an offered request rate")
    """),
    ("md", """
    Up to about 0.1 requests per unit, throughput follows the offered load and TTFT stays near
    the cost of one prefill step. Past it, throughput flattens near its ceiling while the p95
    TTFT climbs by two orders of magnitude: the extra requests only lengthen the queue. Goodput
    (TTFT ≤ 20 and TPOT ≤ 2) peaks at the knee and then *falls*, although raw throughput is
    still at its highest.

    Where to sit on this curve is a product decision, made before any tuning: a chat product needs
    a first token within a second or so and runs left of the knee (add capacity or shed load
    before the queue builds); code completion needs an even tighter TTFT; an offline batch job
    (summarise a million documents overnight) cares only about tokens per second and runs
    saturated. The rest of the book is about moving the whole curve down and to the right, with
    the scheduler.
    """),
    ("md", """
    ## Pause and recall

    1. Which two timestamps define TTFT, and why does TTFT include queueing?
    <details><summary>Answer</summary>

    The request's arrival at the server and the moment its first output token is ready. The
    user's clock starts when they send the request, not when the server gets round to it, so any
    time spent waiting for a slot is part of what they feel.
    </details>
    2. A stream shows one token every 20 ms except one 600 ms gap. Which metric shows the gap, TPOT
       or ITL?
    <details><summary>Answer</summary>

    ITL (the inter-token latencies, and their p99). TPOT is the average over the whole answer,
    so one gap among many 20 ms intervals barely moves it.
    </details>
    3. Why is decode at batch size 1 memory-bound while a long prefill is compute-bound? State it
       with arithmetic intensity.
    <details><summary>Answer</summary>

    A decode step reads every weight once (2 bytes each in bf16) and does 2 FLOP per weight for
    its one token: about 1 FLOP per byte, far below a GPU's ridge point (about 150 FLOP per byte
    on an A100), so memory bandwidth sets its speed. A prefill of n tokens reuses each weight n
    times: about n FLOP per byte, above the ridge for a few hundred tokens, so arithmetic sets it.
    </details>
    4. Throughput is still rising but goodput has started to fall. What is happening to the
       requests?
    <details><summary>Answer</summary>

    The server is past the load it can serve within the targets: the queue and the batch keep
    growing, so more tokens come out per second while each request waits longer for its first
    token or receives the rest more slowly, and a growing share of requests miss their TTFT or
    TPOT target and no longer count.
    </details>

    ## Interview questions

    **Why not optimise only for throughput and ignore TTFT?**
    Throughput is the operator's number; users feel latency. Past the knee, more offered load adds
    almost no throughput and a lot of queueing: p95 TTFT explodes while tokens per second look
    great. Goodput against explicit TTFT and TPOT targets is the number to optimise.
    *A common wrong answer:* "high throughput implies a good user experience."

    **Why is decode memory-bound?**
    Each decode step reads every weight (and the cache) to produce one token per request:
    arithmetic intensity is about the batch size, far below a GPU's ridge point of hundreds of
    FLOP per byte, so the arithmetic units wait for memory. Batching more requests per step raises
    the intensity of the weight reads (one read of the weights serves every row), not of
    attention: each request reads its own keys and values, so attention's intensity stays about
    the number of query heads per KV head whatever the batch.
    *A common wrong answer:* "because the KV cache is large": the cache adds traffic, but even with
    no cache a batch-1 decode is memory-bound, because the weights are read for a single token.

    **Why report p95 rather than the mean?**
    Latency distributions under load are skewed: the queue's tail dominates what users remember
    and what SLOs are written against. The mean can look fine while one user in twenty waits ten
    times longer.
    *A common wrong answer:* "percentiles are just noisier means."

    ## Exercise

    The coding exercises start with chapter 01 (`exercises/ch01_kv_loop.py`: the prefill and
    decode loop with a KV cache). To practise this chapter's ideas, change the SLO in section 5
    (say TTFT ≤ 5) and find the offered rate with the highest goodput; then set `max_num_seqs=4`
    and see the knee move.

    **Next:** chapter 01 serves requests the simplest way, one at a time, and measures what that
    costs.
    """),
]

"""Chapter 03: continuous batching (the per-step loop, ragged batches, the knobs, the memory problem)."""

CELLS = [
    ("md", """
    # 03 · Continuous batching

    Static batching decides the batch once and lives with it until the longest member finishes.
    **Continuous batching** (iteration-level scheduling, introduced by Orca, OSDI '22) decides it
    again at *every step*: a finished request leaves at once, a waiting one takes its slot at the
    very next step, and the batch is a living thing whose members come and go. This chapter runs
    the book's worked example on the real scheduler, looks inside a ragged batch, measures the
    scheduler's two main knobs, and ends at the problem that continuous batching creates for
    memory.

    **Learning goals.** After this chapter you can

    1. state the per-step loop: remove finished, admit waiting, build the batch, run one step;
    2. explain why the worked example takes 10 steps instead of static batching's 14;
    3. read a ragged packed batch (no padding) through `cu_seqlens`, positions and slot mapping;
    4. say what `max_num_seqs` and `max_num_batched_tokens` trade, with measurements;
    5. explain why reserving `max_model_len` of KV per request wastes most of the memory.
    """),
    ("md", """
    **An analogy for non-specialists.** Chapter 02's elevator waits for its whole group to finish
    the ride before anyone new gets on. An **escalator** never stops: people step off at the top
    and others step on at the bottom, every moment, and no step rides empty while someone is
    waiting. (Or: a bus that waits at the terminus for everyone to get off, versus a revolving
    door.)
    """),
    ("code", """
    %matplotlib inline
    import torch

    from minicb import LLM, SamplingParams, viz
    from minicb.metrics import summarize
    from minicb.sim import CostModel, simulate
    from minicb.workload import capped_exponential, chat, fixed, long_tail, poisson_arrivals, seed_example

    torch.manual_seed(0)
    # the default model is tiny: one thread is about as fast as several and keeps timings steady
    torch.set_num_threads(1)
    """),
    ("md", """
    ## 1. The per-step loop

    Every step, the scheduler

    1. **removes** the requests that finished in the previous step (their slots and KV return);
    2. **admits** waiting requests while there is a free slot, token budget and memory;
    3. **builds** the batch: one token for every running request, the prompt of every new one;
    4. **runs** one forward pass and appends each request's new token.

    The diagram of one step, the loop every continuous-batching engine runs:

    ```
           ┌──────────────────────────── one step ─────────────────────────────┐
    waiting │ 1. remove finished ─▶ 2. admit while slots, ─▶ 3. pack one batch ─▶ │─▶ 4. run the model,
    queue ─▶│    (free their KV)      token budget and KV       (no padding)     │   append a token each
           └──────────────────────────────▲─────────────────────────────────────┘          │
                                          └──────────── next step ◀────────────────────────┘
    ```

    ### Build it: a scheduler step in thirty lines

    A request here is a few counters: its prompt length, the tokens it may generate, how many of
    its tokens already have K/V in the cache (`computed`) and how many it has generated. The
    step's plan is a list of (request, tokens to compute). Running requests go first, one token
    each (or the next chunk of a long prompt); then waiting requests are admitted, in arrival
    order, while a slot is free and the step's token budget lasts. A prompt longer than what is
    left of the budget is **chunked**: this step computes what fits, the next steps the rest.
    """),
    ("code", """
    from dataclasses import dataclass


    @dataclass
    class Req:
        name: str
        prompt_len: int
        max_tokens: int
        computed: int = 0           # tokens whose K/V are in the cache
        generated: int = 0          # output tokens so far

        @property
        def uncomputed(self) -> int:
            return self.prompt_len + self.generated - self.computed


    def schedule(waiting, running, max_num_seqs, token_budget):
        \"\"\"One step's plan: [(request, tokens)], running requests first, then admissions.\"\"\"
        plan, budget = [], token_budget
        for r in running:                                    # everyone running: a token, or a chunk
            n = min(r.uncomputed, budget)
            if n:
                plan.append((r, n))
                budget -= n
        while waiting and len(running) < max_num_seqs and budget > 0:
            r = waiting.pop(0)                               # admit in arrival order
            running.append(r)
            plan.append((r, min(r.uncomputed, budget)))      # a long prompt is chunked
            budget -= plan[-1][1]
        return plan


    def serve(requests, max_num_seqs, token_budget):
        \"\"\"Run every request to the end; return each step's rows (name, kind, tokens).\"\"\"
        waiting, running, steps = list(requests), [], []
        while waiting or running:
            plan = schedule(waiting, running, max_num_seqs, token_budget)
            steps.append([(r.name, "prefill" if r.uncomputed > 1 or r.generated == 0 else "decode", n)
                          for r, n in plan])
            for r, n in plan:                                # the model runs: n more tokens cached
                r.computed += n
                if r.uncomputed == 0:                        # all caught up: it gets a new token
                    r.generated += 1
            running[:] = [r for r in running if r.generated < r.max_tokens]   # remove finished
        return steps


    seed = serve([Req(n, 1, t) for n, t in zip("ABCDEF", [4, 4, 10, 10, 4, 4])], max_num_seqs=4,
                 token_budget=64)
    print(f"{len(seed)} steps; E and F enter at step",
          [i + 1 for i, rows in enumerate(seed) if any(name in "EF" and kind == "prefill"
                                                       for name, kind, _ in rows)])
    """),
    ("md", """
    Ten steps, E and F entering at step 5: the worked example, from thirty lines. Your exercise
    (`exercises/ch03_scheduler_step.py`) grows this toward minicb's: the KV pool, preemption when
    it runs out, and the victim rule.

    ### Prove it: the same schedule as minicb's, step by step

    Now the same requests go through minicb's own `ContinuousScheduler`, driven by the cost-model
    runner (`minicb.sim.simulate`: the real scheduler and KV manager, the model replaced by a
    clock), and the two schedules are compared row by row: which request, prefill or decode, how
    many tokens. First the seed example, then 40 random requests with prompts up to 300 tokens on
    a 128-token budget, so long prompts are chunked.
    """),
    ("code", """
    import random


    def first_difference(ours, theirs):
        for step, (a, b) in enumerate(zip(ours, theirs), 1):
            if a != b:
                return f"step {step}: ours {a} vs minicb {b}"
        return None if len(ours) == len(theirs) else f"{len(ours)} steps vs minicb's {len(theirs)}"


    def compare(prompt_lens, output_lens, max_num_seqs, token_budget, scheduler_step=None):
        names = [str(i) for i in range(len(prompt_lens))]
        ours = serve([Req(n, p, o) for n, p, o in zip(names, prompt_lens, output_lens)],
                     max_num_seqs, token_budget)
        real = simulate(fixed("check", prompt_lens, output_lens), max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=token_budget)
        theirs = [step.rows for step in real.steps]
        return len(ours), first_difference(ours, theirs)


    rng = random.Random(0)
    random_prompts = [rng.randint(1, 300) for _ in range(40)]
    random_outputs = [rng.randint(1, 40) for _ in range(40)]
    print("seed example:       steps, first difference =", compare([1] * 6, [4, 4, 10, 10, 4, 4], 4, 64))
    print("40 random requests: steps, first difference =",
          compare(random_prompts, random_outputs, 8, 128))
    """),
    ("md", """
    No difference in a single row. A check that cannot fail proves nothing, so here is the same
    comparison with one line of `schedule()` changed: the admitted prompt takes all its tokens
    instead of what is left of the budget (no chunking).
    """),
    ("code", """
    import inspect

    correct = schedule
    broken = inspect.getsource(schedule).replace("plan.append((r, min(r.uncomputed, budget)))",
                                                 "plan.append((r, r.uncomputed))")
    assert broken != inspect.getsource(schedule), "the line to break was not found"
    exec(broken)                     # redefines schedule() with that one line changed
    print("without chunking:   steps, first difference =",
          compare(random_prompts, random_outputs, 8, 128))
    schedule = correct
    """),
    ("md", """
    ### Read the real thing

    minicb's scheduler, shown from the installed package (these cells print the code the engine
    runs, with its file and line numbers). `schedule()` builds the step against a `StepBudget`:
    """),
    ("code", """
    from minicb.scheduler.continuous import ContinuousScheduler, StepBudget

    viz.show_source(ContinuousScheduler.schedule)
    """),
    ("code", """
    viz.show_source(StepBudget)
    """),
    ("md", """
    What production adds to the thirty lines, and why:

    * **Memory.** Before a request takes tokens, the KV manager must find room for their K/V
      (`kv.can_allocate`). Our version assumed an endless pool.
    * **Preemption and its victim rule.** When a running request needs a block and none is free,
      the scheduler evicts one (`_pick_victim`): the latest arrival not yet in this step, or the
      lowest priority under the priority policy. Latest-first is a heuristic: the newest request
      has usually computed the least, so recomputing it later costs least, but a late request
      with a long prompt can have more to lose. Its blocks are freed and it goes back to the
      front of the queue.
    * **Admission order.** FCFS is one policy among three; `WaitingQueue.in_order` finds the first
      pick with one scan and orders the rest as a heap only when a step admits a second.
    * **The prefill cap and the watermark.** `max_prefill_tokens_per_step` chunks prompts even
      when the token budget would fit them, so decodes keep flowing; `watermark_blocks` keeps
      some KV free for running requests to grow into.
    * **Sharing.** A request may start from KV that is already computed: a cached prefix
      (chapter 07) or its first sample's prompt (n > 1).
    """),
    ("code", """
    viz.show_source(ContinuousScheduler._admit_waiting)
    """),
    ("code", """
    viz.show_source(ContinuousScheduler._pick_victim)
    """),
    ("code", """
    from minicb.scheduler.queue import WaitingQueue

    viz.show_source(WaitingQueue.in_order)
    """),
    ("md", """
    ## 2. The worked example, on the real scheduler

    From here on, the schedules come from minicb's `ContinuousScheduler`
    (`minicb/scheduler/continuous.py`), driven by the cost-model runner: the real scheduler and KV
    manager, with the model replaced by a clock. Four requests needing 4, 4, 10 and 10 tokens fill
    four slots; two more 4-token requests wait.
    """),
    ("code", """
    names = dict(zip("012345", "ABCDEF"))
    static = simulate(seed_example(), scheduler="static", max_num_seqs=4)
    continuous = simulate(seed_example(), scheduler="continuous", max_num_seqs=4)
    for label, run in [("static", static), ("continuous", continuous)]:
        finish = {names[k]: v for k, v in run.finish_steps().items()}
        print(f"{label:>10}: {run.num_steps} steps; finish steps {finish}")
    for name, m in zip("EF", continuous.metrics[4:]):
        print(f"{name} enters at step {m.first_scheduled_step} and finishes at step {m.finished_step}")
    viz.compare_timelines({"static": static, "continuous": continuous}, names=names)
    """),
    ("md", """
    The real scheduler's decisions, step by step (4 slots, a budget of 2,048 tokens; every
    request here has a one-token prompt): who was admitted, who finished, the KV blocks free after
    the step, and the token budget the step left unused.
    """),
    ("code", """
    budget = 2048
    for step in continuous.steps:
        admitted = [names[r] for r, kind, _ in step.rows if kind == "prefill"]
        finished = [names[k] for k, v in continuous.finish_steps().items() if v == step.step]
        used = sum(tokens for _, _, tokens in step.rows)
        print(f"step {step.step:>2}: admitted {','.join(admitted) or '-':<7} finished "
              f"{','.join(finished) or '-':<5} free blocks {step.num_free_blocks:>3}  "
              f"budget left {budget - used}")
    """),
    ("md", """
    Why 10 instead of 14? In the static batch E and F wait for the batch barrier (step 10) and then
    need 4 more steps. Continuously, they take A's and B's slots the moment those finish (step 5),
    and are done by step 8, *while* C and D are still decoding; the schedule ends when C and D end.
    The win is not a bigger batch: both schedules use four slots. It is reusing a slot the step it
    frees up.

    **Joining and leaving, step by step.** Requests arriving one after another on three slots
    (times in cost-model units; a step takes about one): A enters and decodes; B joins while A
    runs; C joins; A finishes and leaves; D, arriving later, takes A's slot.
    """),
    ("code", """
    arrivals = fixed("A, B, C, D", [4] * 4, [3, 6, 6, 4]).with_arrivals([0, 1, 2, 3])
    story = simulate(arrivals, max_num_seqs=3)
    for step in story.steps:
        print(f"step {step.step}: " + ", ".join(f"{names[r]} {kind}" for r, kind, _ in step.rows))
    viz.slot_timeline(story, names=names, title="A leaves after step 3; D takes its slot at step 4")
    """),
    ("md", """
    ### Apply it: five requests on four slots

    This section's example in miniature, to do on paper before running the cell. Five requests
    need answers of 2, 9, 4, 12 and 3 tokens; there are four slots, and each step gives every
    running request one token. How many steps does a static batch take, and how many does
    continuous batching take? In which step does the 3-token request start, and in which does it
    finish? Then put in five lengths of your own and predict again.
    """),
    ("code", """
    lengths = [2, 9, 4, 12, 3]          # try your own five
    five = fixed("five requests", [4] * 5, lengths)
    for scheduler in ["static", "continuous"]:
        result = simulate(five, scheduler=scheduler, max_num_seqs=4)
        spans = ", ".join(f"{n}: {m.first_scheduled_step}-{m.finished_step}" for n, m in zip(lengths, result.metrics))
        print(f"{scheduler:>10}: {result.num_steps} steps; first-last step of each answer: {spans}")
    """),
    ("md", """
    The static batch keeps the 3-token request waiting until its longest member (12 tokens) ends,
    while the slots of the short answers sit empty: 12 + 3 = 15 steps. Continuously, the 3-token
    request takes the 2-token request's slot at step 3 and is done at step 5; the schedule ends
    when the 12-token answer does, 12 steps. The rule to carry away: with continuous batching the
    schedule is as long as the longest *chain* of answers sharing a slot, not the sum of batch
    maxima.
    """),
    ("md", """
    ## 3. Ragged batches: no padding

    Because requests join at any step, one step mixes requests at different stages: some decode
    one token, a newcomer prefills its whole prompt. Padding them to a rectangle would waste even
    more than in chapter 02, so the engine **packs** them back to back, and tells the attention
    kernel where each request's tokens start (`cu_seqlens_q`), where each token sits in its own
    sequence (`positions`), and where its keys and values go in the cache (`slot_mapping`).

    Below, the real engine runs three requests for two steps, then a fourth arrives with a 6-token
    prompt. The next step's batch, as the runner builds it:
    """),
    ("code", """
    engine = LLM(scheduler="continuous", max_num_seqs=4).llm_engine
    for i, ids in enumerate([[11, 12, 13], [21, 22, 23, 24], [31, 32]]):
        engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=8, temperature=0))
    engine.step()
    engine.step()                                              # a prefill step, then a decode step
    engine.add_request("r3", [41, 42, 43, 44, 45, 46], SamplingParams(max_tokens=8, temperature=0))
    plan = engine.scheduler.schedule()
    input_ids, positions, meta, logits_indices = engine.runner.prepare(plan)
    print("rows:        ", [(s.request.request_id, "prefill" if s.is_prefill else "decode", s.num_tokens)
                            for s in plan.seqs])
    print("cu_seqlens_q:", meta.cu_seqlens_q.tolist())
    print("positions:   ", positions.tolist())
    print("seq_lens:    ", meta.seq_lens.tolist())
    print("slot_mapping:", meta.slot_mapping.tolist())
    print("logits rows: ", logits_indices.tolist(), "| padding tokens:", plan.num_pad_tokens)
    """),
    ("md", """
    Nine tokens, nine rows of work: three decodes (one token each, at positions 4, 5 and 3 of
    their own sequences) and the newcomer's six prompt tokens. Each query reads only its own
    request's keys: a decode reads everything its request has cached, the prefill is causal
    among its six tokens. Nothing is padded, and nothing crosses between requests:
    """),
    ("code", """
    viz.attention_mask([1, 1, 1, 6], packed=True, num_cached=[4, 5, 3, 0],
                       title="one step: three decodes and a 6-token prefill")
    """),
    ("md", """
    **Padding is not truncation.** Padding *adds* dummy tokens so that rows of different lengths
    make a rectangle: the model computes them and a mask hides them (chapter 02's waste).
    Truncation *cuts* tokens off a prompt that is longer than the context allows, and the answer
    then never sees them. Continuous batching removes padding; it never truncates. A prompt longer
    than `max_model_len` is refused with an error that names the limit (minicb, like vLLM, leaves
    the decision of what to cut to the caller).
    """),
    ("md", """
    The kernels that compute this efficiently, reading each request's keys from wherever the
    cache keeps them, are chapter 05's subject.

    ## 4. The knobs and what they trade

    Two knobs bound every step:

    * `max_num_seqs`: how many requests may be running at once (the slots);
    * `max_num_batched_tokens`: how many tokens one step may carry, decodes and prefill chunks
      together. A prompt longer than what is left of the budget is split over several steps
      (chunked prefill).

    Every production engine has the same two knobs under its own names: vLLM `max_num_seqs` and
    `max_num_batched_tokens`; SGLang `--max-running-requests` and `--chunked-prefill-size`
    (with `--max-prefill-tokens`); Hugging Face TGI `--max-batch-size` and
    `--max-batch-total-tokens` (with `--max-batch-prefill-tokens`); TensorRT-LLM `max_batch_size`
    and `max_num_tokens`.

    Their effect depends on the traffic, so measure. Below, 200 requests with long-tailed prompts
    (16–512 tokens) and answers arrive as a Poisson process at 0.1 requests per time unit, and the
    real scheduler serves them under nine settings. The cost model charges 1 unit per step, 0.05
    per running request and 1/64 per prompt token, so a bigger batch or a big prefill makes *that
    step* slower for everyone in it.
    """),
    ("code", """
    cost = CostModel(step_overhead=1.0, decode_seq=0.05, prefill_token=1 / 64)
    traffic = long_tail(200, seed=0)
    traffic = traffic.with_arrivals(poisson_arrivals(len(traffic), 0.1, seed=1))
    rows = viz.knob_sweep(traffic, max_num_seqs=[4, 16, 64], max_num_batched_tokens=[64, 256, 2048], cost=cost)
    print(viz.format_table(rows))
    """),
    ("code", """
    viz.tradeoff_curve(rows, x="tokens_per_unit", y="ttft_p95", label="max_num_seqs", group="max_num_batched_tokens",
                       logy=True, xlabel="throughput (output tokens per time unit)", ylabel="TTFT p95 (time units)",
                       title="each point a max_num_seqs; each line a token budget")
    """),
    ("md", """
    What the table says, knob by knob:

    * **`max_num_seqs`**: at this load, 4 slots cannot keep up: requests queue and TTFT p95 runs
      into the thousands. More slots raise throughput and cut the queue, but every step carries
      more rows, so each user's stream slows: with a budget of 256 or more, TPOT p50 roughly
      doubles from 16 to 64 slots. On a GPU more slots also means more KV memory (section 7),
      which is what finally caps it.
    * **`max_num_batched_tokens`**: a small budget chops long prompts into chunks spread over
      many steps, so a newcomer's first token comes later (higher TTFT), but no single step is
      slowed by a huge prefill, so running users see a smooth stream (ITL p99 about 2–3 units).
      A large budget gives newcomers their first token sooner and lifts throughput, at the price
      of stutters for everyone else (ITL p99 up to 18 units with 64 slots): the prefill–decode
      interference that chunked prefill (Sarathi-Serve, OSDI '24) was designed to tame.

    Real schedulers have three more knobs, each guarding against a failure of its own. **Memory
    headroom**: admitting every long context that arrives fills the KV cache, and the scheduler
    must then evict someone mid-answer; keeping some blocks free at admission avoids that.
    **Fairness**: admitting only what is cheap (the shortest prompts first) starves the large
    requests, so a request that has waited too long must go first. **TTFT targets**: holding
    newcomers back to build a fatter batch raises throughput and makes every new arrival wait.
    Chapter 07 measures all three (`watermark_blocks`, `max_wait_steps`, the admission policies).

    So the knobs trade throughput and time to first token against the smoothness of everyone
    else's stream, and the product decides which matters: chat wants a bounded TTFT *and* a
    steady stream; an offline job takes the biggest batch that fits. Move the sliders to see the
    schedule change (`minicb.viz.knob_widget` redraws it with `minicb.viz.knob_view`, re-running
    the real scheduler on 48 chat requests):
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    knob_traffic = chat(48, seed=0)
    knob_traffic = knob_traffic.with_arrivals(poisson_arrivals(len(knob_traffic), 0.3, seed=1))

    viz.knob_widget(knob_traffic, cost=cost, max_num_seqs=8, max_num_batched_tokens=256)
    """),
    ("md", """
    The same idea as a static picture, for readers without a running kernel: the same 48 requests
    with 2, 8 and 16 slots and a budget of 256 tokens.
    """),
    ("code", """
    settings = {f"max_num_seqs={n}": simulate(knob_traffic, cost=cost, max_num_seqs=n, max_num_batched_tokens=256)
                for n in [2, 8, 16]}
    viz.compare_timelines(settings)
    """),
    ("md", """
    ## 5. Is the cost model right? Calibrate it

    Every number in section 4 came from a cost model someone made up: 1 unit per step, 0.05 per
    running request, 1/64 per prompt token. A conclusion drawn from a made-up model is only as
    good as the model, so measure what a step really costs. `minicb.calibrate` runs the real
    engine through steps of known shapes (1 to 48 decode rows, short and long contexts, a 64- or
    256-token prompt joining) and fits four terms by least squares:

    > step time = overhead + *a* × prompt tokens + *b* × decode rows + *c* × keys the decode rows read

    The last term is new: a decode row reads every key its request has cached, so attention's
    cost grows with the context, not only with the batch. On your machine (wall-clock, so these
    numbers are yours):
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    import math

    from minicb.calibrate import A100_LLAMA2_7B, REFERENCE_CPU, calibrate
    from minicb.sim import serve_at_rates

    fit = calibrate(repeats=5)          # about ten seconds of real steps, 24 shapes
    print(viz.format_table(fit.table()))
    c = fit.cost
    print(f"this machine: {c.step_overhead * 1e3:.2f} ms per step + {c.prefill_token * 1e6:.0f} us per prompt token + "
          f"{c.decode_seq * 1e3:.3f} ms per decode row + {c.context_token * 1e6:.2f} us per key read "
          f"(R^2 {fit.r2:.3f}, worst error {fit.worst_error:.0%})")
    """),
    ("md", """
    The rest of the section uses two fixed calibrations, so its numbers are the same on every run:
    `REFERENCE_CPU`, the same measurement on this book's 2-core CPU
    (`python -m minicb bench calibrate`, results in `benchmarks/results/calibration.json`; taken
    with the model's torch modules, before chapter 07's one-call-per-layer decode steps made small
    steps cheaper, so your own fit above can show a smaller overhead), and
    `A100_LLAMA2_7B`, the four terms solved from lmdeploy's published benchmark of Llama-2-7B in
    fp16 on an A100-80GB (batch 1 against batch 64 at short context, batch 16 at long context,
    the first token after 128 and 2,048 prompt tokens; the derivation is in
    `minicb/calibrate.py`). Pass `cost=fit.cost` instead to redo it all for your machine. First,
    what each model says a few typical steps cost, as multiples of one decode step of one request:
    """),
    ("code", """
    caricature = CostModel(step_overhead=1.0, decode_seq=0.05, prefill_token=1 / 64)
    models = {"section 4's caricature": caricature, "this book's CPU (measured)": REFERENCE_CPU,
              "A100 + Llama-2-7B (published)": A100_LLAMA2_7B}
    shapes = {"1 decode": (0, 1, 256), "16 decodes": (0, 16, 16 * 256), "64 decodes": (0, 64, 64 * 256),
              "64 decodes, 4x context": (0, 64, 64 * 1024), "512-token prompt": (512, 0, 0)}
    table = []
    for name, model in models.items():
        one = model.step_time(*shapes["1 decode"])
        row = {"cost model": name, "1 decode step": f"{one * 1e3:.1f} ms" if model.unit == "s" else f"{one:g} unit"}
        row.update({shape: f"{model.step_time(*args) / one:.1f}x" for shape, args in shapes.items() if shape != "1 decode"})
        table.append(row)
    print(viz.format_table(table))
    """),
    ("md", """
    (Every decode row here has 256 keys cached; "4x context" gives each 1,024.) The three disagree
    where it matters. On the A100, 64 decodes cost 1.6 times one: the weights are read once per
    step whoever is in it, so a bigger batch rides almost free, which is the premise of this whole
    book. On this CPU, 64 decodes cost about 6 times one: a CPU has little bandwidth *and* little
    arithmetic, so at 64 rows the matrix products, not the weight reads, fill the step (a CPU's
    ridge point is a few FLOP per byte; an A100's is about 150). The made-up model sat in between.
    Long contexts cost the GPU more (every key is read from memory: 64 rows of 1,024 keys add a
    third of a step on the A100) and the CPU less, relative to its already expensive rows. A
    512-token prompt costs about 4 decode steps on the A100 and 20 on this CPU.

    Now section 4's sweep again under both, each at 70% of its own capacity (the rate at which
    the 64-slot, 2,048-token setting serves the 200 requests when they all arrive at once), so both
    machines are equally busy:
    """),
    ("code", """
    def sweep(cost):
        base = long_tail(200, seed=0)
        capacity = serve_at_rates(base, [math.inf], cost=cost, max_num_seqs=64,
                                  max_num_batched_tokens=2048)[0]["requests_per_unit"]
        timed = base.with_arrivals(poisson_arrivals(len(base), 0.7 * capacity, seed=1))
        rows = viz.knob_sweep(timed, max_num_seqs=[4, 16, 64], max_num_batched_tokens=[64, 256, 2048], cost=cost)
        return capacity, [{"max_num_seqs": r["max_num_seqs"], "max_num_batched_tokens": r["max_num_batched_tokens"],
                           "tokens/s": r["tokens_per_unit"], "TTFT p95 ms": r["ttft_p95"] * 1e3,
                           "TPOT p50 ms": r["tpot_p50"] * 1e3, "ITL p99 ms": r["itl_p99"] * 1e3} for r in rows]


    for name in ["this book's CPU (measured)", "A100 + Llama-2-7B (published)"]:
        capacity, rows = sweep(models[name])
        print(f"{name}: capacity {capacity:.1f} requests/s, traffic at {0.7 * capacity:.1f}")
        print(viz.format_table(rows, digits=1))
        print()
    """),
    ("md", """
    Which conclusions of section 4 survive, and where:

    * **Too few slots queue everyone, on both machines.** With 4 slots, TTFT p95 runs into
      seconds on the CPU and tens of seconds on the A100, and throughput falls short of the
      traffic. That conclusion does not depend on the cost model.
    * **The price of a bigger batch does not transfer.** On this CPU a decode row costs about a
      twentieth of a step, so TPOT p50 rises by half from 4 to 16 slots; 64 slots change nothing
      here because, at this load, no more than 16 requests are ever running. On the A100 a row
      costs a hundred-and-fiftieth of a step: going from 16 to 64 slots cuts TTFT p95 from over a
      second to about a tenth (budget 256) for 6% more TPOT. Section 4's "TPOT roughly doubles
      from 16 to 64 slots" holds on neither machine: it was an artefact of the made-up model.
    * **The token budget trades first tokens against stutters, on both.** A small budget gives
      the smoothest streams and later first tokens; 2,048 gives the fastest first tokens and
      an ITL p99 about five times the smooth value on the CPU and three times on the A100, because a prompt chunk
      costs real time everywhere (a 512-token prompt is 4 decode steps on the A100 and 19 on
      this CPU). This is the trade-off chunked prefill manages, and it holds on any hardware.

    So the knobs trade the same things everywhere, but by how much, and so where to set them,
    depends on the machine: measure on the hardware you serve on.
    """),
    ("md", """
    ## 6. Measured on the real model

    The same twelve requests (prompts of 24 tokens, answers of 2 to 48 tokens, mostly short)
    through the naive, static and continuous engines with four slots:
    """),
    ("code", """
    answer_lengths = capped_exponential(12, mean=16, cap=48, seed=3, minimum=2)
    twelve = fixed("twelve requests", [24] * 12, answer_lengths)
    outputs = {}
    for scheduler in ["naive", "static", "continuous"]:
        llm = LLM(scheduler=scheduler, max_num_seqs=4)
        prompts = twelve.prompt_token_ids(llm.llm_engine.vocab_size, seed=0)
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in answer_lengths]
        outputs[scheduler] = (llm.generate(prompts, params, use_tqdm=False), llm.llm_engine.scheduler.step_count)
    tokens = {name: [o.outputs[0].token_ids for o in outs] for name, (outs, _) in outputs.items()}
    print("answer lengths:", answer_lengths)
    print("steps:", {name: steps for name, (_, steps) in outputs.items()})
    print("same tokens from all three:", tokens["naive"] == tokens["static"] == tokens["continuous"])
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    base = summarize([o.metrics for o in outputs["naive"][0]]).output_throughput
    for name, (outs, _) in outputs.items():
        s = summarize([o.metrics for o in outs])
        print(f"{name:>10}: {s.output_throughput:5.0f} tokens/s ({s.output_throughput / base:.1f}x naive), "
              f"TTFT p50 {s.ttft['p50']:.2f} s, p95 {s.ttft['p95']:.2f} s, TPOT p50 {s.tpot['p50'] * 1e3:.0f} ms")
    """),
    ("md", """
    Same tokens, fewer steps, more throughput, and a lower p95 TTFT: continuous batching gives the
    short requests their slots back as soon as anyone finishes. (On a 2-core CPU a step's cost
    grows with its batch faster than on a GPU, so the wall-clock ratios are smaller than the step
    counts suggest; Orca reported up to 36.9× the throughput of FasterTransformer at the same
    latency on GPUs; Anyscale's 2023 benchmark measured up to 23× the throughput of static
    batching with vLLM, and about 8× with continuous batching alone, without paging.)

    ## 7. The memory problem

    Continuous batching makes memory the limit. Requests come and go every step and grow by one
    token per step, and nobody knows in advance how long an answer will be. The simplest answer,
    used by Orca-era systems, is to **reserve** a contiguous region for `max_model_len` tokens per
    request at admission. Below: 64 chat requests, 32 slots, `max_model_len` = 512 and a KV pool
    of 8 × 512 token slots, with minicb's contiguous KV manager.
    """),
    ("code", """
    pool = dict(max_num_seqs=32, max_model_len=512, block_size=16, num_kv_blocks=8 * 512 // 16)
    reserved = simulate(chat(64, seed=0), kv_cache="contiguous", record_blocks=True, **pool)
    usage = viz.kv_usage(reserved)
    print(f"most requests running at once: {max(len(step.rows) for step in reserved.steps)} of 32 slots")
    print(f"reserved token slots holding a token: {sum(u for u, _ in usage) / sum(r for _, r in usage):.0%}")
    print(f"{reserved.num_steps} steps")
    viz.kv_usage_timeline(reserved)
    """),
    ("md", """
    The pool is full of reservations, yet three quarters of it holds nothing: chat answers are
    short and `max_model_len` is long. Only 8 requests ever run at once, so 24 of the 32 slots
    sit empty and continuous batching has nothing to fill them with. The vLLM paper (SOSP '23)
    measured the same in real systems: only 20.4–38.2 % of KV memory held token states. Handing
    memory out in small blocks as sequences grow fixes it; that is paged attention, chapter 04.

    Note what this does *not* say: continuous batching does not need paging. Orca, which
    introduced iteration-level scheduling, had no paged cache; it reserved each request's maximum
    length up front, as the contiguous manager does above, and the scheduler in this chapter runs
    unchanged on either manager. What paging adds is memory efficiency: a request holds only the
    blocks its tokens fill, so the same pool holds more requests, and the continuous scheduler
    has more requests to keep its slots busy with. The two ideas multiply; neither requires the
    other.

    ## Pause and recall

    1. Name the four things the scheduler does every step, in order.
    <details><summary>Answer</summary>

    Remove the requests that finished (free their slots and KV), admit waiting requests into the
    free slots and token budget (prefill or a prefill chunk), build one packed batch of everyone's
    tokens, run one model step and append each request's new token.
    </details>

    2. In the worked example, at which step do E and F enter, and why not earlier or later?
    <details><summary>Answer</summary>

    At step 5. A and B (4 tokens each) finish at step 4, so their slots are free at the very next
    step; before that all four slots are busy, and waiting longer would only leave slots empty.
    </details>

    3. Why does a continuous batch not need padding, and what does the attention kernel need to
       know instead?
    <details><summary>Answer</summary>

    Its rows are packed back to back, each with only its real tokens, so there is no rectangle to
    fill. The kernel needs each request's segment (`cu_seqlens_q`), each token's position in its
    own sequence (`positions`), how many keys each request has (`seq_lens`) and where its keys
    live (`slot_mapping` / block tables).
    </details>

    4. You raise `max_num_batched_tokens` from 256 to 4096. Which metric improves and which gets
       worse?
    <details><summary>Answer</summary>

    Time to first token improves (a long prompt is prefilled in one step instead of many chunks),
    and throughput rises a little; the inter-token latency of the requests already decoding gets
    worse (ITL p99), because a step that carries a big prefill is slow for everyone in it.
    </details>

    5. Why does reserving `max_model_len` per request limit how many requests can run at once?
    <details><summary>Answer</summary>

    The pool holds pool size / `max_model_len` reservations whatever the answers' real lengths,
    so with short answers most reserved slots stay empty while new requests wait for a
    reservation: in section 7, 8 requests ran while 24 of 32 slots sat idle.
    </details>

    ## Interview questions

    **What is iteration-level scheduling, in one sentence?**
    The scheduler re-forms the batch at every model step (every token), so finished requests
    leave and waiting ones join immediately instead of at batch boundaries.
    *A common wrong answer:* "it schedules one request per iteration."

    **Why is continuous batching better than one large fixed batch for mixed lengths?**
    Because a fixed batch ends with its longest member: finished rows idle and waiting requests
    queue behind the slowest answer. Continuous batching reuses each slot the step it frees, so
    the same number of slots does more useful work and short requests are not stuck behind long
    ones. In the worked example: 10 steps instead of 14 with the same four slots.
    *A common wrong answer:* "GPUs just like bigger batches."

    **In the worked example, why does continuous batching take 10 steps where static takes 14?**
    Both use the same four slots. Static batching runs the first batch until its 10-token
    requests finish, and only then starts the two waiting 4-token requests: 10 + 4. Continuous
    batching hands the slots of the two 4-token requests to the waiting ones at step 5, so those
    finish at step 8, inside the 10 steps the long requests need anyway.
    *A common wrong answer:* "continuous batching runs a bigger batch." (Never more than four rows.)

    **Why does continuous batching make memory allocation harder?**
    Caches of different lengths appear and vanish every step and grow one token at a time with
    unknown final lengths; reserving the maximum per request wastes most of the memory and caps
    concurrency, while allocating exactly leaves holes (fragmentation). Hence paged KV blocks.
    *A common wrong answer:* "scheduling only affects compute."

    **Why should the scheduler's policy match the product?**
    Its knobs trade throughput against TTFT and against stream smoothness; chat, code completion
    and offline jobs weigh those differently, so the best setting for one is wrong for another.
    Pick the objective (and the SLOs) first, then tune.
    *A common wrong answer:* "one scheduler configuration is best for all traffic."

    ## Sketch it from memory

    Close the notebook and draw, on paper: the per-step loop (four boxes and the arrows between
    them); the worked example's continuous schedule as a grid of four slots by ten steps, with A
    to F in their cells; one packed batch of two decodes and a 3-token prefill with its
    `cu_seqlens_q`, `positions` and `seq_lens`; and the curve of TTFT against
    `max_num_batched_tokens`. Then reopen it and check each against sections 1 to 4. Whatever you
    could not draw is what to reread.

    ## Exercise

    `exercises/ch03_scheduler_step.py`: write one step of the continuous scheduler (the token
    budget, eviction when the KV cache is full, first-come-first-served admission). It plugs into
    the real engine and simulator; the grader compares your schedule with minicb's step by step
    and checks that the model still generates what transformers does. Run `make grade CH=03`.

    **Next:** chapter 04 replaces the reservation with paged KV blocks.
    """),
]

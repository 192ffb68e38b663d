"""Chapter 02: static batching (padding, masks, the batch barrier, holes, throughput vs waiting)."""

CELLS = [
    ("md", """
    # 02 · Static batching

    Chapter 01 ended with a measurement: one decode step for sixteen requests costs far less than
    sixteen steps for one. The obvious fix for naive serving is to take several requests, run them as one
    batch, and return when the batch is done. That is **static batching**, what `model.generate`
    does with a padded batch and what early serving systems did. It raises throughput, and it
    introduces two kinds of waste and a barrier.

    **Learning goals.** After this chapter you can

    1. build a padded batch (left padding, attention mask, positions) and count its padding;
    2. explain the batch barrier: why a batch ends with its longest member, and why finished rows
       leave holes that waiting requests cannot use;
    3. measure padding and idle-slot waste on a slot timeline;
    4. measure the throughput gain over naive serving, and the price short requests pay.
    """),
    ("md", """
    **An analogy for non-specialists.** An old-fashioned elevator: it loads a group in the lobby,
    closes the doors, and goes up. People get out at floors 3, 4 and 10, but the car keeps its
    route to the top floor and back before anyone new may get in, however many are waiting in the
    lobby and however empty the car became after floor 4.
    """),
    ("code", """
    %matplotlib inline
    import torch

    from minicb import LLM, SamplingParams, viz
    from minicb.metrics import summarize
    from minicb.sim import simulate
    from minicb.workload import fixed

    torch.manual_seed(0)
    # the default model is tiny: one thread is about as fast as several and keeps timings steady
    torch.set_num_threads(1)
    """),
    ("md", """
    ## 1. Padding and attention masks

    A dense batch is a rectangle: every row must have the same length. Prompts do not, so the
    short ones are **padded**. Static batches pad on the *left*, so that every row's last column
    holds its last real token and the next token of every row comes out of the same column.
    Four prompts of 5, 9, 3 and 7 tokens:
    """),
    ("code", """
    viz.batch_layout([5, 9, 3, 7])
    """),
    ("md", """
    A third of the rectangle is padding, computed like any token and thrown away. The **attention
    mask** keeps the padding from leaking into real tokens: a real token attends only to real
    tokens of its own row, at or before its own position (the coloured triangles below). The grey
    rows and columns are padding: the kernel computes them, nobody uses them.
    """),
    ("code", """
    viz.attention_mask([5, 9, 3, 7])
    """),
    ("md", """
    minicb's static scheduler builds exactly this. Three prompts of 3, 5 and 2 token ids go into
    one batch; the runner packs the rows back to back, each left-padded to five tokens. Each pad
    gets slot −1 (its key and value are never written to the cache) and position 0; each real
    token keeps its own position, so it is rotated by RoPE exactly as if it ran alone.
    """),
    ("code", """
    demo = LLM(scheduler="static", max_num_seqs=3).llm_engine
    for i, ids in enumerate([[101, 102, 103], [201, 202, 203, 204, 205], [301, 302]]):
        demo.add_request(f"r{i}", ids, SamplingParams(max_tokens=4, temperature=0))
    plan = demo.scheduler.schedule()
    input_ids, positions, meta, logits_indices = demo.runner.prepare(plan)
    pad = demo.runner.pad_token_id
    cu = meta.cu_seqlens_q.tolist()
    for row, seq in enumerate(plan.seqs):
        span = slice(cu[row], cu[row + 1])
        tokens = ["pad" if i < seq.num_pad else t for i, t in enumerate(input_ids[span].tolist())]
        print(f"{seq.request.request_id}: tokens {tokens}")
        print(f"    positions {positions[span].tolist()}  KV slots {meta.slot_mapping[span].tolist()}")
    print(f"{plan.num_pad_tokens} pad tokens of {len(input_ids)}; logits taken at rows {logits_indices.tolist()}")
    """),
    ("md", """
    ## 2. The batch barrier and the holey batch

    After the prefill, the batch decodes one token per row per step **until its longest member is
    done**. A row whose answer ended early still occupies its slot (the engine computes a token
    for it and throws it away) and holds its KV memory; a waiting request cannot take it.

    Six requests on four slots: answers of 3, 4, 10 and 10 tokens in the first batch, two 4-token
    requests waiting. Prompts of 5, 8, 3, 6, 4 and 7 tokens. The real static scheduler, in virtual
    time:
    """),
    ("code", """
    holey = fixed("holey batch", [5, 8, 3, 6, 4, 7], [3, 4, 10, 10, 4, 4])
    names = dict(zip("012345", "ABCDEF"))
    static = simulate(holey, scheduler="static", max_num_seqs=4)
    viz.slot_timeline(static, names=names)
    """),
    ("md", """
    The hatched cells are the holes: A and B are finished but keep their rows until step 10; E and
    F wait in the queue although two slots have been doing nothing since steps 4 and 5. Counted from the
    schedule:
    """),
    ("code", """
    slot_steps = static.num_steps * static.config.max_num_seqs
    idle = sum(kind == "idle" for step in static.steps for _, kind, _ in step.rows)
    empty = slot_steps - sum(len(step.rows) for step in static.steps)
    # a step's pad count includes its idle rows (one recomputed token each); the rest is prompt padding
    padding = sum(step.num_pad_tokens for step in static.steps) - idle
    print(f"{static.num_steps} steps x {static.config.max_num_seqs} slots = {slot_steps} slot-steps")
    print(f"idle (finished, still in the batch): {idle}; empty (no request): {empty}")
    print(f"busy: {static.slot_utilisation():.0%}")
    print(f"prompt padding: {padding} pad tokens for {sum(holey.prompt_lens)} prompt tokens")
    print("finish step per request:", {names[k]: v for k, v in static.finish_steps().items()})
    """),
    ("md", """
    ### Build it: a static batch by hand

    Everything above in twenty-five lines, on Hugging Face transformers' implementation of the
    default model (used here as a plain dense model, the way a static server uses one): left-pad
    the prompts into a rectangle, mask the padding, give each real token its own position, and
    decode until the **longest** request is done. A row that has all its tokens keeps computing
    (its output is thrown away): the barrier.
    """),
    ("code", """
    import transformers

    from minicb import default_model_path

    transformers.utils.logging.disable_progress_bar()
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32)
    PAD = 0


    @torch.inference_mode()
    def static_batch(prompts, max_tokens):
        \"\"\"Greedy decoding of one static batch; returns each row's tokens and the steps taken.\"\"\"
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])            # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])   # 0: a pad
        outputs, past, steps = [[] for _ in prompts], None, 0
        while any(len(out) < n for out, n in zip(outputs, max_tokens)):      # the barrier
            positions = (mask.cumsum(-1) - 1).clamp(min=0)                    # real tokens: 0, 1, ...
            new = slice(None) if past is None else slice(-1, None)            # prefill, then decode
            step = hf(input_ids=ids[:, new], attention_mask=mask, position_ids=positions[:, new],
                      past_key_values=past, use_cache=True)
            past, steps = step.past_key_values, steps + 1
            next_ids = step.logits[:, -1].argmax(-1)
            for out, n, token in zip(outputs, max_tokens, next_ids.tolist()):
                if len(out) < n:                                              # else: a ghost row
                    out.append(token)
            ids = torch.cat([ids, next_ids[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        return outputs, steps


    batch_prompts = [[101, 102, 103], [201, 202, 203, 204, 205, 206, 207], [301, 302]]
    batch_lengths = [3, 9, 5]
    ours, our_steps = static_batch(batch_prompts, batch_lengths)
    print(f"{our_steps} steps for answers of {batch_lengths} tokens: the batch lasts as long as its longest")
    """),
    ("md", """
    Your exercise (`exercises/ch02_static_batch.py`) builds the same padding, masks and positions
    for minicb's packed format, and counts what a static batch wastes.

    ### Prove it: the same tokens and steps as minicb's static scheduler

    The same three prompts through minicb's engine with `scheduler="static"`: the tokens of every
    row, and the number of steps the batch took. Then the check with one line of `static_batch`
    changed: padding on the right instead of the left.
    """),
    ("code", """
    def check(batch):
        llm = LLM(scheduler="static", max_num_seqs=3)
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in batch_lengths]
        theirs = [o.outputs[0].token_ids for o in llm.generate(batch_prompts, params, use_tqdm=False)]
        tokens, steps = batch(batch_prompts, batch_lengths)
        print(f"same tokens as minicb: {tokens == theirs}; steps: ours {steps}, "
              f"minicb {llm.llm_engine.scheduler.step_count}")


    check(static_batch)
    """),
    ("code", """
    import inspect

    correct = static_batch
    exec(inspect.getsource(static_batch).replace(
        "ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])",
        "ids = torch.tensor([p + [PAD] * (width - len(p)) for p in prompts])"))
    assert static_batch is not correct, "the line to break was not found"
    check(static_batch)                      # padded on the right: the short rows go wrong
    static_batch = correct
    """),
    ("md", """
    ### Read the real thing

    minicb's static scheduler forms a batch the way `static_batch` does, and adds what a server
    needs: each member reserves KV for its whole possible length up front (so a static batch never
    runs out of memory halfway), the padded prefill must fit the step's token budget, and a
    finished member stays as a ghost row until the batch ends.
    """),
    ("code", """
    from minicb.scheduler.static import StaticScheduler

    viz.show_source(StaticScheduler._form_batch)
    """),
    ("code", """
    viz.show_source(StaticScheduler.schedule)
    """),
    ("md", """
    ## 3. A batch of 6, 50 and 300 tokens

    The waste grows with the spread of lengths, and real answers spread widely (chapter 00's
    section 3). Three requests whose answers need 6, 50 and 300 tokens share a batch; three more
    short requests (6 tokens each) arrive just after it started:
    """),
    ("code", """
    spread = fixed("6/50/300 and three waiting", [8] * 6, [6, 50, 300, 6, 6, 6])
    wide = simulate(spread, scheduler="static", max_num_seqs=3)
    rows = [{"request": names[str(i)], "answer_tokens": m.num_output_tokens, "ttft_steps": m.ttft_steps,
             "finished_at_step": m.finished_step} for i, m in enumerate(wide.metrics)]
    print(viz.format_table(rows))
    print(f"{wide.num_steps} steps, {wide.slot_utilisation():.0%} of slot-steps busy")
    viz.slot_timeline(wide, names=names, title="6, 50 and 300 tokens in one static batch")
    """),
    ("md", """
    A's slot does nothing from step 7 to step 300, B's from step 51. D, E and F need six tokens
    each and get their *first* one at step 301: their time to first token is the length of
    someone else's answer. Now imagine C never ends early (a runaway generation up to the maximum
    length): everyone behind it waits for the maximum.

    ## 4. Measured on the real model: throughput up, short requests stuck

    Twelve requests with answers of 64, 8, 16, 48, 12 and 32 tokens (twice), served by the naive
    engine and by the static engine with six slots. Same prompts, same greedy decoding, so the
    same tokens come out.
    """),
    ("code", """
    lengths = [64, 8, 16, 48, 12, 32] * 2
    six = fixed("twelve requests", [24] * 12, lengths)
    results = {}
    for scheduler in ["naive", "static"]:
        llm = LLM(scheduler=scheduler, max_num_seqs=6)
        prompts = six.prompt_token_ids(llm.llm_engine.vocab_size, seed=0)
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
        results[scheduler] = llm.generate(prompts, params, use_tqdm=False)
    same = [o.outputs[0].token_ids for o in results["naive"]] == [o.outputs[0].token_ids for o in results["static"]]
    print("same tokens from both engines:", same)
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    for scheduler, outs in results.items():
        s = summarize([o.metrics for o in outs])
        print(f"{scheduler:>6}: {s.output_throughput:5.0f} tokens/s, TTFT p50 {s.ttft['p50']:.2f} s, "
              f"E2E p95 {s.e2e['p95']:.2f} s")
    ratio = summarize([o.metrics for o in results["static"]]).output_throughput / \\
        summarize([o.metrics for o in results["naive"]]).output_throughput
    print(f"static / naive throughput: {ratio:.1f}x")
    print("static TTFT per request (s):", [round(o.metrics.ttft, 2) for o in results["static"]])
    """),
    ("md", """
    Throughput goes up, about twofold on this two-core machine (six requests share every step,
    and a step of six rows costs far less than six steps of one), though by much less than six:
    the holes. Look at the TTFTs: the second batch waits for the first batch's 64-token answer,
    even though the 8-, 12- and 16-token requests in it finished early and left their slots idle.
    (On a GPU a step of six rows costs about what a step of one does, so the gain is larger;
    the holes cost the same share.)

    ## 5. The same barrier in `transformers`

    With `transformers` the barrier is even stricter: `generate` on a padded batch returns nothing
    until the last row is done. The static baseline of the benchmarks (`minicb.bench.peers`) runs
    six requests needing 30 to 300 tokens through `model.generate` in batches of three, on the
    same weights, and notes when each row's last token was computed and when the batch came back:
    """),
    ("code", """
    from minicb.bench.offline import load_hf_model
    from minicb.bench.peers import hf_static_batches
    from minicb.model.loader import resolve_model_path

    hf_model = load_hf_model(str(resolve_model_path(None)), "cpu", "float32")   # the default model
    needs = [30, 300, 60, 120, 45, 200]
    hf_prompts = fixed("six requests", [24] * 6, needs).prompt_token_ids(hf_model.config.vocab_size, seed=0)
    run = hf_static_batches(hf_model, hf_prompts, needs, pad_token_id=0, batch_size=3)
    useful, computed = sum(needs), run.settings["decode_rows_computed"]
    print(f"tokens wanted {useful}, rows computed {computed}: {1 - useful / computed:.0%} of the rows are holes")
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    for n, m in zip(needs, run.metrics):
        print(f"needs {n:>3} tokens: its last token at {m.token_times[-1] - m.arrival_time:5.2f} s, "
              f"handed back at {m.finished_time - m.arrival_time:5.2f} s")
    """),
    ("md", """
    Each batch hands back all three answers together, when its longest row is done: the 30-token
    answer waits for the 300-token one, and the second batch cannot start until then. (Left
    padding and the attention mask are what let rows of different prompt lengths share one
    `generate` call.)

    Static batching trades one problem for another: naive serving wasted the device, static
    batching wastes the *slots* (holes) and makes short requests pay for long ones. Waiting to
    collect a fuller batch before starting would raise throughput further and make TTFT worse
    still. Chapter 03 removes the barrier.

    ## Pause and recall

    1. Why pad on the left rather than the right for generation?
    <details><summary>Answer</summary>

    So that every row's last real token sits in the same, last column: the next token is
    predicted there and appended after it for every row at once. With right padding the rows'
    last tokens sit in different columns and new tokens would land after padding.
    </details>
    2. A static batch is full at launch. Why does it still leave empty capacity?
    <details><summary>Answer</summary>

    Its members finish at different steps, but their slots stay in the batch (computed and
    discarded) until the longest one ends, and no waiting request can take them.
    </details>
    3. For answers of 6, 50 and 300 tokens in one batch of three, what fraction of slot-steps does
       useful work?
    <details><summary>Answer</summary>

    The batch runs 300 steps on 3 slots, 900 slot-steps, of which 6 + 50 + 300 = 356 produce a
    kept token: about 40%.
    </details>
    4. If the server waited to collect eight requests before starting a batch instead of four,
       which metric gets better and which gets worse?
    <details><summary>Answer</summary>

    Throughput can rise (bigger batches, weights read once for more rows), but time to first
    token gets worse: the early arrivals wait for the batch to fill, and a bigger batch ends
    later, so the queue behind it waits longer too.
    </details>

    ## Interview questions

    **Why do static batches leave empty capacity even when they are full at launch?**
    Rows finish at different times but the batch ends with its longest member; a finished row
    keeps its slot (and its KV reservation) until then, and new requests can only join at the
    next batch. The holes grow with the spread of output lengths.
    *A common wrong answer:* "only if the batch was not full when it started."

    **Why not just pick a bigger static batch?**
    More rows mean more padding and a longer expected longest member, so more holes, and every
    waiting request's TTFT becomes the length of the slowest answer in the running batch. Memory
    also caps it: every row reserves KV for its maximum length.
    *A common wrong answer:* "GPUs like bigger batches, so bigger is always better."

    **What does the attention mask do in a padded batch?**
    It stops real tokens from attending to pads (and to other rows, and to the future); the
    position ids must skip the pads too, or RoPE would shift every padded row.
    *A common wrong answer:* "the mask removes the padding's cost": the pads are still computed.

    ## Exercise

    `exercises/ch02_static_batch.py`: left-pad a batch and build its mask, compute the positions
    a padded row needs, and count a static schedule's steps, pad tokens and idle slot-steps (the
    numbers of section 2, from first principles). Run `make grade CH=02`.

    **Next:** chapter 03 lets requests leave and join at every step: continuous batching.
    """),
]

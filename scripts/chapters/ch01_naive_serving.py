"""Chapter 01: naive serving, one request at a time (KV cache, prefill/decode, the queue)."""

CELLS = [
    ("md", """
    # 01 · Naive serving: one request at a time

    The simplest server takes the next request, runs it from its first prompt token to its last
    output token, and only then looks at the queue. It is correct, easy to reason about, and it
    is how a first prototype (or a `model.generate` call in a loop) serves traffic. This chapter
    builds it from the real engine and measures what it costs.

    **Learning goals.** After this chapter you can

    1. say what the KV cache stores, compute its size per token from a model's config, and explain
       what it saves;
    2. follow one request through prefill and decode, step by step, in the engine;
    3. predict the TTFT of the *k*-th request in a queue served one at a time;
    4. measure how much of the machine a batch of one leaves unused.
    """),
    ("md", """
    **An analogy for non-specialists.** A kitchen with four burners where the cook insists on
    finishing one order completely, starter to dessert, before reading the next ticket. Three
    burners stay cold, and the guest with ticket number eight waits for seven full meals before
    the first bite, however small their own order is.
    """),
    ("code", """
    %matplotlib inline
    import torch

    from minicb import LLM, SamplingParams, viz
    from minicb.metrics import summarize
    from minicb.sim import simulate
    from minicb.workload import fixed, seed_example

    torch.manual_seed(0)
    # the default model is tiny: one thread is about as fast as several and keeps timings steady
    torch.set_num_threads(1)
    """),
    ("md", """
    ## 1. The model and its KV cache

    In a transformer, every token at every layer produces a key and a value vector; a later
    token's attention reads all earlier keys and values. Recomputing them at every step would make
    step *t* cost *t* tokens of work. The **KV cache** keeps them instead: each token's keys and
    values are computed once and read at every later step. The price is memory:

    bytes per token = 2 (K and V) × layers × KV heads × head dim × bytes per number.
    """),
    ("code", """
    llm = LLM(scheduler="naive")        # the shipped default model, served one request at a time
    engine = llm.llm_engine
    args = engine.model.args
    bytes_per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * 4      # float32
    print(f"{args.num_layers} layers x {args.num_kv_heads} KV heads x head dim {args.head_dim}: "
          f"{bytes_per_token} bytes = {bytes_per_token / 1024:g} KiB per token")
    context = engine.config.max_model_len
    print(f"a full {context}-token context: {bytes_per_token * context / 2**20:g} MiB")
    print(f"the engine's KV pool: {engine.config.num_kv_blocks} blocks of {engine.config.block_size} tokens = "
          f"{engine.runner.kv_cache_bytes() / 2**20:g} MiB")
    """),
    ("md", """
    Tiny, because the model is tiny. The same formula for Llama-3-8B (32 layers, 8 KV heads, head
    dimension 128, bf16) gives 2 × 32 × 8 × 128 × 2 = 128 KiB per token, so one 8 192-token
    conversation holds 1 GiB of cache. On a GPU the cache, not the weights, decides how many
    requests fit at once; that is the thread chapter 04 picks up.

    **The idea in ten lines.** Before switching to the engine, a single attention head by hand:
    attending with cached keys and values gives exactly what recomputing everything gives, for a
    fraction of the work.
    """),
    ("code", """
    torch.manual_seed(0)
    d, steps = 16, 6
    x = torch.randn(steps, d)                       # six token vectors, arriving one at a time
    wq, wk, wv = (torch.randn(d, d) / d**0.5 for _ in range(3))

    def attend(q, k, v):                            # one query row against the keys so far
        return torch.softmax(q @ k.T / d**0.5, dim=-1) @ v

    recomputed = attend(x[-1:] @ wq, x @ wk, x @ wv)          # recompute K, V for all six tokens
    k_cache, v_cache = [], []
    for t in range(steps):                                    # incremental: one new K, V per step
        k_cache.append(x[t:t + 1] @ wk)
        v_cache.append(x[t:t + 1] @ wv)
        cached = attend(x[t:t + 1] @ wq, torch.cat(k_cache), torch.cat(v_cache))
    print("same output:", torch.allclose(recomputed, cached, atol=1e-6))
    print("K/V projections computed: recompute every step", sum(range(1, steps + 1)), "vs cached", steps)
    """),
    ("md", """
    ### Build it: prefill and decode with a KV cache, on the real model's weights

    The same idea, now for the whole model: minicb's default model is loaded, and this cell runs
    its layers by hand (embedding, then per layer RMSNorm, attention with rotary positions, the
    gated MLP; a last norm and the head), keeping each layer's keys and values in a plain tensor
    per layer. The prefill pushes the whole prompt through once and fills the cache; every decode
    step pushes one token and appends one row per layer.
    """),
    ("code", """
    import torch.nn.functional as F

    model = engine.model                     # its weights; the forward below is ours
    layers, cfg = model.model.layers, model.args


    def rms(x, norm):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight


    def rotate(x, positions):                # rotary position embedding, Hugging Face style
        inv_freq = model.model.rotary_emb.inv_freq
        angles = positions[:, None].float() * inv_freq[None, :]
        cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


    @torch.inference_mode()
    def forward(token_ids, cache):
        \"\"\"Run `token_ids` (the next tokens of one sequence) and return the last one's logits.\"\"\"
        start = cache[0][0].shape[0] if cache else 0
        positions = torch.arange(start, start + len(token_ids))
        x = model.model.embed_tokens(torch.tensor(token_ids))
        for index, layer in enumerate(layers):
            attn, h = layer.self_attn, rms(x, layer.input_layernorm)
            q = rotate(attn.q_proj(h).view(len(token_ids), cfg.num_heads, cfg.head_dim), positions)
            k = rotate(attn.k_proj(h).view(len(token_ids), cfg.num_kv_heads, cfg.head_dim), positions)
            v = attn.v_proj(h).view(len(token_ids), cfg.num_kv_heads, cfg.head_dim)
            if len(cache) <= index:
                cache.append((k, v))                                  # prefill: the cache starts
            else:
                cache[index] = (torch.cat([cache[index][0], k]), torch.cat([cache[index][1], v]))
            keys, values = cache[index]
            group = cfg.num_heads // cfg.num_kv_heads                 # grouped-query attention
            keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
            visible = torch.arange(len(keys))[None, :] <= positions[:, None]      # causal
            out = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1),
                                                 values.transpose(0, 1), attn_mask=visible)
            x = x + attn.o_proj(out.transpose(0, 1).reshape(len(token_ids), -1))
            mlp, h = layer.mlp, rms(x, layer.post_attention_layernorm)
            x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        return model.lm_head(rms(x, model.model.norm))[-1]


    def greedy(prompt_ids, max_tokens):
        cache = []                                                    # one (K, V) pair per layer
        token = int(forward(prompt_ids, cache).argmax())              # prefill: the first token
        output = [token]
        while len(output) < max_tokens and token not in engine.eos_token_ids:
            token = int(forward([token], cache).argmax())             # decode: one token per step
            output.append(token)
        return output


    prompt_ids = engine.tokenizer.encode("def fibonacci(n):", add_special_tokens=False)
    ours = greedy(prompt_ids, 24)
    print(repr(engine.tokenizer.decode(ours)))
    """),
    ("md", """
    About forty lines, and the model writes Python. Your exercise (`exercises/ch01_kv_loop.py`)
    grows this toward minicb's: the cache in blocks, and the packed tensors the runner builds.

    ### Prove it: the same tokens as minicb and as Hugging Face transformers

    Three prompts, greedy, through our loop, through minicb's engine and through transformers'
    `generate` on the same checkpoint. Then the same check with one line of our loop broken: the
    keys stored without their rotary positions.
    """),
    ("code", """
    import transformers

    transformers.utils.logging.disable_progress_bar()       # no loading bar in the page
    hf = transformers.AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=torch.float32)
    texts = ["def fibonacci(n):", "def read_lines(path):", "class Stack:"]
    prompts = [engine.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    params = SamplingParams(max_tokens=24, temperature=0)


    def check(loop):
        minicb_out = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        for text, ids, theirs in zip(texts, prompts, minicb_out):
            with torch.inference_mode():
                hf_ids = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):]
            hf_ids = hf_ids.tolist()[:len(theirs)]
            print(f"{text!r:28} ours == minicb: {loop(ids, 24) == theirs}   minicb == transformers: "
                  f"{theirs == hf_ids}")


    check(greedy)
    """),
    ("code", """
    import inspect

    correct_forward = forward
    exec(inspect.getsource(forward).replace(
        "k = rotate(attn.k_proj(h).view(len(token_ids), cfg.num_kv_heads, cfg.head_dim), positions)",
        "k = attn.k_proj(h).view(len(token_ids), cfg.num_kv_heads, cfg.head_dim)"))
    assert forward is not correct_forward, "the line to break was not found"
    check(greedy)                            # keys without positions: the check fails
    forward = correct_forward
    """),
    ("md", """
    ### Read the real thing

    minicb's attention layer, from the installed package. It works on a packed batch of many
    requests at once, writes each token's K/V into a **slot** of the shared paged pool (chapter 04)
    instead of a growing tensor per request, and leaves the attention itself to a backend
    (chapter 05):
    """),
    ("code", """
    from minicb.model.llama import SelfAttention

    viz.show_source(SelfAttention.forward)
    """),
    ("md", """
    What production adds to our loop, and why: **batching** (one forward pass serves every
    running request, chapter 02 and 03), a **preallocated cache** (a growing `torch.cat` copies the
    whole cache every step; the engine writes into a pool sized once), **RoPE computed once per
    step** for every layer, and the sampling and stop checks that end a request. On a CPU, a
    step of only a few decodes runs the same arithmetic, layer by layer, as one call into C
    (`kernels/cpu_decode_layer.c`), because a hundred small torch operations cost more than the
    work they do; chapter 07 measures why.
    """),
    ("md", """
    ## 2. Prefill, then decode: one request in the engine

    Now the real engine (`minicb.LLMEngine`), driven one step at a time. The first step is the
    **prefill**: all prompt tokens in one forward pass, which also yields the first output token.
    Every later step is a **decode**: it computes exactly one token, the newest, whose keys and
    values join the cache.
    """),
    ("code", """
    prompt = "def fibonacci(n):"
    (request,) = engine.add_request("demo", prompt, SamplingParams(max_tokens=24, temperature=0))
    rows = []
    while engine.has_unfinished_requests():
        before = request.num_computed_tokens
        (output,) = engine.step()
        rows.append({"step": engine.scheduler.step_count, "phase": "prefill" if before == 0 else "decode",
                     "tokens_computed": request.num_computed_tokens - before,
                     "tokens_in_cache": request.num_computed_tokens,
                     "new_token": repr(engine.tokenizer.decode(output.new_token_ids))})
    print(viz.format_table(rows))
    print(prompt + output.outputs[0].text)
    print("finish reason:", output.outputs[0].finish_reason)
    """),
    ("md", """
    The prompt's tokens go in together in the request's first step (the `step` column is the
    engine's own counter, which also counted the cells above); from then on each step computes
    one token. The request ended by itself (finish reason `stop`): the model emitted its
    end-of-text token (the last row), which ends the request and is left out of the text. Time
    the two phases for one longer prompt: TTFT is mostly the prefill, TPOT is one decode step.
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    vocab = engine.vocab_size
    prompt_ids = fixed("one prompt", [128], [32]).prompt_token_ids(vocab, seed=0)[0]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    llm.generate([prompt_ids], params, use_tqdm=False)                    # warm-up
    m = llm.generate([prompt_ids], params, use_tqdm=False)[0].metrics
    print(f"prefill of 128 tokens (TTFT): {m.ttft * 1e3:.1f} ms")
    print(f"one decode step (TPOT):       {m.tpot * 1e3:.1f} ms")
    per_prompt_token = m.ttft / 128
    print(f"prefill cost per prompt token: {per_prompt_token * 1e3:.2f} ms, "
          f"{m.tpot / per_prompt_token:.0f}x cheaper than a decode token")
    """),
    ("md", """
    ## 3. A queue of requests

    Serving one at a time, request *k* starts only when requests 0 … *k*−1 have finished. The
    book's six requests (answers of 4, 4, 10, 10, 4 and 4 tokens) in virtual time, with the picture
    drawn on four slots to show what the naive server leaves unused:
    """),
    ("code", """
    naive = simulate(seed_example(), scheduler="naive", max_num_seqs=4)
    names = dict(zip("012345", "ABCDEF"))
    rows = [{"request": names[str(i)], "answer_tokens": m.num_output_tokens, "waited_steps": m.queue_steps,
             "ttft_steps": m.ttft_steps, "e2e_steps": m.e2e_steps} for i, m in enumerate(naive.metrics)]
    print(viz.format_table(rows))
    print(f"{naive.num_steps} steps in all; {naive.slot_utilisation():.0%} of slot-steps busy")
    """),
    ("code", """
    viz.slot_timeline(naive, names=names, title="naive: one request at a time on a device with room for four")
    """),
    ("md", """
    Each request's TTFT is the sum of everything served before it, plus its own prefill: F, a
    4-token answer, waits 32 steps before its prefill even starts. The same on the real model:
    six requests of 16 output tokens each, arriving together.
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    queue = fixed("six equal requests", [32] * 6, [16] * 6)
    prompts = queue.prompt_token_ids(vocab, seed=1)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    ttfts = [o.metrics.ttft for o in outs]
    print("TTFT per position in the queue (ms):", [round(t * 1e3) for t in ttfts])
    viz.bar_chart([f"#{i}" for i in range(6)], [t * 1e3 for t in ttfts], ylabel="TTFT (ms)",
                  xlabel="position in the queue", title="naive serving: TTFT grows with the queue")
    """),
    ("md", """
    The bars climb in even steps: each request's first token waits for every full answer in
    front of it. Under steady traffic the queue never drains, so the wait grows for as long as
    requests arrive faster than one-at-a-time can finish them.

    ## 4. The underfilled device at batch size 1

    How much of the machine does one request use? Run *B* requests side by side
    (`scheduler="static"`, chapter 02's engine, with every request the same length, so nothing
    is wasted) and time one decode step as *B* grows.
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    batch_sizes = [1, 2, 4, 8, 16]
    step_ms, tokens_per_s = [], []
    for b in batch_sizes:
        batch_llm = LLM(scheduler="static", max_num_seqs=b)
        batch = fixed("equal", [32] * b, [16] * b).prompt_token_ids(vocab, seed=2)
        out = batch_llm.generate(batch, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
                                 use_tqdm=False)
        tpot = summarize([o.metrics for o in out]).tpot["p50"]
        step_ms.append(tpot * 1e3)
        tokens_per_s.append(b / tpot)
    print("decode step (ms):", [round(t, 1) for t in step_ms])
    print("decode tokens/s: ", [round(t) for t in tokens_per_s])
    print(f"batch 16 vs batch 1: {tokens_per_s[-1] / tokens_per_s[0]:.1f}x the tokens/s for "
          f"{step_ms[-1] / step_ms[0]:.1f}x the time per step")
    viz.line_plot(batch_sizes, {"decode tokens/s": tokens_per_s}, xlabel="requests decoded together (B)",
                  ylabel="output tokens / s", logx=True, title="B requests decoded in one step")
    """),
    ("md", """
    One decode step for sixteen requests costs far less than sixteen steps for one (compare the
    step times: nowhere near 16×), so the naive server throws most of the machine away. On a GPU
    the effect is larger still: a batch-1 decode reads every weight to do one token's arithmetic
    (chapter 00's roofline). Batching is the cure, and the next chapter tries the most obvious
    form of it.

    ## Pause and recall

    1. What does the KV cache store, for which tokens, and what does it cost? Compute its size
       per token for a model with 16 layers, 4 KV heads, head dimension 64, in bf16.
    <details><summary>Answer</summary>

    Each layer's keys and values of every token already processed (prompt and generated), so
    a decode step computes only the new token's. Per token: 2 (K and V) × 16 layers × 4 heads ×
    64 × 2 bytes = 16,384 bytes = 16 KiB; it costs memory that grows with every token of every
    running request.
    </details>
    2. Why does the prefill produce the first output token without a decode step?
    <details><summary>Answer</summary>

    The prefill runs the whole prompt through the model, and the logits at the prompt's last
    position are the prediction of the next token: sampling them gives the first output token.
    Decode steps are needed only for the tokens after it.
    </details>
    3. Requests of 10, 2 and 2 tokens are queued in that order on a naive server. What are their
       TTFTs in steps? What if the order were 2, 2, 10?
    <details><summary>Answer</summary>

    A request's first token comes at the first step it runs, after everything ahead of it has
    finished: in the order 10, 2, 2 that is steps 1, 11 and 13; in the order 2, 2, 10, steps 1, 3
    and 5. Same total, but the short requests no longer wait behind the long one.
    </details>
    4. Why does one decode step for 16 requests cost far less than 16 steps for one request?
    <details><summary>Answer</summary>

    A decode step is dominated by reading the weights; one step reads them once for all 16
    requests, while 16 steps read them 16 times. The extra arithmetic for 15 more rows is small
    next to that read on a GPU. On this CPU the rows' arithmetic counts for more, but a step
    of 16 rows still costs a few times a step of one, not 16 times (section 4).
    </details>

    ## Interview questions

    **What does the KV cache save, and what does it cost?**
    It saves recomputing every earlier token's keys and values at every step: each step projects
    one new token instead of all of them (attention itself still reads every earlier key, so its
    total work over a sequence stays quadratic); it costs memory that grows with every token of every running request, and
    that memory, not compute, ends up limiting how many requests a GPU serves at once.
    *A common wrong answer:* "the KV cache saves memory."

    **Why not serve one request at a time on a fast GPU?**
    Because decode at batch size 1 is memory-bound: the GPU streams all weights to produce one
    token, leaving nearly all its arithmetic idle, and everyone behind the current request waits
    for its entire answer (TTFT grows with the queue).
    *A common wrong answer:* "a fast enough GPU makes batching unnecessary."

    **Where does TTFT come from in a naive server?**
    Queueing (every full answer ahead of you) plus your own prefill; under load the queueing term
    dominates and grows without bound.
    *A common wrong answer:* "TTFT is the prefill time."

    ## Exercise

    `exercises/ch01_kv_loop.py`: allocate a KV cache for the real model, pack one step of one
    request into the engine's batch format, and write the greedy prefill-then-decode loop; the
    grader checks your tokens against transformers' `generate`. Run `make grade CH=01`.

    **Next:** chapter 02 batches requests together, and meets padding and the batch barrier.
    """),
]

"""Chapter 04: the paged KV cache (blocks, block tables, the free list, fragmentation, preemption, sharing)."""

CELLS = [
    ("md", """
    # 04 · The paged KV cache

    Chapter 03 ended on a full KV pool that was three quarters empty: every request had reserved
    room for `max_model_len` tokens, and chat answers are short. **Paged KV** (vLLM's
    PagedAttention, SOSP '23) hands memory out the way an operating system hands out pages: in
    small fixed-size **blocks**, one at a time, as a sequence grows. A per-request **block table**
    maps the sequence's logical blocks to physical blocks anywhere in the pool, and a finished
    request's blocks return to a **free list** that the next request draws from at the very next
    step. This chapter builds the idea up from the allocator, watches the block map change step
    by step, measures the memory it saves, and meets the two new things paging brings: running
    out of blocks mid-answer (preemption) and blocks shared by several requests.

    **Learning goals.** After this chapter you can

    1. find where a token's K/V lives from its position, the block size and the block table;
    2. explain why a free list that is a stack hands a finished request's blocks to the next one;
    3. name the two kinds of fragmentation of a contiguous layout and measure what paging saves;
    4. explain preemption by recomputation, and when it leaves every answer unchanged;
    5. say what a block's reference count is for (prefix caching, parallel samples, copy-on-write).
    """),
    ("md", """
    **An analogy for non-specialists.** A cloakroom with numbered hooks. The contiguous way gives
    every guest a whole row of ten adjacent hooks on arrival, in case they brought ten coats; most
    bring one, and a new guest is turned away when no ten adjacent hooks are free, even though
    half the hooks are empty. The paged way hands out one hook per coat, any free hook, and writes
    the hook numbers on the guest's ticket (the block table). When a guest leaves, their hooks go
    straight to the next guest in line.
    """),
    ("code", """
    %matplotlib inline
    import torch

    from minicb import LLM, SamplingParams, viz
    from minicb.bench.memory import occupancy
    from minicb.kv import BlockAllocator, PagedKVManager
    from minicb.request import Request
    from minicb.sim import simulate
    from minicb.viz import block_map, block_reuse, free_blocks_timeline
    from minicb.workload import chat, fixed, seed_example

    torch.manual_seed(0)
    # the default model is tiny: one thread is about as fast as several and keeps timings steady
    torch.set_num_threads(1)
    """),
    ("md", """
    ## 1. Build it: blocks, block tables and the free list

    The KV pool is one tensor pair per layer, `[num_blocks, block_size, num_kv_heads, head_dim]`
    (chapter 03's packed-batch contract). Who may write which block is plain bookkeeping: a
    **free list** of block ids and a **reference count** per block (a block several requests
    share has several holders). The free list is a **stack**: the block returned last is handed
    out first, so a finished request's blocks go straight to the next request that needs any.

    A request's **block table** lists its blocks in logical order, and grows one block at a time,
    only when the last one is full. Position *p* lives in block `table[p // block_size]` at offset
    `p % block_size`, that is in slot `table[p // block_size] * block_size + p % block_size`: the
    slot number the KV-write kernel of chapter 05 receives in `slot_mapping`.
    """),
    ("code", """
    class Pool:
        \"\"\"A free list (a stack) and a reference count per block.\"\"\"

        def __init__(self, num_blocks):
            self.free_blocks = list(range(num_blocks))[::-1]     # pop() hands out 0, 1, 2, ...
            self.ref_counts = [0] * num_blocks

        def num_free(self):
            return len(self.free_blocks)

        def allocate(self):
            block = self.free_blocks.pop()
            self.ref_counts[block] = 1
            return block

        def share(self, block):                     # one more holder (chapter 07, n > 1)
            self.ref_counts[block] += 1

        def release(self, block):                   # one holder fewer; True when it is free
            self.ref_counts[block] -= 1
            return self.ref_counts[block] == 0

        def push_free(self, block):
            self.free_blocks.append(block)


    class Tables:
        \"\"\"A block table per request, grown on demand and freed at the end.\"\"\"

        def __init__(self, pool, block_size):
            self.pool, self.block_size, self.tables = pool, block_size, {}

        def grow(self, name, num_tokens):           # room for num_tokens tokens in total
            table = self.tables.setdefault(name, [])
            while len(table) * self.block_size < num_tokens:
                table.append(self.pool.allocate())
            return table

        def free(self, name):                       # last block first: reused in the same order
            for block in reversed(self.tables.pop(name, [])):
                if self.pool.release(block):
                    self.pool.push_free(block)


    ours = Tables(Pool(8), block_size=4)
    for name, tokens in [("first", 6), ("second", 3), ("first", 7), ("first", 9), ("second", 5)]:
        print(f"{name:>6} holds {tokens} tokens: table {ours.grow(name, tokens)}")
    table = ours.tables["first"]
    for position in [0, 5, 8]:
        block, offset = table[position // 4], position % 4
        print(f"position {position} of 'first': block {block}, offset {offset}, slot {block * 4 + offset}")
    ours.free("first")
    print("after 'first' finishes, a newcomer gets", ours.grow("third", 9))
    """),
    ("md", """
    The two requests' blocks interleave in the pool (`first` holds 0, 1, 3; `second` 2, 4), and
    nobody minds: the table makes each request's scattered blocks read as one sequence. When
    `first` finishes, its blocks go to the next request in its own order. Your exercise
    (`exercises/ch04_block_allocator.py`) grows this toward minicb's: sharing, copy-on-write,
    preemption.

    ## Prove it: the same tables as minicb's, and the same tokens inside the engine

    Two checks. First, a random sequence of grows and frees through our `Tables` and through
    minicb's `PagedKVManager` (`minicb/kv/paged.py`): the block tables must agree after every
    operation. Second, our `Pool` is plugged into the real engine in place of minicb's allocator,
    with a pool so small that requests are preempted, and the generated tokens must equal those of
    the engine with its own allocator.
    """),
    ("code", """
    import random


    def tables_agree(make_pool, operations=300, seed=0):
        rng = random.Random(seed)
        ours, theirs = Tables(make_pool(64), block_size=4), PagedKVManager(num_blocks=64, block_size=4)
        requests, lengths = {}, {}
        for step in range(operations):
            name = f"r{rng.randrange(8)}"
            if name in lengths and rng.random() < 0.2:           # finish
                ours.free(name)
                theirs.free(requests.pop(name))
                del lengths[name]
                continue
            lengths[name] = lengths.get(name, 0) + rng.randint(1, 6)
            if sum(-(-n // 4) for n in lengths.values()) > 64:    # the pool is full: skip it
                lengths[name] -= 1
                continue
            request = requests.setdefault(name, Request(name, [1], SamplingParams(max_tokens=8)))
            theirs.allocate(request, lengths[name])
            if ours.grow(name, lengths[name]) != theirs.block_table(request):
                return f"operation {step}: {name} got {ours.tables[name]}, minicb {theirs.block_table(request)}"
        return "the same tables after every operation"


    print("our Pool:", tables_agree(Pool))
    """),
    ("code", """
    def generate(pool_class=None):
        llm = LLM(max_num_seqs=8, block_size=4, num_kv_blocks=48, max_model_len=256)
        if pool_class is not None:
            llm.llm_engine.kv.allocator = pool_class(48)        # ours in place of minicb's
        prompts = chat(12, seed=3).prompt_token_ids(llm.llm_engine.vocab_size, seed=3)
        outputs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                               use_tqdm=False)
        kv = llm.llm_engine.kv
        return ([o.outputs[0].token_ids for o in outputs], llm.llm_engine.scheduler.num_preemptions,
                kv.num_free_blocks() == kv.num_blocks)


    reference, preempted, _ = generate()
    tokens, preempted_ours, all_free = generate(Pool)
    print(f"preemptions {preempted} (minicb's allocator) and {preempted_ours} (ours); "
          f"same tokens: {tokens == reference}; every block free at the end: {all_free}")
    """),
    ("md", """
    A check that cannot fail proves nothing: the same table comparison with one line of `Pool`
    changed, a freed block put at the bottom of the stack instead of the top (a queue, not a
    stack). Every token would still be right, but the blocks are not the ones minicb hands out:
    """),
    ("code", """
    class QueuePool(Pool):
        def push_free(self, block):
            self.free_blocks.insert(0, block)                   # the one line changed


    print("a queue instead of a stack:", tables_agree(QueuePool))
    """),
    ("md", """
    ## Read the real thing

    minicb's allocator and paged manager, from the installed package:
    """),
    ("code", """
    viz.show_source(BlockAllocator)
    """),
    ("code", """
    viz.show_source(PagedKVManager.allocate)
    """),
    ("md", """
    What production adds to our `Tables`, and why:

    * **Copy-on-write.** Samples of one prompt (n > 1) share its blocks; a sample that is about to
      write into a shared, partly filled block first gets a copy of it (`_shared_block_to_copy`,
      and the runner copies it before the forward pass), so the others' K/V never changes.
    * **The prefix cache** (chapter 07): a freed block whose tokens may be asked for again is
      parked rather than freed, and handed out only when the free list runs dry (`_new_block`).
    * **Checks before allocating.** The scheduler asks `can_allocate` first, with a watermark of
      blocks kept back; when nothing is free it preempts a request instead of failing.
    """),
    ("code", """
    viz.show_source(PagedKVManager.free)
    """),
    ("md", """
    ## 2. The block map, step by step

    Now the real scheduler and KV manager on the book's worked example (four slots; requests of
    4, 4, 10 and 10 tokens, two more 4-token ones waiting; 4-token prompts), driven by the
    cost-model runner with `record_blocks=True`. Blocks of 2 tokens keep the picture small. Each
    row is a physical block, each column an engine step, the colour the request holding it:
    """),
    ("code", """
    names = dict(zip("012345", "ABCDEF"))
    worked = simulate(seed_example(), max_num_seqs=4, block_size=2, num_kv_blocks=24, record_blocks=True)
    finish = {names[r]: step for r, step in worked.finish_steps().items()}
    print("finish steps:", finish)
    for step, block, previous, new in block_reuse(worked):
        print(f"step {step}: block {block:>2} passes from {names[previous]} to {names[new]}")
    block_map(worked, names=names)
    """),
    ("md", """
    A and B finish at step 4 and return their blocks: A's first, then B's, so B's sit on top of
    the stack. At step 5, E and F prefill their 4-token prompts into B's four blocks, and at step
    6 the requests that grow past a block boundary (C, D, E and F) take A's. Nothing is copied or
    compacted: the pool stays a patchwork, and every request still reads its own tokens in order
    through its table. Each request grows a block only when the last one is full (every other
    step, with blocks of 2), so it never holds more than one partly empty block.

    ## 3. Fragmentation, measured: the same memory, contiguous or paged

    Chapter 03's experiment again: 64 chat requests, 32 slots, `max_model_len` = 512 and a pool
    of 256 blocks of 16 tokens (room for 8 reservations of 512). This time both KV managers serve
    it, with the same scheduler; `minicb.bench.memory.occupancy` counts, after every step, the
    slots that live requests hold and the ones holding a token.
    """),
    ("code", """
    pool = dict(max_num_seqs=32, max_model_len=512, block_size=16, num_kv_blocks=8 * 512 // 16)
    runs = {kv_cache: simulate(chat(64, seed=0), kv_cache=kv_cache, record_blocks=True, **pool)
            for kv_cache in ["contiguous", "paged"]}
    rows = []
    for kv_cache, result in runs.items():
        o = occupancy(result, kv_cache)
        rows.append({"kv_cache": kv_cache, "running (mean)": o["mean_running"], "running (max)": o["max_running"],
                     "reserved but empty": f"{o['waste_fraction']:.1%}", "steps": o["steps"],
                     "tokens per time unit": o["output_tokens_per_time_unit"]})
    print(viz.format_table(rows))
    contiguous, paged = rows
    print(f"paged: {paged['running (mean)'] / contiguous['running (mean)']:.2f}x the requests running on average, "
          f"{paged['tokens per time unit'] / contiguous['tokens per time unit']:.2f}x the throughput, "
          f"{1 - paged['steps'] / contiguous['steps']:.0%} fewer steps, same memory")
    viz.kv_usage_timeline(runs["paged"])
    """),
    ("md", """
    Same pool, same requests: the contiguous layout never runs more than the 8 requests whose
    reservations fit, and most of what it reserves stays empty; paging fills all 32 slots when
    the queue is long, wastes only the unfilled tail of each request's last block, and finishes
    the same workload in far fewer steps. A contiguous layout wastes memory two ways:

    * **internal fragmentation**: the reserved but unused tail of each reservation (here almost
      all of the waste: a chat answer rarely needs its 512 slots);
    * **external fragmentation**: free blocks scattered between reservations, each gap too short
      for a new run of 32 consecutive blocks (minicb's contiguous manager must find such a run).

    Paging removes external fragmentation entirely (any free block will do) and bounds internal
    fragmentation by one partly filled block per request. The vLLM paper measured the same on
    real systems: only 20.4–38.2 % of KV memory held token states in earlier systems, under 4 %
    was wasted with paging, and serving throughput rose 2–4× over FasterTransformer and Orca at
    the same latency.

    **The block size** trades the waste in that last block against bookkeeping: more blocks mean
    longer block tables and, on a GPU, smaller scattered reads for the attention kernel. The same
    paged run, pool fixed at 4096 token slots, block size varied:
    """),
    ("code", """
    sweep = []
    for block_size in [1, 4, 16, 64, 256]:
        knobs = dict(pool, block_size=block_size, num_kv_blocks=4096 // block_size)
        o = occupancy(simulate(chat(64, seed=0), kv_cache="paged", **knobs), "paged")
        sweep.append({"block_size": block_size, "table entries at 512 tokens": 512 // block_size,
                      "reserved but empty": f"{o['waste_fraction']:.1%}", "running (max)": o["max_running"],
                      "preemptions": o["preemptions"], "steps": o["steps"]})
    print(viz.format_table(sweep))
    """),
    ("md", """
    Up to 16 tokens per block the waste stays small and nothing else changes; at 64 the empty
    tails fill the pool early and requests get preempted (section 4); at 256 a block is half a
    reservation: half the pool sits in empty tails, at most 16 requests run and the workload takes
    more steps (though still fewer than the contiguous layout's, which ran 8). vLLM's default
    block size is 16.

    ## 4. When the blocks run out: preemption by recomputation

    Paging admits a request with only the blocks its first step needs, and lets it grow. That is
    what packs so many requests in, but it is a bet: if they all grow, the pool runs dry in the
    middle of their answers. Then minicb's continuous scheduler **preempts**: it picks a victim
    among the running requests (the latest arrival: a heuristic, since it has usually computed the
    least, though a late request with a long prompt may have more to lose), frees all
    its blocks and puts it back at the head of the waiting queue. When it is readmitted it
    **recomputes** its prompt and the tokens it had already generated, as a prefill, and carries
    on. (The alternative, swapping its blocks to CPU memory and back, is the other option the
    vLLM paper describes; recomputation needs no second memory and a prefill is fast per token.)
    This is why paging and scheduling belong together: the scheduler admits a request only if
    the free list can give it its first blocks, and when the list runs dry it is again the
    scheduler that decides who gives blocks back.

    24 chat requests at once, 16 slots, with pools of different sizes:
    """),
    ("code", """
    pressure = {}
    for num_kv_blocks in [512, 96, 64, 40]:
        result = simulate(chat(24, seed=0), max_num_seqs=16, block_size=16, max_model_len=512,
                          num_kv_blocks=num_kv_blocks)
        pressure[f"{num_kv_blocks} blocks"] = result
        print(f"{num_kv_blocks:>4} blocks: {sum(len(s.preempted) for s in result.steps):>2} preemptions, "
              f"{result.num_steps} steps, {result.total_time:.0f} time units")
    free_blocks_timeline({label: pressure[label] for label in ["96 blocks", "40 blocks"]})
    """),
    ("md", """
    With 64 blocks instead of 512, an eighth of the pool, the preemptions cost only a few percent
    more time. With 40 the pool is so small that the batch shrinks and the workload takes about
    half as long again. Preemption is a safety valve, not a way of life; chapter 07 shows the knobs that
    keep it rare (a watermark of free blocks at admission, and which request to evict).

    Now on the real model: eight requests generating 40 tokens each, once with the default pool
    and once with only 12 blocks of 16 tokens, far less than the 8 × 4 blocks they need at the
    end. The answers must not change:
    """),
    ("code", """
    eight = fixed("eight", [24] * 8, [40] * 8)
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    answers, llms = {}, {}
    for label, num_kv_blocks in [("default pool", None), ("12 blocks", 12)]:
        llm = llms[label] = LLM(max_num_seqs=8, num_kv_blocks=num_kv_blocks)
        prompts = eight.prompt_token_ids(llm.llm_engine.vocab_size, seed=0)
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
        answers[label] = [o.outputs[0].token_ids for o in outputs]
        engine = llm.llm_engine
        per_request = [o.metrics.num_preemptions for o in outputs]
        print(f"{label:>12}: {engine.config.num_kv_blocks} blocks, {engine.scheduler.num_preemptions} preemptions, "
              f"{engine.scheduler.step_count} steps; preempted per request: {per_request}")
    print("same tokens:", answers["default pool"] == answers["12 blocks"])
    """),
    ("md", """
    Every answer is the same, token for token, and here that is exact: in float32 on this CPU the
    recomputed prefill writes the K/V the request had before bit for bit, so greedy decoding picks
    the same tokens again, and a seeded request keeps its own random generator. It holds only up
    to rounding in general: in half precision, or with kernels whose summation order depends on
    the batch's shape, the recomputed K/V can differ in the last bits, and a near-tie between two
    tokens can then go the other way. The price is time, in extra steps:
    every request with a preemption in the list above computed part of its work twice.

    ## 5. Reference counts: one block, several holders

    A block can belong to more than one request. The allocator counts its holders, and a block
    returns to the free list only when the count drops to zero. Two uses, both in minicb:

    * **parallel samples** (`SamplingParams(n=4)`): the samples of one prompt share the prompt's
      blocks. A sample that must write into a shared, partly filled block first copies it
      (**copy-on-write**), so the others' K/V never changes under them.
    * **prefix caching** (`enable_prefix_caching=True`): a full block is named by a hash of its
      tokens and of every token before it; a new request whose prompt starts with the same
      blocks points its table at them instead of computing them again.

    Four samples of one 40-token prompt (two full blocks and a partial one), stepped by hand:
    """),
    ("code", """
    engine = llms["default pool"].llm_engine
    prompt = eight.prompt_token_ids(engine.vocab_size, seed=1)[0] + [7] * 16     # 40 tokens
    # n=4: the engine runs four samples, s-0 ... s-3; the last three fork s-0 and share its prompt blocks
    engine.add_request("s", prompt, SamplingParams(n=4, max_tokens=4, temperature=0.8, seed=0))
    for _ in range(2):
        engine.step()
        tables = {r.request_id: engine.kv.block_table(r) for r in engine.scheduler.running}
        counts = {block: engine.kv.allocator.ref_counts[block] for table in tables.values() for block in table}
        print(f"step {engine.scheduler.step_count}: tables {tables}")
        print(f"        reference counts {counts}; {engine.kv.num_used_blocks()} blocks in use")
    while engine.has_unfinished_requests():
        engine.step()
    print("after they finish:", engine.kv.num_used_blocks(), "blocks in use")
    """),
    ("md", """
    After the first step only `s-0` runs; the other samples join once its prompt's K/V is
    computed. From then on the first two blocks have four holders and are stored once; each of
    the other three samples copied the partly filled third block before writing its own token
    into it. Six blocks instead of twelve, and all of them back on the free list at the end.

    Prefix caching, previewed: three requests that share a 48-token prefix (a "system prompt"),
    served one after the other by an engine with the cache on.
    """),
    ("code", """
    shared = fixed("system prompt", [48], [1]).prompt_token_ids(engine.vocab_size, seed=2)[0]
    questions = [shared + q for q in fixed("questions", [8] * 3, [1] * 3).prompt_token_ids(engine.vocab_size, seed=3)]
    short = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    cached_llm = LLM(max_num_seqs=4, enable_prefix_caching=True)
    cached = [cached_llm.generate([q], short, use_tqdm=False)[0] for q in questions]
    print("prompt tokens served from the cache:", [o.metrics.num_cached_tokens for o in cached])
    print(cached_llm.llm_engine.kv.prefix_stats())
    plain = llms["default pool"].generate(questions, short, use_tqdm=False)
    print("same tokens as without the cache:",
          [o.outputs[0].token_ids for o in cached] == [o.outputs[0].token_ids for o in plain])
    """),
    ("md", """
    The first request computes everything; the next two find the prefix's three full blocks
    (48 tokens) cached and compute only their own 8. Chapter 07 measures what that does to time
    to first token.

    ## Pause and recall

    1. Block size 16, block table `[5, 2, 9]`: in which block, at which offset and in which slot
       does position 37 live?
    <details><summary>Answer</summary>

    Logical block 37 // 16 = 2, so physical block 9; offset 37 % 16 = 5; slot 9 × 16 + 5 = 149.
    </details>
    2. In the block map, why did E and F get B's blocks and not A's?
    <details><summary>Answer</summary>

    The free list is a stack. A and B finished in the same step and returned their blocks, A's
    first and then B's, so B's were on top, and the next requests to ask (E and F) were handed the
    blocks returned last.
    </details>
    3. Which kind of fragmentation does paging remove entirely, and which does it only bound?
       By how much?
    <details><summary>Answer</summary>

    External fragmentation goes entirely: any free block serves any request, so no gap is ever
    too small. Internal fragmentation is bounded by one partly filled block per request, at most
    block_size − 1 empty slots each.
    </details>
    4. When does preemption by recomputation leave every answer unchanged, and what does it cost?
    <details><summary>Answer</summary>

    Exactly when the recomputed prefill writes the same K/V bit for bit (float32 here, kernels
    whose summation order does not depend on the batch), so greedy picks the same tokens and a
    seeded request reuses its own generator; in half precision it holds up to rounding (a
    near-tie can flip). It costs time: the evicted request's prompt and generated tokens are
    computed again.
    </details>
    5. When does a block shared by four samples go back on the free list?
    <details><summary>Answer</summary>

    When its reference count reaches zero: after the last of the four samples that still hold
    it has finished or copied it on write.
    </details>

    ## Interview questions

    **What problem does PagedAttention solve?**
    KV memory fragmentation. Reserving `max_model_len` contiguously per request wastes the unused
    tail (internal) and the gaps between reservations (external), so few requests fit and the
    batch stays small. Fixed-size blocks allocated on demand through a block table waste at most
    one partly filled block per request, so several times more requests fit in the same memory,
    and batch size, hence throughput, grows with them.
    *A common wrong answer:* "it makes the attention computation faster": the indirection makes
    the kernel, if anything, slightly slower; the gain is capacity.

    **What happens when the KV cache fills up in the middle of generation?**
    The scheduler preempts: it frees a running request's blocks and requeues it; when there is
    room again the request recomputes its prompt and the tokens generated so far (or, in systems
    that swap, copies its blocks back from CPU memory) and continues with the same output.
    *A common wrong answer:* "the server runs out of memory and the request fails", or "it only
    stops admitting new requests": admission control alone cannot stop running requests from
    growing.

    **How would you choose the block size?**
    Small blocks waste less (at most `block_size − 1` slots per request) but mean longer block
    tables and smaller, more scattered reads for the attention kernel; large blocks bring the
    reservation's waste back. Measure the waste and the kernel's bandwidth; 16 is the usual
    answer.
    *A common wrong answer:* "as small as possible, 1 token, since that wastes nothing."

    **Why does each block carry a reference count?**
    So that several requests can share one block (a cached prefix, the prompt of parallel
    samples, beams) and the block is freed only when its last holder lets go; a holder that needs
    to write into a shared block copies it first (copy-on-write).
    *A common wrong answer:* "to find leaked blocks"; or "sharing means the requests see each
    other's tokens", which copy-on-write prevents.

    ## Exercise

    `exercises/ch04_block_allocator.py`: write the block allocator (the free list and reference
    counts) and the slot mapping. The grader runs minicb's paged engine on your allocator, with
    evictions and shared blocks, and checks that the model still generates what transformers
    does. Run `make grade CH=04`.

    **Next:** chapter 05 writes the kernels that read and write K/V through the block table.
    """),
]

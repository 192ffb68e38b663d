"""Chapter 05: Triton paged attention (a primer, the KV write, the decode kernel, split-KV, the roofline)."""

CELLS = [
    ("md", """
    # 05 · Triton paged attention

    Chapter 04 scattered each request's K/V over the pool in blocks. Attention must now read a
    request's keys wherever they are, through its block table, for a whole packed batch of
    decodes and prefill chunks at once. This chapter writes that in **Triton**, a Python language
    for GPU kernels: the kernel that writes this step's K/V into its slots, the paged attention
    kernel with its online softmax, and split-KV decoding with its log-sum-exp merge. Everything
    runs here on a CPU through Triton's interpreter, which executes a kernel as numpy code with
    the same semantics, slowly; the GPU numbers come from the kernel benchmark.

    **Learning goals.** After this chapter you can

    1. read a Triton kernel: programs, blocks of indices, masks, loads and stores;
    2. follow a key from its position through the block table to its address in the cache;
    3. explain the online softmax, and why it lets a kernel stream keys tile by tile;
    4. explain split-KV decoding and show that the log-sum-exp merge is exact;
    5. check a kernel against a reference, and judge a decode kernel by bandwidth, on a roofline.
    """),
    ("md", """
    **An analogy for non-specialists.** A librarian fetching a book series whose volumes are
    shelved wherever there was space: the catalogue card (the block table) says volume 1 is on
    shelf 3, volume 2 on shelf 0, volume 3 on shelf 7. Reading the series takes one trip per
    volume, in order, and keeping a running summary while reading (the online softmax) means the
    librarian never has to carry all the volumes at once. Several librarians can each take a few
    volumes and merge their summaries at the end (split-KV).
    """),
    ("code", """
    %matplotlib inline
    import os

    import torch

    if not torch.cuda.is_available():
        # Triton decides compiled-or-interpreted when a kernel is defined: set this before importing it
        os.environ["TRITON_INTERPRET"] = "1"
    import triton
    import triton.language as tl

    from minicb import LLM, SamplingParams, viz
    from minicb.kernels import (choose_num_splits, paged_attention, paged_attention_reference, write_kv,
                                write_kv_reference)
    from minicb.viz import paged_lookup, recorded_kernel_results

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print("Triton", "compiled for the GPU" if device == "cuda" else "interpreted on the CPU")
    """),
    ("md", """
    ## 1. A Triton primer

    A Triton kernel is a Python function that one **program** runs for one piece of the data;
    the launch grid says how many programs run (on a GPU, in parallel). Inside, a program works
    on whole blocks of indices at once (`tl.arange`), loads and stores through pointers plus
    offsets, and **masks** the indices that fall off the end. The smallest useful kernel adds two
    vectors, four elements per program (shown only to read the syntax; minicb's kernels follow):
    """),
    ("code", """
    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        program = tl.program_id(0)                       # which piece is mine
        offsets = program * BLOCK + tl.arange(0, BLOCK)  # my BLOCK indices, as one vector
        mask = offsets < n                               # the last program may run past the end
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    x, y = torch.arange(10.0, device=device), torch.full((10,), 100.0, device=device)
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(10, 4),)](x, y, out, 10, BLOCK=4)    # grid: 3 programs of 4
    print(out.tolist())
    """),
    ("md", """
    Three programs of four lanes cover ten elements; the mask turns off the last two lanes of the
    third. `BLOCK` is a compile-time constant (`tl.constexpr`): on a GPU each value compiles its
    own kernel, so block sizes are powers of two chosen up front.

    ## 2. Writing K/V into the cache

    Each step, every computed token's K and V go to its slot (chapter 04:
    `block * block_size + offset`), listed in `slot_mapping`; a slot of `-1` marks a padding
    token that must not be written. `minicb.kernels.write_kv` runs one program per token, copying
    all its KV heads at once. Two requests, 10 and 7 tokens, blocks of 4:
    """),
    ("code", """
    num_blocks, block_size, num_kv_heads, head_dim = 8, 4, 2, 16
    tables = {"A": [3, 0, 6], "B": [5, 1, 7]}
    lengths = {"A": 10, "B": 7}
    slot_mapping = [tables[r][p // block_size] * block_size + p % block_size for r in "AB" for p in range(lengths[r])]
    slot_mapping.insert(10, -1)                        # a padding token between the two requests
    print("slot_mapping:", slot_mapping)

    generator = torch.Generator().manual_seed(0)
    k = torch.randn(len(slot_mapping), num_kv_heads, head_dim, generator=generator).to(device)
    v = torch.randn(len(slot_mapping), num_kv_heads, head_dim, generator=generator).to(device)
    slots = torch.tensor(slot_mapping, device=device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.zeros(shape, device=device), torch.zeros(shape, device=device)
    write_kv(k, v, k_cache, v_cache, slots)
    k_check, v_check = torch.zeros(shape, device=device), torch.zeros(shape, device=device)
    write_kv_reference(k, v, k_check, v_check, slots)
    print("same cache as the torch reference:", torch.equal(k_cache, k_check) and torch.equal(v_cache, v_check))
    print("slots written per block:", (k_cache.abs().sum(dim=(2, 3)) > 0).sum(dim=1).tolist())
    """),
    ("md", """
    A's ten tokens sit in blocks 3, 0 and 6 (4 + 4 + 2), B's seven in blocks 5 and 1 (4 + 3);
    B's third block is not needed yet, and the padding token went nowhere.

    ## 3. Paged attention: token → block table → address

    A decode step has one query per request; it must attend to all the request's keys. The paged
    kernel (`minicb.kernels.paged_attention`, `kernels/paged_attention.py`) runs one program per
    (request, KV head, query tile). For key position *p* of request *i* it loads
    `block_tables[i, p // block_size]`, then reads the key at `block * stride_block +
    (p % block_size) * stride_offset + kv_head * stride_head`: one indirection per key, no copy.
    Request A of the example above, looking up its key at position 9:
    """),
    ("code", """
    paged_lookup(tables["A"], block_size, seq_len=10, num_blocks=num_blocks, position=9)
    """),
    ("md", """
    The program holds the queries of every query head that shares this KV head (grouped-query
    attention: 4 query heads over 2 KV heads here, groups of 2), so each key tile is loaded once
    for all of them.
    Both requests decode one token; the kernel against minicb's torch reference (which gathers
    each request's keys into a tensor and runs a plain softmax):
    """),
    ("code", """
    num_q_heads = 4
    q = torch.randn(2, num_q_heads, head_dim, generator=generator).to(device)
    cu_seqlens_q = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)   # one query each
    seq_lens = torch.tensor([lengths["A"], lengths["B"]], dtype=torch.int32, device=device)
    block_tables = torch.tensor([tables["A"], tables["B"]], dtype=torch.int32, device=device)
    args = (q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, head_dim**-0.5, 1, 10)
    out = paged_attention(*args)
    reference = paged_attention_reference(*args)
    print(f"output {tuple(out.shape)}; max |kernel - reference| = {(out - reference).abs().max().item():.1e}")
    """),
    ("md", """
    ## 4. The online softmax

    The kernel walks the keys `BLOCK_N` at a time and never holds all the scores: a context of
    32k keys would not fit in a program's registers. It keeps, per query row, a running maximum
    *m*, a running denominator *l* and a running weighted sum of values; when a new tile raises
    the maximum, what was summed so far is rescaled by `exp(m_old − m_new)`. After the last tile,
    `acc / l` is exactly the softmax-weighted sum. Here is the recurrence by hand in torch, on one
    query and ten keys in tiles of four, against the one-shot softmax:
    """),
    ("code", """
    scores = torch.tensor([0.5, 2.0, -1.0, 0.0, 4.0, 1.0, 0.5, -2.0, 3.0, 1.5])
    values = torch.arange(10.0)[:, None] * torch.tensor([[1.0, -1.0]])      # ten 2-d value vectors
    m, l, acc = torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(2)
    for start in range(0, 10, 4):
        tile, tile_values = scores[start:start + 4], values[start:start + 4]
        m_new = torch.maximum(m, tile.max())
        alpha = torch.exp(m - m_new)                 # rescales what was summed under the old maximum
        p = torch.exp(tile - m_new)
        l = l * alpha + p.sum()
        acc = acc * alpha + p @ tile_values
        m = m_new
        print(f"keys {start}-{start + len(tile) - 1}: running max {m.item():.1f}, rescale {alpha.item():.3f}, "
              f"denominator {l.item():.3f}")
    one_shot = torch.softmax(scores, 0) @ values
    print("online:  ", [round(x, 5) for x in (acc / l).tolist()])
    print("one-shot:", [round(x, 5) for x in one_shot.tolist()])
    """),
    ("md", """
    The first tile rescales nothing (there is nothing summed yet); the second raised the maximum
    from 2 to 4, so everything from the first tile was scaled by e⁻² before the new terms were
    added. The kernel does the same with `exp2` (base 2, the fast instruction) and float32
    accumulators, and divides once at the end. FlashAttention (2022) made this streaming form
    the standard way to compute attention; here it serves a decode and a prefill chunk alike,
    causality masking the keys past each query's position.

    ### Build it: the paged decode kernel in Triton

    Now the recurrence as a Triton kernel for decode steps: one program per (request, query
    head). It loads its query, walks the request's block table one block at a time, reads that
    block's keys and values from wherever they sit in the pool, and folds them into the running
    maximum, denominator and sum. Grouped-query attention is one line: query head `h` reads KV
    head `h // group`.
    """),
    ("code", """
    @triton.jit
    def decode_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, scale,
                      stride_q_seq, stride_q_head, stride_k_block, stride_k_slot, stride_k_head,
                      stride_table, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
        seq, head = tl.program_id(0), tl.program_id(1)           # one request, one query head
        dims, slots = tl.arange(0, HEAD_DIM), tl.arange(0, BLOCK_SIZE)
        q = tl.load(q_ptr + seq * stride_q_seq + head * stride_q_head + dims)
        seq_len = tl.load(lens_ptr + seq)
        m = tl.full([], float("-inf"), tl.float32)               # running max
        l = tl.zeros([], tl.float32)                             # running denominator
        acc = tl.zeros([HEAD_DIM], tl.float32)                   # running weighted sum of values
        for i in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
            block = tl.load(tables_ptr + seq * stride_table + i)  # logical block i -> physical
            valid = i * BLOCK_SIZE + slots < seq_len
            where = block * stride_k_block + slots[:, None] * stride_k_slot \\
                + (head // GROUP) * stride_k_head + dims[None, :]
            k = tl.load(k_ptr + where, mask=valid[:, None], other=0.0)
            v = tl.load(v_ptr + where, mask=valid[:, None], other=0.0)
            scores = tl.where(valid, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=0))
            alpha = tl.exp(m - m_new)
            p = tl.exp(scores - m_new)
            l = l * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m = m_new
        tl.store(out_ptr + seq * stride_q_seq + head * stride_q_head + dims, acc / l)


    def decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale):
        \"\"\"q [num_seqs, q_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim].\"\"\"
        out = torch.empty_like(q)
        num_seqs, num_heads, head_dim = q.shape
        decode_kernel[(num_seqs, num_heads)](
            q, k_cache, v_cache, block_tables, seq_lens, out, scale, q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
            GROUP=num_heads // k_cache.shape[2], BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim)
        return out
    """),
    ("md", """
    Your exercise (`exercises/ch05_decode_kernel.py`) grows this into minicb's kernel: blocks of
    queries for prefill chunks, causality, and head sizes that are not powers of two.

    ### Prove it: the same attention as the reference and as minicb's kernel

    Four requests of 5 to 37 keys, 4 query heads over 2 KV heads (groups of 2), blocks of 16
    scattered at random through a 40-block pool, the queries scaled by 50 so that the scores are
    large. Our kernel against `paged_attention_reference` (plain torch, one request at a time) and
    minicb's `paged_attention`; then the same with one line changed: no running maximum (the
    exponentials taken of the raw scores).
    """),
    ("code", """
    def decode_inputs(seed=0):
        g = torch.Generator().manual_seed(seed)
        lens = torch.tensor([5, 16, 37, 20], dtype=torch.int32)
        k_cache = torch.randn(40, 16, 2, 64, generator=g)
        v_cache = torch.randn(40, 16, 2, 64, generator=g)
        tables = torch.randperm(40, generator=g)[:12].view(4, 3).to(torch.int32)   # scattered blocks
        q = torch.randn(4, 4, 64, generator=g) * 50
        return q, k_cache, v_cache, tables, lens


    def check(kernel):
        q, k_cache, v_cache, tables, lens = decode_inputs()
        scale = 64 ** -0.5
        ours = kernel(q, k_cache, v_cache, tables, lens, scale)
        cu = torch.arange(5, dtype=torch.int32)
        reference = paged_attention_reference(q, k_cache, v_cache, cu, lens, tables, scale, 1, 37)
        minicb_out = paged_attention(q, k_cache, v_cache, cu, lens, tables, scale, 1, 37)
        print(f"finite: {bool(ours.isfinite().all())}; equal to the reference: "
              f"{torch.allclose(ours, reference, atol=1e-4, rtol=1e-4)}; to minicb's kernel: "
              f"{torch.allclose(ours, minicb_out, atol=1e-4, rtol=1e-4)}")


    check(decode_attention)
    """),
    ("code", """
    import inspect
    import warnings

    correct_kernel = decode_kernel
    source = inspect.getsource(decode_kernel.fn).replace(
        "m_new = tl.maximum(m, tl.max(scores, axis=0))", "m_new = tl.zeros([], tl.float32)")
    assert "m_new = tl.zeros" in source, "the line to break was not found"
    exec(source)                             # redefines decode_kernel with no running maximum
    with warnings.catch_warnings():          # the interpreter warns about the overflow itself
        warnings.simplefilter("ignore")
        check(decode_attention)              # large scores overflow exp(): the check fails
    decode_kernel = correct_kernel
    """),
    ("md", """
    ### The picture: who computes what

    One launch of the decode kernel is a grid of programs. Program `(i, h)` serves request *i*
    and KV head *h*: it loads the queries of the *h*-th group of query heads (grouped-query
    attention: the heads that share that KV head), then loops over the request's keys a tile of
    `BLOCK_N` = 64 at a time, each block fetched through the request's block table, keeping the
    running max, sum and weighted values of the online softmax. Below, two requests of a real
    paged KV manager (50 and 20 keys, blocks of 16; the pool hands out blocks in the order the
    requests grew), drawn with a tile of 32 keys so that the loop has more than one pass:
    """),
    ("code", """
    from minicb.kv import PagedKVManager
    from minicb.request import Request

    kv = PagedKVManager(num_blocks=12, block_size=16)
    pair = [Request(f"r{i}", [1] * n, SamplingParams(max_tokens=1)) for i, n in enumerate([34, 20])]
    kv.allocate(pair[0], 34)                   # 3 blocks
    kv.allocate(pair[1], 20)                   # 2 blocks
    kv.allocate(pair[0], 50)                   # the first request grows into a 4th block
    tables = [list(kv.block_table(r)) for r in pair]
    print("block tables:", tables)
    viz.decode_grid_picture([50, 20], tables, block_size=16, num_kv_heads=2, group=2, block_n=32)
    """),
    ("md", """
    ### Read the real thing

    minicb's kernel, from the installed package: the same walk over the block table, with a tile
    of queries per program (a prefill chunk's rows, or the query heads of a KV group), causality,
    and an optional split of the keys into partitions (split-KV, next section):
    """),
    ("code", """
    from minicb.kernels.paged_attention import _paged_attention_kernel

    viz.show_source(_paged_attention_kernel.fn)
    """),
    ("md", """
    ## 5. Split-KV decoding and the log-sum-exp merge

    A decode launches only `num_seqs × num_kv_heads` programs. One request with 8 KV heads on a
    GPU with 132 streaming multiprocessors (an H100) would keep 8 of them busy while they stream
    a long context. **Split-KV** (Flash-Decoding, 2023) cuts each request's keys into ranges, one
    program each; every split produces its own normalised output *oₛ* and its log-sum-exp
    `lseₛ = mₛ + log lₛ`, and a small merge kernel combines them:
    `out = Σₛ exp(lseₛ − lse_max) · oₛ / Σₛ exp(lseₛ − lse_max)`. The weights restore each split's
    share of the probability mass, so the merge is exact, not an approximation. The same merge by
    hand, three splits of the ten keys above:
    """),
    ("code", """
    parts = []
    for keys in [slice(0, 4), slice(4, 7), slice(7, 10)]:
        split_scores = scores[keys]
        lse = torch.logsumexp(split_scores, 0)
        parts.append((torch.softmax(split_scores, 0) @ values[keys], lse))
    weights = torch.softmax(torch.stack([lse for _, lse in parts]), 0)      # exp(lse_s - lse_max), normalised
    merged = sum(w * o for w, (o, _) in zip(weights, parts))
    print("split weights:", [round(w, 3) for w in weights.tolist()])
    print("merged:  ", [round(x, 5) for x in merged.tolist()])
    """),
    ("md", """
    Now the kernel: one request with 600 cached keys in 38 blocks scattered over a pool of 64,
    with 1, 2, 3 and 5 splits forced (on a GPU the split count is chosen automatically):
    """),
    ("code", """
    pool_shape = (64, 16, 2, 64)
    k_pool = torch.randn(pool_shape, generator=generator).to(device)
    v_pool = torch.randn(pool_shape, generator=generator).to(device)
    long_table = torch.randperm(64, generator=generator)[:38].view(1, 38).to(torch.int32).to(device)
    query = torch.randn(1, 4, 64, generator=generator).to(device)
    long_args = (query, k_pool, v_pool, torch.tensor([0, 1], dtype=torch.int32, device=device),
                 torch.tensor([600], dtype=torch.int32, device=device), long_table, 64**-0.5, 1, 600)
    expected = paged_attention_reference(*long_args)
    for num_splits in [1, 2, 3, 5]:
        got = paged_attention(*long_args, num_splits=num_splits)
        print(f"{num_splits} splits: max |kernel - reference| = {(got - expected).abs().max().item():.1e}")
    """),
    ("md", """
    How the kernel cuts the keys: each split takes whole tiles of 64 keys, ceil(keys / splits)
    rounded up to a tile, and the last takes what is left (`minicb.viz.split_ranges` computes it
    exactly as the kernel does). For 600 keys over 3 splits:
    """),
    ("code", """
    print("key ranges [lo, hi):", viz.split_ranges(600, 3))
    viz.split_kv_picture(600, 3)
    """),
    ("md", """
    The split count is a heuristic (`minicb.kernels.choose_num_splits`): aim for about two
    programs per streaming multiprocessor, never split below 256 keys, and never split a batch
    that already fills the GPU (the merge would be pure overhead). On an H100 (132 SMs) with
    Llama-3-8B's 8 KV heads:
    """),
    ("code", """
    rows = [{"batch": batch, **{f"context {context}": choose_num_splits(batch, 8, context, num_sms=132)
                                for context in [512, 4096, 32768]}} for batch in [1, 8, 64, 256]]
    print("splits per request\\n" + viz.format_table(rows))
    """),
    ("md", """
    ## 6. The real model on the Triton backend

    The engine picks its attention with `attention="torch" | "triton" | "cpu"` (the last is the
    next section's). The same prompts through all three, greedy (on this CPU, the Triton kernels
    run in the interpreter):
    """),
    ("code", """
    prompts = ["def fibonacci(n):", "import os\\n"]
    greedy = SamplingParams(max_tokens=12, temperature=0)
    answers = {backend: LLM(attention=backend, max_num_seqs=2).generate(prompts, greedy, use_tqdm=False)
               for backend in ["torch", "triton", "cpu"]}
    for backend, outputs in answers.items():
        print(f"{backend:>6}:", [o.outputs[0].text for o in outputs])
    tokens = {backend: [o.outputs[0].token_ids for o in outputs] for backend, outputs in answers.items()}
    print("same tokens:", tokens["torch"] == tokens["triton"] == tokens["cpu"])
    """),
    ("md", """
    `tests/test_kernels.py` holds the kernels to the reference over many shapes (grouped
    queries, ragged prefill chunks mixed with decodes, block sizes, splits, padding); the parity
    tests run the whole engine on the Triton backend against transformers.

    ### The same idea on a CPU, in C

    Triton compiles only for GPUs; on a CPU its interpreter is far too slow to serve with. The
    torch backend works anywhere, but a paged cache costs it dearly on decodes: it copies every
    decode row's keys out of their blocks into one tensor padded to the longest row, then
    `scaled_dot_product_attention` reads that copy again. A decode is memory-bound, so that is
    three passes over padded K/V where one pass over the real keys would do.

    So on a CPU minicb's default backend (`attention="auto"` resolves to `"cpu"`) sends decode
    rows to a short C kernel, `kernels/cpu_attention.c`, that does what the Triton kernel does:
    follow the block table, read each key where it lies, softmax, weighted sum of the values. One
    CPU thread takes one query token at a time (on a GPU, one program per request and head);
    prompts stay on SDPA, whose blocked matrix products win when many queries share each key. The
    engine compiles it with the machine's C compiler the first time it is needed; without one,
    `"auto"` quietly stays on the torch backend. One layer's attention for a decode step of 64
    requests whose contexts run from 20 to 560 tokens, the default model's head shapes:
    """),
    ("code", """
    # NBVAL_IGNORE_OUTPUT
    import time

    from minicb.kernels import cpu as cpu_kernel
    from minicb.model.attention import AttentionMetadata, paged_attention_cpu, paged_attention_torch

    gen = torch.Generator().manual_seed(0)
    block_size, num_kv_heads, num_q_heads, head_dim = 16, 2, 4, 64
    contexts = torch.randint(20, 561, (64,), generator=gen)
    blocks_per_row = int(contexts.max() + block_size - 1) // block_size
    pool = torch.randperm(64 * blocks_per_row, generator=gen)          # each row's blocks, scattered
    k_cache = torch.randn(len(pool), block_size, num_kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(len(pool), block_size, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(64, num_q_heads, head_dim, generator=gen)


    def decode_meta():
        return AttentionMetadata(slot_mapping=torch.full((64,), -1), cu_seqlens_q=torch.arange(65, dtype=torch.int32),
                                 seq_lens=contexts.int(), block_tables=pool.view(64, -1).int(),
                                 max_seqlen_q=1, max_seqlen_k=int(contexts.max()))


    def best_ms(attend, repeats=20):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            attend(q, k_cache, v_cache, decode_meta(), head_dim**-0.5)
            times.append(time.perf_counter() - start)
        return min(times) * 1e3


    print("C kernel built with:", cpu_kernel.available()[1])
    omp = cpu_kernel._library()              # the kernel's OpenMP runtime (torch has its own)
    default_threads = omp.omp_get_max_threads()
    for threads in (1, 2):                   # both on the same number of threads
        torch.set_num_threads(threads)
        omp.omp_set_num_threads(threads)
        torch_ms, cpu_ms = best_ms(paged_attention_torch), best_ms(paged_attention_cpu)
        print(f"{threads} thread(s): torch backend (gather + SDPA) {torch_ms:6.2f} ms, "
              f"C kernel {cpu_ms:6.2f} ms ({torch_ms / cpu_ms:.1f}x faster)")
    torch.set_num_threads(1)
    omp.omp_set_num_threads(default_threads)
    """),
    ("code", """
    error = (paged_attention_cpu(q, k_cache, v_cache, decode_meta(), head_dim**-0.5)
             - paged_attention_torch(q, k_cache, v_cache, decode_meta(), head_dim**-0.5)).abs().max().item()
    print("largest difference from the torch backend:", "below 1e-5" if error < 1e-5 else f"{error:.1e}")
    """),
    ("md", """
    The gap is the one this chapter is about: reading keys in place through the block table
    instead of gathering them first. In the offline benchmark (`benchmarks/README.md`) this kernel
    is what took the continuous engine's decode steps from the slowest part of a run to a small
    one. `tests/test_cpu_attention.py` holds it to the same reference as the Triton kernel, and the
    parity tests run the engine on it against transformers.

    ## 7. On a GPU: bandwidth and the roofline

    A decode reads every cached K/V byte of every request once and does little arithmetic with
    it. Per query head and key it does a dot product with the key and a multiply-add into the
    output: 4 × `head_dim` FLOPs. Per KV head and key it reads 2 × `head_dim` values of 2 bytes
    (bfloat16). With *g* query heads per KV head, that is **g FLOPs per byte**, 4 for Llama-3-8B,
    whatever the batch size or context, since every request reads its own keys. A prefill chunk
    of *c* tokens reuses each key for *c* queries: about *c · g* FLOPs per byte. Against an
    H100 SXM (989 TFLOP/s dense bfloat16, 3.35 TB/s of HBM3, NVIDIA's datasheet):
    """),
    ("code", """
    peak_flops, bandwidth = 989e12, 3.35e12
    group = 32 // 8                     # Llama-3-8B: 32 query heads share 8 KV heads
    points = {"decode attention": group, "prefill chunk of 512": 512 * group, "weights, decode batch 64": 64}
    print(f"ridge point: {peak_flops / bandwidth:.0f} FLOP per byte")
    viz.roofline(peak_flops, bandwidth, points, title="H100 SXM: decode attention sits far below the ridge")
    """),
    ("md", """
    (The weights' point: a decode step multiplies every weight by one token per running request,
    so their arithmetic intensity is about the batch size in bfloat16: why batching pays, chapter
    00.) Decode attention is memory-bound at any batch, so its honest unit is bandwidth: K/V
    bytes read per second against what the GPU can stream. That gives a floor on its time, from
    arithmetic alone: the benchmark's grid, Llama-3-8B heads, bfloat16, for one layer's attention
    (a decode step of the whole model reads 32 times as much, one layer after another):
    """),
    ("code", """
    rows = []
    for batch in [1, 8, 64, 256]:
        for context in [512, 4096, 32768]:
            kv_bytes = 2 * batch * context * 8 * 128 * 2     # K and V, 8 KV heads of 128, 2 bytes each
            rows.append({"batch": batch, "context": context, "K/V read (MiB)": kv_bytes / 2**20,
                         "floor at 3.35 TB/s (us)": kv_bytes / bandwidth * 1e6})
    print(viz.format_table(rows, digits=1))
    """),
    ("md", """
    A kernel that reaches, say, 80 % of the copy bandwidth spends 1.25× those times. The kernel
    benchmark (`minicb/bench/kernels.py`) measures exactly that on a GPU: the Triton kernel over
    shuffled block tables, torch's `scaled_dot_product_attention` on contiguous K/V (the best case
    without paging), and the torch backend's gather-then-attend, as GB/s of K/V read beside the
    device's own copy bandwidth. Its results, if any are recorded in `benchmarks/results/`:
    """),
    ("code", """
    from IPython.display import Image, display

    from minicb.bench.kernels import print_table

    recorded = recorded_kernel_results("../benchmarks/results")
    if not recorded:
        print("No GPU measurement has been recorded yet: benchmarks/results/ holds no kernels-<device>.json.\\n"
              "On a machine with an NVIDIA GPU, from the repository root:\\n"
              "    python -m minicb bench kernels\\n"
              "writes benchmarks/results/kernels-<device>.json and .png; rebuild this chapter to show them.\\n"
              "(python -m minicb bench kernels --dry-run runs a tiny grid through the interpreter: it\\n"
              "checks the code path on a CPU and measures nothing.)")
    for run in recorded:
        print(f"{run['device']}, {run['date']}, torch {run['torch_version']}, triton {run['triton_version']}")
        print_table(run)
        display(Image(run["plot_path"]))
    """),
    ("md", """
    What to look for in those numbers: at large batches and long contexts the Triton kernel
    should approach the copy bandwidth and match SDPA on contiguous memory (paging costs one
    table lookup per key tile, not bandwidth); the gather path moves every byte three times;
    and at batch 1 with a long context, split-KV is what keeps the kernel from using a handful of
    the GPU's multiprocessors. That is the case Flash-Decoding was built for: its authors measured
    up to 8× faster generation for very long sequences (Flash-Decoding blog post, 2023).

    ## Pause and recall

    1. In the add kernel, what does the mask do, and what would go wrong without it?
    <details><summary>Answer</summary>

    It switches off the lanes of the last block that lie past the end of the arrays, so they
    neither load nor store. Without it the last program would read and write memory beyond the
    tensors: garbage results at best, another tensor's data overwritten or a crash at worst.
    </details>
    2. Block size 16, block table `[4, 9, 2]`: which block and offset does the kernel read for key
       37? Which slot did `write_kv` write it to?
    <details><summary>Answer</summary>

    Logical block 37 // 16 = 2, so physical block 2; offset 37 % 16 = 5; `write_kv` wrote it to
    slot 2 × 16 + 5 = 37 (a coincidence of this table: the slot is not the position in general).
    </details>
    3. In the online softmax, when is `alpha` smaller than 1, and why must `acc` be multiplied
       by it?
    <details><summary>Answer</summary>

    When a new tile contains a score larger than the running maximum: alpha = exp(m_old − m_new).
    Everything accumulated so far was weighted with exp(score − m_old); multiplying by alpha
    rescales it to the new maximum, so all terms share one reference and the final division by
    the sum is right.
    </details>
    4. Why is the log-sum-exp merge exact? When is splitting a waste?
    <details><summary>Answer</summary>

    Each split's output is its own softmax average, and its log-sum-exp records how much
    probability mass the split holds; weighting each output by exp(lse_s − lse_max) and dividing
    by the sum of those weights gives exactly the softmax over all keys. Splitting is a waste
    when the batch already gives every multiprocessor work, or the context is short: the extra
    programs, partial outputs and merge then cost more than they save.
    </details>
    5. Why do you judge a decode attention kernel in GB/s rather than TFLOP/s?
    <details><summary>Answer</summary>

    A decode does about 2 FLOP per key element it reads (one multiply-add for the score, one
    for the sum), far too few to keep the arithmetic units busy: its speed is set by how fast it
    streams K and V, so the measure of a good kernel is how close it gets to the memory
    bandwidth.
    </details>

    ## Interview questions

    **Why is decode attention memory-bound, and how do you judge a decode kernel?**
    Each cached K/V byte is read once per step and used for only a few FLOPs (with grouped-query
    attention, about *g* FLOPs per byte in bfloat16: 4 for Llama-3-8B), two orders of magnitude
    below an H100's ridge point of about 300. So the measure is bandwidth achieved (bytes of K/V
    read per second) against the device's copy bandwidth, not FLOP/s.
    *A common wrong answer:* "attention is quadratic, so it is compute-bound": that is prefill
    over long prompts; a decode has one query per request.

    **What is the online softmax and why does a kernel need it?**
    A single pass over the keys in tiles that keeps a running maximum and a running denominator,
    rescaling the partial sums whenever the maximum grows. It is exact and numerically stable,
    and the kernel never has to hold all the scores for a long context, only one tile.
    *A common wrong answer:* "it is an approximation of softmax that trades accuracy for speed."

    **When does split-KV decoding help?**
    When a decode has too few (request, KV head) pairs to fill the GPU, that is small batches
    with long contexts: splitting each context over several programs uses more multiprocessors,
    and a log-sum-exp merge combines the partial results exactly. Large batches already fill the
    GPU, and then the merge is pure overhead.
    *A common wrong answer:* "it reduces the bytes read", or "always split": it reads the same
    K/V, plus a little for the merge.

    **How does a paged attention kernel find the key at position p?**
    `block = block_tables[request, p // block_size]`, `offset = p % block_size`, then address =
    block × stride_block + offset × stride_offset + kv_head × stride_head: one table load per
    key tile, keys read in place.
    *A common wrong answer:* "it first gathers the blocks into a contiguous tensor": that is
    what a fallback does (minicb's torch backend), at the cost of extra copies.

    **Serving on a CPU, why can a paged cache make decode attention slow, and what fixes it?**
    A library attention call wants each request's keys in one tensor, so the fallback gathers
    every decode row's blocks into a tensor padded to the longest row, then reads it again:
    several passes over padded K/V for an operation bound by memory traffic. A kernel that follows
    the block table and reads each real key once does one pass (minicb's C kernel against gather
    + SDPA, both on the same threads, one layer of a 64-row decode step on the 2-core EPYC this
    book was built on: 5.9x and 6.2x on one thread, 4.8x to 11.6x on two, which moved with the
    other work on the machine; section 6 measures it on yours).
    *A common wrong answer:* "paging costs nothing": on any device it costs the table lookups,
    and a gather-based fallback also costs the copies.

    **How do you test a GPU kernel on a machine without a GPU?**
    Run it through Triton's interpreter (`TRITON_INTERPRET=1`) on small shapes and compare with
    a plain-torch reference within a tolerance, over shapes that cross block and tile edges; the
    same tests then run compiled on a GPU, where the benchmark measures speed.
    *A common wrong answer:* "you cannot; wait for GPU access."

    ## Exercise

    `exercises/ch05_decode_kernel.py`: write a Triton paged-attention kernel for decode steps (one
    program per request and query head, the online softmax, no split). The grader holds it to
    `minicb.kernels.paged_attention_reference` and runs the engine's decode attention on it
    against transformers. It runs on a CPU through the interpreter: `make grade CH=05`.

    **Next:** chapter 06 puts the engine behind an HTTP server and loads it with traffic.
    """),
]

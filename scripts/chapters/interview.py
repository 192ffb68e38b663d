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
]

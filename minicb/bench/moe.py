"""`python -m minicb bench moe`: the experts a decode step touches, and the weights it reads,
against batch size; tokens/s against dense models of the same active and the same total size.

    python -m minicb bench moe [--experts 64] [--top-k 8] [--batches 1 2 4 8 16 32 64]
                               [--speed-batches 1 8 64] [--repeats 5]

A random Qwen3-MoE with a real MoE's proportions, scaled to a CPU (Qwen3-30B-A3B: 128 experts,
top-8, expert size 768 for hidden 2048; here E experts, top-k, expert size 0.375 x hidden)
decodes B requests at once. Each sparse layer counts the distinct experts a step's tokens chose
(minicb.model.expert_load): the step reads their weights and no others'. Tokens routed
independently and uniformly touch E·(1 − (1 − k/E)^B) on average: k at one row, all E soon after.
So the batch that amortises a dense model's weights over B rows makes an MoE step read more of
its weights: "an MoE costs its active parameters" holds at batch 1 only.

The speed part runs every model on the CPU engine's own path (attention="cpu", every measured
step within max_fused_decode_rows): the dense models through the fused C decode layer, the MoE
through the C experts (kernels/cpu_moe.c) and, as a fourth system, through the torch experts,
which says what the C path gains. The systems alternate, rotated each repeat; each run records
the load average beside it, and each ratio's verdict is minicb.repeats'.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from minicb.bench.harness import add_flags, alternate, announce, bench_parser, write_results
from minicb.bench.machine import load_average
from minicb.repeats import Repeats
from minicb.sim.expert_parallel import experts_touched


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser("moe", __doc__)
    add_flags(p, "repeats", "seed", "out_dir")
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--speed-batches", type=int, nargs="*", default=[1, 8, 64],
                   help="rows at which tokens/s is compared with the dense models (none: skip)")
    p.add_argument("--steps", type=int, default=8, help="decode steps measured per run")
    return p.parse_args(argv)


def build(directory: str, args, dense_size: int | None = None) -> str:
    """A random Qwen3-MoE (or, with dense_size, a dense Qwen3 of that MLP size) like it."""
    import torch
    import transformers

    common = dict(vocab_size=4096, hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
                  max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(args.seed)
    if dense_size is None:
        config = transformers.Qwen3MoeConfig(
            intermediate_size=args.hidden * 3, moe_intermediate_size=args.hidden * 3 // 8,
            num_experts=args.experts, num_experts_per_tok=args.top_k, norm_topk_prob=True,
            **common)
        model = transformers.Qwen3MoeForCausalLM(config)
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            intermediate_size=dense_size, **common))
    model.save_pretrained(directory)
    return directory


def decode(llm, rows: int, steps: int, seed: int) -> float:
    """`rows` requests prefilled together, then `steps` decode steps of all of them; the decode
    steps' seconds. The expert counts restart after the prefill."""
    import random

    from minicb import SamplingParams

    engine, rng = llm.llm_engine, random.Random(seed)
    for i in range(rows):
        engine.add_request(f"{seed}-{i}", [rng.randrange(3, 4096) for _ in range(16)],
                           SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True))
    engine.step()                                  # every prompt, one step
    load = engine.model.expert_load
    if load is not None:
        load.reset()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    seconds = time.perf_counter() - start
    while engine.has_unfinished_requests():       # an overlapped engine reports a step late
        engine.step()
    return seconds


def main(argv: list[str] | None = None) -> int:
    from minicb import LLM
    from minicb.model.moe import use_cpu_moe

    args = parse_args(argv or [])
    e, k = args.experts, args.top_k
    announce(f"experts touched per decode step: {e} experts, top-{k}, batches {args.batches}")
    work = tempfile.mkdtemp(prefix="minicb-moe-")
    size = args.hidden * 3 // 8
    models = {"moe": build(f"{work}/moe", args)}
    if args.speed_batches:
        models["dense, same active"] = build(f"{work}/active", args, k * size)
        models["dense, same total"] = build(f"{work}/total", args, e * size)
        models["moe, torch experts"] = models["moe"]
    top = max(args.batches + args.speed_batches)
    engines = {name: LLM(path, attention="cpu", max_num_seqs=top, max_fused_decode_rows=top,
                         max_num_batched_tokens=16 * top, max_model_len=64)
               for name, path in models.items()}
    if "moe, torch experts" in engines:
        use_cpu_moe(engines["moe, torch experts"].llm_engine.model, 0)
    expert_bytes = 3 * args.hidden * size * 4          # gate, up, down in float32
    touched = []
    for rows in args.batches:
        decode(engines["moe"], rows, args.steps, args.seed + rows)
        s = engines["moe"].llm_engine.model.expert_load.summary()
        per_layer = s["experts_touched_per_step"]
        predicted = experts_touched(e, k, rows)
        touched.append({"rows": rows, "touched_per_layer": per_layer,
                        "touched": sum(per_layer) / len(per_layer), "predicted": predicted,
                        "imbalance": s["imbalance"],
                        "expert_bytes_per_step": sum(per_layer) * expert_bytes})
        print(f"B={rows:3d}: touched {touched[-1]['touched']:.1f} per layer "
              f"(predicted {predicted:.1f}), imbalance {max(s['imbalance']):.2f}")
    for name, rows in ((name, rows) for name in engines for rows in args.speed_batches):
        decode(engines[name], rows, 1, 0)          # warm each system's path at each size once
    speed = []
    for repeat, name in alternate(args.repeats, list(models), rotate=True):
        for rows in args.speed_batches:
            seconds = decode(engines[name], rows, args.steps, 1000 * repeat + rows)
            speed.append({"model": name, "rows": rows, "repeat": repeat,
                          "tokens_per_s": rows * args.steps / seconds,
                          "load_average": load_average()})
    payload = {"benchmark": "moe", "experts": e, "top_k": k, "hidden": args.hidden,
               "expert_size": size, "layers": args.layers, "steps": args.steps,
               "repeats": args.repeats, "expert_bytes": expert_bytes, "touched": touched,
               "speed": speed, "ratios": ratios(speed)}
    for row in payload["ratios"]:
        print(f"B={row['rows']:3d} moe / {row['against']}: {row['reading']}")
    json_path, png_path = write_results(args.out_dir, f"moe-E{e}-k{k}", payload, plot)
    print(f"results: {json_path}, {png_path}")
    return 0


def ratios(speed: list[dict]) -> list[dict]:
    """The MoE's tokens/s over each other system's, paired repeat by repeat, per row count,
    with minicb.repeats' reading."""
    rate = {(s["model"], s["rows"], s["repeat"]): s["tokens_per_s"] for s in speed}
    out = []
    for rows in sorted({s["rows"] for s in speed}):
        for other in sorted({s["model"] for s in speed} - {"moe"}):
            paired = [rate["moe", rows, r] / rate[other, rows, r]
                      for m, b, r in rate if m == other and b == rows]
            result = Repeats.of(paired)
            out.append({"rows": rows, "against": other, "ratios": paired,
                        "median": result.median, "verdict": result.verdict("faster", "slower"),
                        "reading": result.describe("faster", "slower")})
    return out


def plot(record: dict):
    import matplotlib.pyplot as plt

    rows = [t["rows"] for t in record["touched"]]
    e, k = record["experts"], record["top_k"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    fine = range(1, max(rows) + 1)
    left.plot(fine, [experts_touched(e, k, b) for b in fine], "k--",
              label="E·(1 − (1 − k/E)^B)")
    for layer in range(len(record["touched"][0]["touched_per_layer"])):
        left.plot(rows, [t["touched_per_layer"][layer] for t in record["touched"]], "o",
                  alpha=0.6, label=f"layer {layer}")
    left.set(xscale="log", xlabel="rows in the decode step (B)", ylabel="distinct experts",
             title=f"experts a step touches ({e} experts, top-{k})")
    left.legend(fontsize=8)
    mib = record["expert_bytes"] * record["layers"] / 2**20
    right.plot(rows, [t["touched"] * mib / b for t, b in zip(record["touched"], rows)], "o-",
               label="MoE: the touched experts")
    right.plot(rows, [k * mib / b for b in rows], ":", label="its active parameters (k experts)")
    right.plot(rows, [e * mib / b for b in rows], "--", label="all E experts (dense, same total)")
    right.set(xscale="log", yscale="log", xlabel="rows in the decode step (B)",
              ylabel="expert weights read per token (MiB)", title="weights read per token")
    right.legend(fontsize=8)
    figure.tight_layout()
    return figure

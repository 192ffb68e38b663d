"""`python -m minicb bench offline`: one workload, seven ways to serve it, side by side in one run.

    python -m minicb bench offline                                 # long-tail, default model, all
    systems
    python -m minicb bench offline --num-prompts 64 --systems hf-generate continuous-paged
    python -m minicb bench offline --device cuda --dtype bfloat16 --random-model qwen2-0.5b

Every system gets the same prompts (token ids), the same output lengths (max_tokens with EOS
ignored) and the same weights; batched systems get the same request slots (max_num_seqs) and KV
capacity. minicb's step token budget fits a full static batch's padded prefill; transformers'
continuous batching gets the budget it runs best with (--hf-max-batch-tokens). Throughput is
output tokens per second of wall clock, and per second of this process's CPU time, which a
machine shared with other work disturbs far less. TTFT and TPOT come from each token's
timestamp. Greedy outputs are compared token by token against a reference (transformers one at a
time when it runs), and every disagreement is reported with the logit margin between the two
tokens, so a near-tie reads as one.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minicb.bench.agreement import agreement
from minicb.bench.common import (
    PeakMemory,
    display_path,
    fit_to_context,
    load_hf_model,
    load_workload,
    log_model_steps,
    resolve_model,
    workload_facts,
)
from minicb.bench.harness import add_flags, announce, bench_parser, format_table, write_results
from minicb.bench.peers import SystemRun, hf_continuous, hf_one_at_a_time, hf_static_batches
from minicb.config import EngineConfig, blocks_for
from minicb.metrics import summarize
from minicb.sim.workload import Workload

SYSTEMS = {
    "hf-generate": "transformers generate, one request at a time",
    "hf-static": "transformers generate, padded static batches",
    "hf-generate-batch": "transformers generate_batch (continuous batching, paged cache)",
    "naive": "minicb naive (one at a time)",
    "static": "minicb static batching",
    "continuous-contiguous": "minicb continuous batching, contiguous KV",
    "continuous-paged": "minicb continuous batching, paged KV",
}
# systems outside this process and environment, added with --peers
PEERS = {"vllm": "vLLM's CPU build at --dtype (its own environment: make peer-vllm)",
         "vllm-bfloat16": "vLLM's CPU build, bfloat16 (make peer-vllm)",
         "vllm-float32": "vLLM's CPU build, float32 (make peer-vllm)",
         "vllm-w8a8": "vLLM's CPU build, the weights written as W8A8 (int8 activations)",
         "llamacpp-f32": "llama.cpp, F32 GGUF, batched API (make peer-llamacpp)",
         "llamacpp-bf16": "llama.cpp, BF16 GGUF, batched API (make peer-llamacpp)",
         "llamacpp-q8_0": "llama.cpp, Q8_0 GGUF, batched API (make peer-llamacpp)"}
MINICB_KNOBS = {"naive": dict(scheduler="naive", kv_cache="contiguous"),
                "static": dict(scheduler="static", kv_cache="contiguous"),
                "continuous-contiguous": dict(scheduler="continuous", kv_cache="contiguous"),
                "continuous-paged": dict(scheduler="continuous", kv_cache="paged")}
# (system, baseline, factor): the continuous engine's targets on this benchmark
ENGINE_FLAGS = ("attention", "device", "dtype", "max_num_seqs", "max_num_batched_tokens",
                "max_model_len", "block_size", "num_kv_blocks", "cpu_threads")
TARGETS = [("continuous-paged", "hf-generate", 10.0),
           ("continuous-paged", "hf-generate-batch", 2.0), ("continuous-paged", "static", 1.5),
           ("continuous-paged", "vllm", 1.0)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser("offline", __doc__)
    add_flags(p, "model", "random_model", "workload", "num_prompts")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--peers", nargs="+", default=[], choices=list(PEERS),
                   help="also run these engines, each in its own environment, on the same "
                        "weights, prompts and lengths and as many requests at once (vllm-*: "
                        "build it with `make peer-vllm`; llamacpp-*: `make peer-llamacpp`)")
    p.add_argument("--hf-page-size", type=int, default=256,
                   help="page size of transformers' paged cache")
    p.add_argument("--hf-max-batch-tokens", type=int, default=512,
                   help="tokens per step of transformers' continuous batching: on a CPU it builds "
                        "a dense attention mask per step, so it runs best with small steps (512 "
                        "was its best of 256-18432)")
    add_flags(p, "threads", "out_dir", seed=dict(help="seed of the prompts' token ids"))
    p.add_argument("--no-progress", action="store_true")
    # the engine knobs every minicb system shares (each system sets its own scheduler and KV
    # layout); the default step budget is None here: enough for a full static batch's prefill
    EngineConfig.add_cli_args(p, only=ENGINE_FLAGS,
                              defaults={"max_num_seqs": 64, "max_num_batched_tokens": None})
    return p.parse_args(argv)


def run_minicb(name: str, model_path: str, args, prompts, output_lens, progress: bool) -> SystemRun:
    from minicb import LLM, SamplingParams

    knobs = dict(MINICB_KNOBS[name], **EngineConfig.knobs_from_cli(args, only=ENGINE_FLAGS))
    llm = LLM(model_path, **knobs)
    llm.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                 use_tqdm=False)  # warm-up
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in output_lens]
    engine = llm.llm_engine
    steps = log_model_steps(engine)
    cpu_start = time.process_time()
    with PeakMemory(args.device) as probe:
        results = llm.generate(prompts, params, use_tqdm=progress)
    cpu_seconds = time.process_time() - cpu_start
    # the KV pool is allocated up front, before the probe starts: count it as memory the run needs
    settings = dict(knobs, num_kv_blocks=engine.config.num_kv_blocks,
                    attention=engine.config.attention, steps=len(steps),
                    kv_pool_bytes=engine.runner.kv_cache_bytes(),
                    peak_growth_bytes=probe.peak_bytes, time_split=time_split(steps, cpu_seconds))
    return SystemRun([r.outputs[0].token_ids for r in results], [r.metrics for r in results],
                     settings, cpu_seconds)


def time_split(steps: list[tuple[float, int, int]], cpu_seconds: float) -> dict:
    """Where the CPU time went: steps with prompt tokens, pure decode steps, and the engine
    around them."""
    prefill = [s for s in steps if s[1] > 0]
    decode = [s for s in steps if s[1] == 0]
    in_model = sum(s[0] for s in steps)
    return {"prefill_steps": len(prefill), "prefill_step_cpu_s": sum(s[0] for s in prefill),
            "prompt_tokens": sum(s[1] for s in prefill), "decode_steps": len(decode),
            "decode_step_cpu_s": sum(s[0] for s in decode),
            "mean_decode_rows": sum(s[2] for s in decode) / max(len(decode), 1),
            "outside_model_cpu_s": cpu_seconds - in_model}


def run_system(name: str, model_path: str, hf_model, args, prompts: list[list[int]],
               output_lens: list[int], progress: bool) -> tuple[SystemRun, int]:
    """Run one system; return what it produced and its peak memory beyond the weights (bytes)."""
    if name in MINICB_KNOBS:
        run = run_minicb(name, model_path, args, prompts, output_lens, progress)
        return run, run.settings["peak_growth_bytes"] + run.settings["kv_pool_bytes"]
    if name in PEERS:
        return run_peer(name, model_path, args, prompts, output_lens), 0
    pad = hf_model.generation_config.pad_token_id or 0
    with tqdm(total=len(prompts), desc="requests", disable=not progress) as bar, \
            PeakMemory(args.device) as probe:
        if name == "hf-generate":
            run = hf_one_at_a_time(hf_model, prompts, output_lens, pad, bar.update)
        elif name == "hf-static":
            run = hf_static_batches(hf_model, prompts, output_lens, pad, args.max_num_seqs,
                                    bar.update)
        else:
            blocks = args.num_kv_blocks or args.max_num_seqs * blocks_for(args.max_model_len,
                                                                           args.block_size)
            kv_tokens = blocks * args.block_size
            run = hf_continuous(hf_model, prompts, output_lens, pad, args.max_num_seqs,
                                args.hf_max_batch_tokens, kv_tokens, args.hf_page_size, bar.update)
    return run, probe.peak_bytes


PEER_MODULES = {"vllm": "minicb.bench.vllm_peer", "llamacpp": "minicb.bench.llamacpp_peer"}


def prepare(args) -> tuple[str, str, Workload, float, list[list[int]]]:
    """(model path, label, workload fitted to the context, its scale, prompt ids); sets knobs."""
    model_path, model_label = resolve_model(args.model, args.random_model, args.dtype)
    config = json.loads((Path(model_path) / "config.json").read_text())
    args.max_model_len = args.max_model_len or min(config.get("max_position_embeddings", 2048),
                                                   2048)
    workload, scale = fit_to_context(load_workload(args.workload, args.num_prompts),
                                     args.max_model_len)
    args.max_num_batched_tokens = (args.max_num_batched_tokens
                                   or args.max_num_seqs * max(workload.prompt_lens))
    return (model_path, model_label, workload, scale,
            workload.prompt_token_ids(config["vocab_size"], seed=args.seed))


def run_peer(name: str, model_path: str, args, prompts: list[list[int]],
             output_lens: list[int]) -> SystemRun:
    """A peer in its own environment, with minicb's request slots, context and step budget."""
    if name.startswith("vllm"):
        from minicb.bench.vllm_peer import run_vllm

        dtype = args.dtype if name == "vllm" else name.removeprefix("vllm-")
        if dtype == "w8a8":
            model_path, dtype = w8a8_copy(model_path), "bfloat16"
        return run_vllm(model_path, prompts, output_lens, args.max_model_len,
                        {"max_num_seqs": args.max_num_seqs, "dtype": dtype})
    from minicb.bench.llamacpp_peer import run_llamacpp

    return run_llamacpp(model_path, prompts, output_lens, name.removeprefix("llamacpp-"),
                        llamacpp_settings(args))


@functools.cache
def w8a8_copy(model_path: str) -> str:
    """The model written once per process as compressed-tensors W8A8, for vLLM's int8 path."""
    from minicb.model.compressed import write_w8a8_checkpoint

    return str(write_w8a8_checkpoint(model_path, tempfile.mkdtemp(prefix="minicb-w8a8-")))


def llamacpp_settings(args) -> dict:
    """llama.cpp's knobs from minicb's: one sequence per request slot, a context of
    max_model_len for each, the step's token budget as its batch, the same threads."""
    return {"parallel": args.max_num_seqs, "n_ctx_seq": args.max_model_len,
            "n_batch": args.max_num_batched_tokens, "threads": torch.get_num_threads()}


def check_peers(peers: list[str]) -> None:
    """Before any system runs: a peer whose environment is missing fails at once."""
    for module in {PEER_MODULES[peer.split("-")[0]] for peer in peers}:
        importlib.import_module(module).check_available()


def summarize_run(name: str, run: SystemRun, peak_bytes: int) -> dict:
    s = summarize(run.metrics)
    return {"system": name, "label": SYSTEMS.get(name) or PEERS[name], "requests": s.num_requests,
            "output_tokens": s.output_tokens, "duration_s": s.duration,
            "output_throughput": s.output_throughput, "cpu_seconds": run.cpu_seconds,
            "output_per_cpu_second": s.output_tokens / max(run.cpu_seconds, 1e-9),
            "ttft_p50_s": s.ttft["p50"], "ttft_p95_s": s.ttft["p95"],
            "tpot_p50_ms": s.tpot["p50"] * 1e3, "tpot_p95_ms": s.tpot["p95"] * 1e3,
            "peak_memory_mb": peak_bytes / 2**20, "settings": run.settings}


def check_targets(rows: dict[str, dict]) -> list[dict]:
    """Each target's ratio in output tokens per wall-clock second and per CPU second."""
    checks = []
    for system, baseline, factor in TARGETS:
        if system in rows and baseline in rows:
            wall = rows[system]["output_throughput"] / rows[baseline]["output_throughput"]
            cpu = rows[system]["output_per_cpu_second"] / rows[baseline]["output_per_cpu_second"]
            cpu = None if math.isnan(cpu) else cpu      # a peer whose CPU time is not known
            checks.append({"system": system, "baseline": baseline, "target": factor, "ratio": wall,
                           "ratio_cpu": cpu, "met": wall >= factor,
                           "met_cpu": None if cpu is None else cpu >= factor})
    return checks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    if args.peers:
        check_peers(args.peers)
        args.systems = [*args.systems, *[p for p in args.peers if p not in args.systems]]
    if args.threads:
        torch.set_num_threads(args.threads)
    progress = not args.no_progress
    model_path, model_label, workload, scale, prompts = prepare(args)
    output_lens = workload.output_lens
    announce(f"{model_label}: {workload.description}; {len(workload)} requests, "
             f"{sum(output_lens)} output tokens")

    # loaded once for the transformers systems, or only when a disagreement needs explaining
    get_hf_model = functools.cache(lambda: load_hf_model(model_path, args.device, args.dtype))
    runs: dict[str, SystemRun] = {}
    rows: dict[str, dict] = {}
    for index, name in enumerate(args.systems):
        print(f"[{index + 1}/{len(args.systems)}] {SYSTEMS.get(name) or PEERS[name]}")
        hf_model = get_hf_model() if name.startswith("hf-") else None
        run, peak = run_system(name, model_path, hf_model, args, prompts, output_lens, progress)
        runs[name], rows[name] = run, summarize_run(name, run, peak)

    slowest = min(r["output_throughput"] for r in rows.values())
    slowest_cpu = min((r["output_per_cpu_second"] for r in rows.values()
                       if not math.isnan(r["output_per_cpu_second"])), default=math.nan)
    reference = "hf-generate" if "hf-generate" in runs else args.systems[0]
    for name, row in rows.items():
        row["ratio_to_slowest"] = row["output_throughput"] / slowest
        row["ratio_to_slowest_cpu"] = row["output_per_cpu_second"] / slowest_cpu
        row["agreement"] = dict(
            reference=reference,
            **agreement(runs[reference].outputs, runs[name].outputs, prompts, get_hf_model))
    targets = check_targets(rows)
    print(report(rows, targets))
    payload = {"benchmark": "offline", "model": {"label": model_label,
                                                 "path": display_path(model_path),
                                                 "dtype": args.dtype, "device": args.device,
                                                 "max_model_len": args.max_model_len},
               "workload": workload_facts(workload, scale),
               "settings": {k: getattr(args, k) for k in ("max_num_seqs", "max_num_batched_tokens",
                                                          "num_kv_blocks", "block_size",
                                                          "hf_page_size", "hf_max_batch_tokens",
                                                          "seed", "threads", "attention")},
               "systems": list(rows.values()), "targets": targets}
    from minicb.viz.benchmarks import plot_offline

    stem = "-".join(["offline", workload.name] + ([args.device] if args.device != "cpu" else [])
                    + ([args.random_model] if args.random_model else [])
                    + ([f"{args.num_kv_blocks}blocks"] if args.num_kv_blocks else []))
    json_path, png_path = write_results(args.out_dir, stem, payload, plot_offline)
    print(f"results: {json_path}, {png_path}")
    return 0


def report(rows: dict[str, dict], targets: list[dict]) -> str:
    table = [dict(
        row, agree=f"{row['requests'] - row['agreement']['requests_differing']}/{row['requests']}")
             for row in rows.values()]
    text = format_table(table, [("system", "system", ""), ("output_throughput", "out tok/s", ".1f"),
                                ("ratio_to_slowest", "x slowest", ".1f"),
                                ("output_per_cpu_second", "tok/CPU-s", ".1f"),
                                ("ratio_to_slowest_cpu", "x slowest", ".1f"),
                                ("ttft_p50_s", "TTFT p50 s", ".2f"),
                                ("ttft_p95_s", "TTFT p95 s", ".2f"),
                                ("tpot_p50_ms", "TPOT p50 ms", ".1f"),
                                ("tpot_p95_ms", "TPOT p95 ms", ".1f"),
                                ("peak_memory_mb", "peak MB", ".0f"), ("agree", "greedy =ref", "")])
    for t in targets:
        if t["ratio_cpu"] is None:
            text += (f"\n{t['system']} / {t['baseline']}: {t['ratio']:.2f}x per second "
                     f"(target >= {t['target']:g}x: {'met' if t['met'] else 'NOT met'}; CPU time "
                     "of the peer not measured)")
            continue
        text += (f"\n{t['system']} / {t['baseline']}: {t['ratio']:.2f}x per second, "
                 f"{t['ratio_cpu']:.2f}x per CPU second (target >= {t['target']:g}x: "
                 f"{'met' if t['met'] else 'NOT met'} / {'met' if t['met_cpu'] else 'NOT met'})")
    return text

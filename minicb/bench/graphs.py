"""bench graphs: decode steps through CUDA graphs against eager steps, beside transformers.

On a CUDA GPU: the shipped model in float32 and a Qwen2-0.5B-shaped random-weight model in
bfloat16, the chat workload at 64 and 256 requests; per model and size, minicb eager
(enforce_eager=True) and with graphs, with and without overlapped scheduling where the engine has
it (EngineConfig.async_scheduling), alternated over --repeats; then transformers' generate_batch
(its continuous batching) and generate (left-padded batches of max_num_seqs), same requests and
weights. Every system's outputs are compared with minicb eager's, request by request. The JSON
names the device and the software versions (benchmarks/results/graphs.json).

On a CPU it refuses: there are no graphs to capture. --smoke runs a tiny configuration on the CPU
(graphs replayed without capture), so a test exercises every line of the measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from minicb.bench.common import build_random_model, display_path, load_hf_model, load_workload
from minicb.bench.harness import (
    RESULTS_DIR,
    add_flags,
    alternate,
    announce,
    bench_parser,
    spread,
    write_results,
)
from minicb.bench.machine import versions
from minicb.config import EngineConfig

MODELS = {"shipped": ("float32", None), "qwen2-0.5b": ("bfloat16", "qwen2-0.5b")}
REFUSAL = ("bench graphs measures CUDA graphs, which need a CUDA GPU, and torch sees none here "
           "(torch.cuda.is_available() is False). Run it on a GPU machine (scripts/gpu_session.sh "
           "runs it with the GPU tests), or pass --smoke for the tiny CPU configuration that "
           "checks the benchmark's code.")


@dataclass
class Case:
    """One model at one request count."""

    model: str
    dtype: str
    path: str
    num_prompts: int
    max_num_seqs: int
    max_model_len: int


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser("graphs", __doc__, full_doc=True)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--num-prompts", nargs="+", type=int, default=[64, 256])
    add_flags(p, repeats=dict(help="runs of each minicb system, alternated (transformers runs "
                                   "once)"))
    p.add_argument("--max-model-len", type=int, default=1024,
                   help="capped at each model's context (the shipped model's is 512)")
    p.add_argument("--no-hf", action="store_true", help="leave transformers' systems out")
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("--smoke", action="store_true",
                   help="a tiny CPU run (shipped model, 4 requests, 1 repeat, graphs replayed "
                        "without capture): checks the code, measures nothing")
    return p.parse_args(argv)


def minicb_systems() -> dict[str, dict]:
    """The engine's variants: graphs off and on, and each with overlapped scheduling where the
    engine has it."""
    systems = {"minicb-eager": dict(enforce_eager=True), "minicb-graphs": dict(enforce_eager=False)}
    if "async_scheduling" in {f.name for f in fields(EngineConfig)}:
        systems["minicb-overlap"] = dict(enforce_eager=True, async_scheduling=True)
        systems["minicb-graphs-overlap"] = dict(enforce_eager=False, async_scheduling=True)
    return systems


def run_minicb(case: Case, knobs: dict, prompts, output_lens, device: str, smoke: bool) -> dict:
    from minicb import LLM, SamplingParams

    replay = smoke and not knobs["enforce_eager"]      # a CPU has no graphs: replay the path
    started = time.perf_counter()
    llm = LLM(case.path, device=device, dtype=case.dtype,
              attention="triton" if device == "cuda" else "torch",
              max_num_seqs=case.max_num_seqs, max_model_len=case.max_model_len,
              **dict(knobs, enforce_eager=knobs["enforce_eager"] or replay))
    runner = llm.llm_engine.runner
    if replay:
        runner.use_cuda_graphs(capture=False)
    start_seconds = time.perf_counter() - started      # load, KV pool and capture
    llm.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                 use_tqdm=False)                       # warm-up
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in output_lens]
    if device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - began
    graphs = runner.graphs
    return dict(outputs=[r.outputs[0].token_ids for r in results], wall_s=wall,
                start_s=start_seconds, graph_steps=graphs.replays if graphs else 0,
                captured_sizes=sorted(graphs.graphs) if graphs and graphs.capture else [])


def run_hf(name: str, case: Case, hf_model, prompts, output_lens) -> dict:
    from minicb.bench.peers import hf_continuous, hf_static_batches

    pad = hf_model.generation_config.pad_token_id or 0
    began = time.perf_counter()
    if name == "hf-generate-batch":
        run = hf_continuous(hf_model, prompts, output_lens, pad, case.max_num_seqs,
                            max_batch_tokens=2048,
                            kv_tokens=case.max_num_seqs * case.max_model_len)
    else:
        run = hf_static_batches(hf_model, prompts, output_lens, pad, case.max_num_seqs)
    return dict(outputs=run.outputs, wall_s=time.perf_counter() - began, settings=run.settings)


def summarize(name: str, runs: list[dict], reference: list[list[int]], output_tokens: int) -> dict:
    """tokens/s per repeat (median and range) and how many requests equal minicb eager's."""
    rates = [output_tokens / r["wall_s"] for r in runs]
    same = [sum(a == b for a, b in zip(r["outputs"], reference)) for r in runs]
    rate = spread(rates)
    row = dict(system=name, repeats=len(runs), output_tokens=output_tokens,
               tokens_per_s=rate["median"], tokens_per_s_min=rate["min"],
               tokens_per_s_max=rate["max"], requests_equal_to_eager=min(same),
               requests=len(reference))
    for key in ("start_s", "graph_steps", "captured_sizes", "settings"):
        if key in runs[0]:
            row[key] = runs[0][key]
    return row


def measure(case: Case, device: str, repeats: int, with_hf: bool, smoke: bool) -> dict:
    workload = load_workload("chat", case.num_prompts)
    vocab = json.loads((Path(case.path) / "config.json").read_text())["vocab_size"]
    prompts, output_lens = workload.prompt_token_ids(vocab, seed=0), workload.output_lens
    if smoke:
        output_lens = [min(n, 6) for n in output_lens]
    systems = minicb_systems()
    runs: dict[str, list[dict]] = {name: [] for name in systems}
    for _, name in alternate(repeats, list(systems)):   # a slow spell hits every system
        runs[name].append(run_minicb(case, systems[name], prompts, output_lens, device, smoke))
        print(f"  {name}: {sum(output_lens) / runs[name][-1]['wall_s']:,.0f} tokens/s")
    if with_hf:
        hf_model = load_hf_model(case.path, device, case.dtype)
        for name in ("hf-generate-batch", "hf-generate"):
            runs[name] = [run_hf(name, case, hf_model, prompts, output_lens)]
            print(f"  {name}: {sum(output_lens) / runs[name][-1]['wall_s']:,.0f} tokens/s")
        del hf_model
    reference = runs["minicb-eager"][0]["outputs"]
    rows = [summarize(name, r, reference, sum(output_lens)) for name, r in runs.items()]
    eager = rows[0]["tokens_per_s"]
    for row in rows:
        row["ratio_to_eager"] = row["tokens_per_s"] / eager
    return dict(model=case.model, dtype=case.dtype, path=display_path(case.path),
                num_prompts=case.num_prompts, max_num_seqs=case.max_num_seqs,
                workload=workload.description, systems=rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    if not args.smoke and not torch.cuda.is_available():
        print(REFUSAL, file=sys.stderr)
        return 2
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.models, args.num_prompts, args.repeats, args.max_model_len = ["shipped"], [4], 1, 256
    announce()
    cases = []
    for model in args.models:
        dtype, random_name = MODELS[model]
        if random_name is None:
            from minicb.model.loader import resolve_model_path

            path = str(resolve_model_path(None))
        else:
            path = build_random_model(random_name, tempfile.mkdtemp(prefix="minicb-graphs-"),
                                      dtype)
        context = json.loads((Path(path) / "config.json").read_text())["max_position_embeddings"]
        for n in args.num_prompts:
            case = Case(model, dtype, path, n, min(n, 256), min(args.max_model_len, context))
            print(f"{model} ({dtype}), {n} chat requests")
            cases.append(measure(case, device, args.repeats, not args.no_hf, args.smoke))
            # written after every case: a run cut short by a time limit keeps what it measured
            written = write_payload(args, device, cases)
            print(f"wrote {written}")
    return 0


def markdown_table(payload: dict) -> str:
    """The record as the pages show it: per model and request count, each system's tokens/s
    (median, min-max over its repeats), its ratio to minicb eager's median, and how many requests
    gave eager's tokens. Chapter 10 and benchmarks/gpu.md render graphs.json with it."""
    lines = []
    for case in payload["cases"]:
        lines += [f"**{case['model']}** ({case['dtype']}), {case['num_prompts']} chat requests, "
                  f"{payload['device_name']}:", "",
                  "| system | tokens/s (min-max) | x eager | requests equal to eager |",
                  "|---|---:|---:|---:|"]
        lines += [f"| {row['system']} | {row['tokens_per_s']:,.0f} "
                  f"({row['tokens_per_s_min']:,.0f}-{row['tokens_per_s_max']:,.0f}) | "
                  f"{row['ratio_to_eager']:.2f} | "
                  f"{row['requests_equal_to_eager']} of {row['requests']} |"
                  for row in case["systems"]]
        lines.append("")
    return "\n".join(lines).rstrip()


def write_payload(args: argparse.Namespace, device: str, cases: list[dict]) -> Path:
    payload = dict(benchmark="graphs", smoke=args.smoke,
                   device_name=(torch.cuda.get_device_name() if device == "cuda" else "cpu"),
                   software=dict(torch=torch.__version__, cuda=torch.version.cuda,
                                 **{k: versions()[k] for k in ("triton", "transformers")}),
                   cases=cases)
    path, _ = write_results(args.out, "graphs-smoke" if args.smoke else "graphs", payload)
    return path

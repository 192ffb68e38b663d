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
each server's median and its range over the repeats, and calls a difference between two servers
only when their ranges do not overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import httpx

from minicb.bench import vllm_peer
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
    repeats: int = 3
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


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    process: subprocess.Popen | None = None
    log: IO[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def server_for(name: str, port: int, config: PeerConfig) -> Server:
    """The command line that serves the shipped model as `name` on `port`."""
    from minicb.model.default import default_model_path

    if name in ("naive", "continuous"):
        return Server(name, [sys.executable, "-m", "minicb", "serve", "--scheduler", name,
                             "--port", str(port), "--max-num-seqs", str(config.max_num_seqs),
                             "--served-model-name", SERVED_MODEL_NAME, "--log-level", "warning"],
                      port)
    if name == "vllm":
        vllm_peer.check_available()
        env = vllm_peer.environment()
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.vllm_kv_cache_gib)
        # the module entry point: `vllm serve` does not start from the vllm-cpu distribution
        return Server(name, [str(vllm_peer.LAUNCHER), "-m", "vllm.entrypoints.openai.api_server",
                             "--port", str(port), "--dtype", "float32",
                             "--max-model-len", str(config.max_model_len),
                             "--max-num-seqs", str(config.max_num_seqs),
                             "--served-model-name", SERVED_MODEL_NAME,
                             "--model", str(default_model_path()),
                             # no line per request, as minicb's servers at --log-level warning
                             "--disable-log-stats", "--disable-uvicorn-access-log"], port, env)
    raise ValueError(f"unknown server {name!r}; choose from {SERVERS}.")


def start(server: Server, cpus: tuple[int, ...], log_dir: Path, timeout: float = 600) -> None:
    """Start the server pinned to `cpus` and wait until it lists its model."""
    with socket.socket() as probe:   # another server on the port would answer in its place
        if probe.connect_ex(("127.0.0.1", server.port)) == 0:
            raise RuntimeError(f"port {server.port} is already in use; pick free ones with "
                               "--base-port.")
    server.log = open(log_dir / f"{server.name}.log", "w")
    server.process = subprocess.Popen(server.argv, env=server.env, stdout=server.log,
                                      stderr=subprocess.STDOUT,
                                      preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = "\n".join((log_dir / f"{server.name}.log").read_text().splitlines()[-15:])
            raise RuntimeError(f"the {server.name} server exited with {server.process.returncode} "
                               f"before it served:\n{tail}")
        try:
            if httpx.get(f"{server.url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(server)
    raise RuntimeError(f"the {server.name} server did not answer within {timeout:.0f} s "
                       f"(its log: {log_dir / server.name}.log).")


def stop(server: Server) -> None:
    if server.process is not None and server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    if server.log is not None:
        server.log.close()


def measure(server: Server, rate: float, config: PeerConfig) -> dict:
    """One run of the workload at `rate` against a running server: its row, its errors and the
    load average (1 minute) before and after."""
    bench = BenchConfig(server.url, model=SERVED_MODEL_NAME, num_prompts=config.num_prompts,
                        request_rate=rate, input_len=config.input_len,
                        output_len=config.output_len, range_ratio=config.range_ratio,
                        prompt_format="tokens", vocab_size=vocab_size_of(None),
                        ignore_eos=True, seed=config.seed, disable_tqdm=True)
    load_before = os.getloadavg()[0]
    result = benchmark(bench)
    load_after = os.getloadavg()[0]
    errors = sorted({e for e in result["errors"] if e})
    return {**latency_row(server.name, rate, result), "server": server.name,
            "output_tokens": result["total_output_tokens"], "errors": errors,
            "load_before": load_before, "load_after": load_after}


def run_alternated(servers: list[Server], config: PeerConfig, progress: bool = False) -> list[dict]:
    """Every repeat, every rate, every server in turn (naive, continuous, vLLM, naive, ...)."""
    runs = []
    for repeat in range(config.repeats):
        for rate in config.request_rates:
            for server in servers:
                run = {"repeat": repeat, **measure(server, rate, config)}
                runs.append(run)
                if progress:
                    print(f"repeat {repeat} rate {rate:g}/s {server.name:>10}: "
                          f"{run['completed']}/{config.num_prompts} done, "
                          f"{run['output_throughput']:.0f} tok/s, "
                          f"TTFT p95 {run['ttft_p95_s']:.3f} s, load {run['load_before']:.1f}"
                          f"->{run['load_after']:.1f}", flush=True)
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
        for metric in METRICS:
            values = [r[metric] for r in mine]
            row[metric] = {"median": statistics.median(values), "min": min(values),
                           "max": max(values)}
        rows.append(row)
    return rows


# fewer repeats give no verdict: two runs that happen to agree say little on a shared machine
MIN_REPEATS = 3


def compare(a: dict, b: dict, repeats: int) -> str:
    """'higher', 'lower' or 'within the spread': a's range of values against b's (two summaries'
    entries for one metric, over `repeats` repeats each at least). Only ranges that do not overlap
    make a verdict."""
    if repeats < MIN_REPEATS:
        return f"no verdict: fewer than {MIN_REPEATS} repeats"
    if a["min"] > b["max"]:
        return "higher"
    if a["max"] < b["min"]:
        return "lower"
    return "within the spread"


def verdicts(summary: list[dict], first: str, second: str) -> list[dict]:
    """At each rate both served: first ÷ second (medians) for throughput and p95 TTFT, and
    whether each difference lies outside the repeats' spread."""
    by = {(r["server"], r["request_rate"]): r for r in summary}
    out = []
    for rate in sorted({rate for name, rate in by if name == first}):
        if (second, rate) not in by:
            continue
        a, b = by[first, rate], by[second, rate]
        repeats = min(a["repeats"], b["repeats"])
        out.append({"request_rate": rate, "pair": f"{first} vs {second}",
                    "throughput_ratio": a["output_throughput"]["median"]
                    / b["output_throughput"]["median"],
                    "throughput": compare(a["output_throughput"], b["output_throughput"], repeats),
                    "ttft_p95_ratio": a["ttft_p95_s"]["median"] / b["ttft_p95_s"]["median"],
                    "ttft_p95": compare(a["ttft_p95_s"], b["ttft_p95_s"], repeats)})
    return out


def format_summary(summary: list[dict]) -> str:
    """A markdown table (the form benchmarks/serving.md quotes): each metric's median over the
    repeats with its range in brackets."""
    spread = lambda m, f: f"{f.format(m['median'])} ({f.format(m['min'])}–{f.format(m['max'])})"
    lines = ["| rate (req/s) | server | repeats | failed | load avg | out tok/s | TTFT p50 (s) "
             "| TTFT p95 (s) | TPOT p50 (ms) |", "|---:|---|---:|---:|---|---|---|---|---|"]
    for r in sorted(summary, key=lambda r: r["request_rate"]):
        lines.append(f"| {r['request_rate']:g} | {r['server']} | {r['repeats']} | {r['failed']} | "
                     f"{r['load_min']:.1f}–{r['load_max']:.1f} | "
                     f"{spread(r['output_throughput'], '{:.0f}')} | "
                     f"{spread(r['ttft_p50_s'], '{:.3f}')} | {spread(r['ttft_p95_s'], '{:.3f}')} | "
                     f"{spread(r['tpot_p50_ms'], '{:.1f}')} |")
    return "\n".join(lines)


def run_study(config: PeerConfig, log_dir: Path, progress: bool = False) -> dict:
    """Start every server, measure them alternated, stop them; the record the JSON holds."""
    cpus = config.cpus or tuple(sorted(os.sched_getaffinity(0)))
    servers = [server_for(name, config.base_port + i, config)
               for i, name in enumerate(config.servers)]
    started = time.perf_counter()
    try:
        for server in servers:          # one at a time: two start-ups at once would slow both
            start(server, cpus, log_dir)
            warm_up(server.url, SERVED_MODEL_NAME)
        runs = run_alternated(servers, config, progress)
    finally:
        for server in servers:
            stop(server)
    summary = summarize(runs)
    pairs = [(a, b) for a, b in (("continuous", "naive"), ("continuous", "vllm"),
                                 ("vllm", "naive")) if a in config.servers and b in config.servers]
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "model": "default (shipped)", "config": {**asdict(config), "cpus": list(cpus)},
            "commands": {s.name: [Path(a).name if os.path.isabs(a) else a for a in s.argv]
                         for s in servers},
            "vllm_version": _vllm_version() if "vllm" in config.servers else None,
            "wall_time_s": time.perf_counter() - started, "runs": runs, "summary": summary,
            "verdicts": [v for a, b in pairs for v in verdicts(summary, a, b)]}


def _vllm_version() -> str:
    done = subprocess.run([str(vllm_peer.LAUNCHER), "-c", "import vllm; print(vllm.__version__)"],
                          capture_output=True, text=True, env=vllm_peer.environment())
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicb bench serve-peers",
                                     description=__doc__.split("\n\n")[0])
    defaults = PeerConfig()
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--request-rates", nargs="+", type=float,
                        default=list(defaults.request_rates))
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--num-prompts", type=int, default=defaults.num_prompts)
    parser.add_argument("--input-len", type=int, default=defaults.input_len)
    parser.add_argument("--output-len", type=int, default=defaults.output_len)
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--cpus", nargs="+", type=int, default=None,
                        help="cores to pin every server to (default: all this process may use)")
    parser.add_argument("--base-port", type=int, default=defaults.base_port)
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--name", default="serve-peers", help="results: NAME.json and NAME.png")
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
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="minicb-serve-peers-"))
    print(f"machine: {machine_line()}; load average {os.getloadavg()[0]:.1f}; server logs in "
          f"{log_dir}\n")
    record = run_study(config, log_dir, progress=True)
    (out_dir / f"{args.name}.json").write_text(json.dumps(record, indent=1))
    from minicb.viz.serving import peer_load_plot

    peer_load_plot(record["summary"]).savefig(out_dir / f"{args.name}.png")
    print("\n" + format_summary(record["summary"]) + "\n")
    for verdict in record["verdicts"]:
        print(f"{verdict['request_rate']:g}/s {verdict['pair']}: throughput "
              f"{verdict['throughput_ratio']:.2f}x ({verdict['throughput']}), p95 TTFT "
              f"{verdict['ttft_p95_ratio']:.2f}x ({verdict['ttft_p95']})")
    print(f"\nresults: {out_dir / args.name}.json and .png ({record['wall_time_s']:.0f} s)")
    return 0 if all(not r["failed"] for r in record["runs"]) else 1

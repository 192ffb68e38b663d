"""Load-test any OpenAI-compatible server: timed arrivals, streamed responses, latency percentiles.

    python -m minicb bench serve --base-url http://127.0.0.1:8000 --num-prompts 200 \
        --request-rate 4 --burstiness 1.0 --max-concurrency 64 --goodput ttft:500 tpot:50

The metrics follow vLLM's serving benchmark, so numbers compare with it: TTFT is send → first
streamed chunk; TPOT is (last token − first token) / (output tokens − 1), the first token left
out; ITL is every gap between streamed chunks; E2E is send → last token; goodput counts the
requests per second that met every SLO given. Only standard fields are used (token counts come
from `usage`, asked for with stream_options.include_usage), so vLLM, SGLang, TGI or minicb
can be measured alike; `ignore_eos` (to force output lengths) is sent only when asked for.
With MINICB_API_KEY set, its (first) key goes with every request as `Authorization: Bearer`; it
is read from the environment, never written into the results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
from tqdm.auto import tqdm

from minicb.metrics import RequestMetrics, Summary, summarize
from minicb.serving.auth import bearer, client_key
from minicb.sim.workload import (
    Workload,
    fixed,
    gamma_arrivals,
    get_workload,
    prefix_texts,
    uniform_lengths,
)
from minicb.viz.base import new_figure

# text prompts are drawn from these words (about one token each for a code-trained tokenizer)
PROMPT_WORDS = ("def return import self for in if else class None True False while with as try "
                "except raise yield lambda print range len list dict value key index result data "
                "name path file line text item count total size").split()
# minicb workloads that take a size
SIZED_WORKLOADS = ("chat", "long-tail", "mixed", "prefix-heavy")


@dataclass
class BenchConfig:
    base_url: str
    endpoint: str = "/v1/completions"
    model: str | None = None               # None: the first model GET /v1/models lists
    num_prompts: int = 64
    request_rate: float = math.inf          # requests per second; inf sends all at once
    # 1 = Poisson; < 1 burstier, > 1 more regular (Gamma gaps)
    burstiness: float = 1.0
    max_concurrency: int | None = None
    # "random" (input/output lengths below) or SIZED_WORKLOADS
    workload: str = "random"
    workload_options: dict = field(default_factory=dict)   # the sized workload's own knobs
    input_len: int = 64
    output_len: int = 64
    range_ratio: float = 0.0                # random lengths in [len·(1−r), len·(1+r)]
    prompt_format: str = "text"             # "text" (any server) or "tokens" (random token ids)
    vocab_size: int = 512                   # for prompt_format="tokens"
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int = 0
    goodput: dict[str, float] = field(default_factory=dict)   # {"ttft": ms, "tpot": ms}
    disable_tqdm: bool = False


@dataclass
class RequestResult:
    success: bool
    send_time: float
    chunk_times: list[float] = field(default_factory=list)
    end_time: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    text: str = ""
    error: str = ""

    def metrics(self) -> RequestMetrics:
        """The client's view as the engine's RequestMetrics, so minicb.metrics summarises it."""
        first = self.chunk_times[0] if self.chunk_times else None
        last = self.chunk_times[-1] if self.chunk_times else None
        return RequestMetrics(arrival_time=self.send_time, first_scheduled_time=None,
                              first_token_time=first, last_token_time=last,
                              finished_time=self.end_time, token_times=list(self.chunk_times),
                              arrival_step=0, first_scheduled_step=None, first_token_step=None,
                              finished_step=None, token_steps=[],
                              num_prompt_tokens=self.prompt_tokens,
                              num_output_tokens=self.output_tokens)


def make_workload(config: BenchConfig) -> Workload:
    if config.workload != "random":
        return get_workload(config.workload, n=config.num_prompts, seed=config.seed,
                            **config.workload_options)

    def lengths(mean: int, seed: int) -> list[int]:
        low, high = max(1, int(mean * (1 - config.range_ratio))), int(
            mean * (1 + config.range_ratio))
        return uniform_lengths(config.num_prompts, low, max(low, high), seed)

    prompt_lens = lengths(config.input_len, config.seed)
    return fixed("random", prompt_lens, lengths(config.output_len, config.seed + 1))


def make_prompts(workload: Workload, config: BenchConfig) -> list[str] | list[list[int]]:
    if "turns" in workload.extra:           # prefix-heavy: shared system prompts, multi-turn chats
        return prefix_texts(workload, PROMPT_WORDS)
    if config.prompt_format == "tokens":
        return workload.prompt_token_ids(config.vocab_size, config.seed)
    rng = np.random.default_rng(config.seed)
    return [" ".join(rng.choice(PROMPT_WORDS, n)) for n in workload.prompt_lens]


def _payload(config: BenchConfig, model: str, prompt, max_tokens: int) -> dict:
    payload = {"model": model, "max_tokens": max_tokens, "temperature": config.temperature,
               "stream": True, "stream_options": {"include_usage": True}}
    if config.endpoint.endswith("chat/completions"):
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    if config.ignore_eos:
        payload["ignore_eos"] = True
    return payload


async def send_request(client: httpx.AsyncClient, url: str, payload: dict) -> RequestResult:
    """One streamed request; every chunk carrying `choices` counts as a token event (as vLLM's)."""
    result = RequestResult(False, time.perf_counter())
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                result.error = (f"HTTP {response.status_code}: "
                                f"{(await response.aread()).decode()[:300]}")
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:       # the server gave up mid-stream
                    result.error = str(chunk["error"])[:300]
                    return result
                if chunk.get("choices"):
                    result.chunk_times.append(time.perf_counter())
                    first = chunk["choices"][0]
                    result.text += (first.get("text") or (first.get("delta") or {}).get("content")
                                    or "")
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
        result.end_time = time.perf_counter()
        # a server without usage
        result.output_tokens = result.output_tokens or len(result.chunk_times)
        result.success = bool(result.chunk_times)
        result.error = "" if result.success else "the stream carried no tokens"
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


async def first_model(client: httpx.AsyncClient, base_url: str) -> str:
    response = await client.get(f"{base_url}/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def run_benchmark(config: BenchConfig) -> dict:
    """Send the workload at its arrival times; return the results as a JSON-ready dict."""
    workload = make_workload(config)
    prompts = make_prompts(workload, config)
    arrivals = gamma_arrivals(len(prompts), config.request_rate, config.burstiness, config.seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits,
                                 headers=bearer(client_key())) as client:
        model = config.model or await first_model(client, config.base_url)
        url = config.base_url.rstrip("/") + config.endpoint
        gate = asyncio.Semaphore(config.max_concurrency or len(prompts))
        # disable=None: tqdm draws no bar when the output is not a terminal (a log, a pipe),
        # where each redraw would be a line of its own
        bar = tqdm(total=len(prompts), desc="requests", disable=True if config.disable_tqdm
                   else None)

        async def one(prompt, max_tokens: int) -> RequestResult:
            async with gate:
                result = await send_request(client, url,
                                            _payload(config, model, prompt, max_tokens))
            bar.update(1)
            return result

        start, tasks = time.perf_counter(), []
        for prompt, max_tokens, arrival in zip(prompts, workload.output_lens, arrivals):
            await asyncio.sleep(max(0.0, start + arrival - time.perf_counter()))
            tasks.append(asyncio.create_task(one(prompt, max_tokens)))
        results = await asyncio.gather(*tasks)
        bar.close()
    return collect(config, model, results, start)


def benchmark(config: BenchConfig) -> dict:
    """run_benchmark from synchronous code, a Jupyter cell included: a cell already runs inside an
    event loop, where asyncio.run refuses to start, so there it runs on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_benchmark(config))
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_benchmark(config)).result()


def collect(config: BenchConfig, model: str, results: list[RequestResult], started: float) -> dict:
    """Summarise the successful requests; `started` is when the benchmark began (perf_counter)."""
    done = [r for r in results if r.success]
    slo = {k: v / 1000 for k, v in config.goodput.items()}
    summary: Summary | None = summarize([r.metrics() for r in done], slo_ttft=slo.get("ttft"),
                                        slo_tpot=slo.get("tpot")) if done else None
    to_ms = lambda stats: {k: v * 1000 for k, v in stats.items()}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "model": model, "config": asdict(config),
        "completed": len(done), "failed": len(results) - len(done),
        "wall_time_s": time.perf_counter() - started,
        "duration_s": summary.duration if summary else None,
        "request_throughput": summary.request_throughput if summary else 0.0,
        "output_throughput": summary.output_throughput if summary else 0.0,
        "total_token_throughput": summary.total_token_throughput if summary else 0.0,
        "goodput": summary.goodput if summary else None,
        "total_input_tokens": sum(r.prompt_tokens for r in done),
        "total_output_tokens": sum(r.output_tokens for r in done),
        **{f"{name}_ms": to_ms(getattr(summary, name)) if summary else None
           for name in ("ttft", "tpot", "itl", "e2e")},
        "send_times": [r.send_time - started for r in results],   # seconds after the start
        "ttfts": [r.metrics().ttft for r in results],
        "tpots": [r.metrics().tpot for r in results],
        "e2els": [r.metrics().e2e if r.success else None for r in results],
        "input_lens": [r.prompt_tokens for r in results], "output_lens": [
            r.output_tokens for r in results],
        "errors": [r.error for r in results],
    }


def format_results(result: dict) -> str:
    rows = [("Successful requests", result["completed"]), ("Failed requests", result["failed"]),
            ("Benchmark duration (s)", result["duration_s"]),
            ("Total input tokens", result["total_input_tokens"]),
            ("Total generated tokens", result["total_output_tokens"]),
            ("Request throughput (req/s)", result["request_throughput"]),
            ("Output token throughput (tok/s)", result["output_throughput"]),
            ("Total token throughput (tok/s)", result["total_token_throughput"])]
    if result["goodput"] is not None:
        rows.append(("Request goodput (req/s)", result["goodput"]))
    for name, title in (("ttft", "Time to First Token"),
                        ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2e", "End-to-end Latency")):
        stats = result[f"{name}_ms"] or {}
        rows.append((f"-- {title} --", ""))
        rows += [(f"{'Median' if key == 'p50' else key.capitalize()} {name.upper()} (ms)", value)
                 for key, value in stats.items()]
    lines = ["=" * 18 + " Serving Benchmark Result " + "=" * 18]
    for label, value in rows:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<44}{text:>18}" if value != "" else f"{label:^62}")
    return "\n".join(lines + ["=" * 62])


def plot(result: dict, path: Path | None = None):
    """Latency of every request against when it was sent, and the CDFs of TTFT and TPOT."""
    sent = np.array(result["send_times"])
    ttft = np.array([np.nan if v is None else v for v in result["ttfts"]], dtype=float)
    e2e = np.array([np.nan if v is None else v for v in result["e2els"]], dtype=float)
    tpot = np.array([v for v in result["tpots"] if v is not None], dtype=float)
    fig, (left, right) = new_figure(11, 4, cols=2)
    left.scatter(sent, e2e, s=10, label="end-to-end")
    left.scatter(sent, ttft, s=10, label="time to first token")
    left.set(xlabel="request sent at (s)", ylabel="seconds", title="latency per request")
    left.legend()
    for values, label in ((ttft[~np.isnan(ttft)], "TTFT"), (tpot, "TPOT")):
        if values.size:
            right.plot(np.sort(values) * 1000, np.linspace(0, 1, values.size), label=label)
    right.set(xscale="log", xlabel="milliseconds", ylabel="fraction of requests",
              title="latency CDF")
    right.legend()
    rate = result["config"]["request_rate"]
    fig.suptitle(f"{result['model']}: {result['completed']} requests at rate {rate}/s, "
                 f"{result['output_throughput']:.0f} output tok/s")
    if path is not None:
        fig.savefig(path)
    return fig


def parse_goodput(items: list[str]) -> dict[str, float]:
    slo = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot") or not value:
            raise ValueError(f"--goodput takes ttft:MS and/or tpot:MS (got {item!r}).")
        slo[name] = float(value)
    return slo


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicb bench serve",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=_HelpWithDefaults)
    defaults = BenchConfig("")
    add = parser.add_argument
    add("--base-url", default="http://127.0.0.1:8000", help="the server to measure")
    add("--endpoint", default=defaults.endpoint,
        help="/v1/completions or /v1/chat/completions")
    add("--model", default=None, help="the model name to send (default: the first one the "
        "server's GET /v1/models lists)")
    add("--num-prompts", type=int, default=defaults.num_prompts, help="requests to send")
    add("--request-rate", type=float, default=defaults.request_rate,
        help="requests per second on average; inf sends them all at once")
    add("--burstiness", type=float, default=defaults.burstiness,
        help="the gaps' Gamma shape: 1 is Poisson, below 1 burstier, above 1 more regular")
    add("--max-concurrency", type=int, default=None,
        help="requests in flight at most (default: no cap)")
    add("--workload", choices=["random", *SIZED_WORKLOADS], default="random",
        help="random: lengths from --input-len/--output-len; the others: minicb's seeded "
        "workloads (minicb.sim.workload)")
    add("--input-len", type=int, default=defaults.input_len,
        help="prompt length (words or token ids) for --workload random")
    add("--output-len", type=int, default=defaults.output_len,
        help="max_tokens per request for --workload random")
    add("--range-ratio", type=float, default=defaults.range_ratio,
        help="random lengths uniform in [len*(1-r), len*(1+r)]")
    add("--prompt-format", choices=["text", "tokens"], default=defaults.prompt_format,
        help="text (any server) or random token ids (servers that take them)")
    add("--vocab-size", type=int, default=defaults.vocab_size,
        help="token ids are drawn below this, for --prompt-format tokens")
    add("--ignore-eos", action="store_true",
        help="force output lengths (an extension vLLM, SGLang and minicb accept)")
    add("--temperature", type=float, default=defaults.temperature, help="0 is greedy")
    add("--seed", type=int, default=defaults.seed, help="seeds the prompts and the arrivals")
    add("--goodput", nargs="*", default=[], metavar="NAME:MS",
        help="SLOs a request must meet to count in goodput: ttft:MS tpot:MS")
    add("--out-dir", default=None, help="write NAME.json (every request's latencies and the "
        "summary) and NAME.png here (default: print the summary, write nothing)")
    add("--result-name", default="bench-serve", help="NAME of the files --out-dir writes")
    add("--no-plot", action="store_true", help="with --out-dir, write the JSON only")
    add("--disable-tqdm", action="store_true", help="no progress bar (there is none anyway "
        "when the output is not a terminal)")
    args = parser.parse_args(argv)
    try:
        goodput = parse_goodput(args.goodput)
    except ValueError as error:
        parser.error(str(error))
    options = {k: v for k, v in vars(args).items()
               if k not in ("goodput", "out_dir", "result_name", "no_plot")}
    config = BenchConfig(goodput=goodput, **options)
    result = benchmark(config)
    print(format_results(result))
    if args.out_dir is not None:
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        json_path = out_dir / f"{args.result_name}.json"
        json_path.write_text(json.dumps(result, indent=1, default=float))
        print(f"results: {json_path}")
        if not args.no_plot:
            plot(result, out_dir / f"{args.result_name}.png")
            print(f"plot: {out_dir / (args.result_name + '.png')}")
    return 0 if result["completed"] else 1

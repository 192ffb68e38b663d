"""`python -m minicb bench overhead`: the host's part of a decode step.

    python -m minicb bench overhead [--batch-sizes 1 64 256] [--repeats 3] [--steps 50]

A decode step is the model's forward plus everything the host does around it: schedule, pack
the batch, sample, apply the tokens (update), count the step and build the outputs. On a GPU the
forward shrinks a hundredfold and the host's part becomes most of the step, so it is measured
with a model that costs almost nothing: a random Llama of one layer and hidden size 64
(`llama-tiny`), every row a greedy decode of a 128-token prompt.

Per decode step, the CPU time of the stepping thread (one torch thread, so the forward runs on
it too): the whole `engine.step()` and the model's forward inside it; the host's part is the
step less the forward. The host's phases are clocked in a second run of as many steps: a clock
costs about two microseconds a call (two reads of the thread's CPU time, which on this VM are
system calls), so the host's part is measured with the forward's clock alone. Each batch size
is measured `--repeats` times, the order of the sizes alternating between repeats, with the
load average beside each point.

`--baseline COMMIT` measures an earlier commit beside this tree, each by its own benchmark:
`git archive COMMIT` is unpacked into a scratch directory and that tree's `python -m minicb bench
overhead` runs there, in a fresh process, one repeat at a time, alternated with this tree's (in
a fresh process too: a process that built earlier points' engines steps slower). Each tree
measures itself as its code then did, so this file never carries an earlier engine's API.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from minicb.bench.common import display_path, resolve_model
from minicb.bench.harness import (
    add_flags,
    bench_parser,
    format_table,
    spread,
    turn_order,
    write_results,
)

ROOT = Path(__file__).resolve().parents[2]

# the host's part of a decode step this engine aims for on the project's 2-core CPU, in µs
TARGET_HOST_US = {1: 60.0, 256: 1000.0}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser("overhead", __doc__)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--context", type=int, default=128, help="prompt tokens of every request")
    p.add_argument("--steps", type=int, default=50, help="decode steps measured per point")
    add_flags(p, "repeats", "random_model", "out_dir", random_model="llama-tiny",
              model=dict(help="a checkpoint instead of the random one"))
    p.add_argument("--stem", default="overhead", help="the result files' name")
    p.add_argument("--baseline", default=None, metavar="COMMIT",
                   help="also measure COMMIT by its own benchmark, alternating with this tree")
    return p.parse_args(argv)


class PhaseClock:
    """Wraps methods of live objects so every call adds the stepping thread's CPU time to a named
    phase (CPU time, not the wall clock: neighbours holding the cores do not count)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner, method: str, phase: str) -> None:
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.thread_time() - start

        setattr(owner, method, timed)


PHASES = ("schedule", "prepare", "forward", "sample", "update")


def host_step(model_path: str, batch: int, context: int, steps: int) -> dict:
    """Medians over `steps` decode steps of `batch` rows, in µs: the step, the forward, the
    host's part (the step less the forward) and the mean of each phase."""
    from minicb import LLM, SamplingParams

    budget = max(2048, batch)
    # long enough that no request finishes before the last timed step: the first prompts decode
    # while the last ones still prefill
    max_tokens = 2 * steps + 8 + -(-batch * context // budget)
    llm = LLM(model_path, scheduler="continuous", kv_cache="paged", max_num_seqs=batch,
              max_num_batched_tokens=budget, max_model_len=context + max_tokens, cpu_threads=1)
    engine = llm.llm_engine
    vocab = engine.vocab_size
    for index in range(batch):
        prompt = [(7 * index + 3 * j) % (vocab - 3) + 3 for j in range(context)]
        engine.add_request(str(index), prompt,
                           SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                           stream=False)      # as LLM.generate adds them: reported once, finished
    while any(r.is_prefilling for r in engine.scheduler.waiting + engine.scheduler.running):
        engine.step()
    for _ in range(3):          # warm-up decode steps
        engine.step()
    clock = PhaseClock()
    # the forward: the runner's, which picks the fused CPU decode layer or the model
    clock.wrap(engine.runner, "forward", "forward")
    step_s, forward_s, host_s, wall_s = [], [], [], []
    for _ in range(steps):
        forward_before = clock.seconds["forward"]
        start, wall_start = time.thread_time(), time.perf_counter()
        engine.step()
        step = time.thread_time() - start
        wall_s.append(time.perf_counter() - wall_start)
        forward = clock.seconds["forward"] - forward_before
        step_s.append(step)
        forward_s.append(forward)
        host_s.append(step - forward)
    # the second run: every phase clocked, for where the time goes
    for owner, method in [(engine.scheduler, "schedule"), (engine.scheduler, "update"),
                          (engine.runner, "prepare"), (engine.runner, "sample")]:
        clock.wrap(owner, method, method)
    clock.seconds.clear()
    clocked_s = []
    for _ in range(steps):
        start = time.thread_time()
        engine.step()
        clocked_s.append(time.thread_time() - start)
    assert engine.scheduler.num_running == batch, "every row decoded through every timed step"
    mean_us = {phase: 1e6 * clock.seconds[phase] / steps for phase in PHASES}
    mean_us["rest"] = 1e6 * statistics.mean(clocked_s) - sum(mean_us.values())
    return {"batch": batch, "host_us": 1e6 * statistics.median(host_s),
            "step_us": 1e6 * statistics.median(step_s),
            "forward_us": 1e6 * statistics.median(forward_s),
            "wall_step_us": 1e6 * statistics.median(wall_s), "phases_mean_us": mean_us,
            "load_average": list(os.getloadavg())}


def summarize(points: list[dict], batch_sizes: list[int]) -> list[dict]:
    """Per batch size: the host's part over the repeats (median, spread) against its target."""
    rows = []
    for batch in batch_sizes:
        mine = [p for p in points if p["batch"] == batch]
        host = [p["host_us"] for p in mine]
        target = TARGET_HOST_US.get(batch)
        rows.append({"batch": batch,
                     **{f"host_us_{k}": v for k, v in spread(host).items()},
                     "step_us_median": statistics.median(p["step_us"] for p in mine),
                     "forward_us_median": statistics.median(p["forward_us"] for p in mine),
                     "phases_mean_us": {phase: statistics.median(p["phases_mean_us"][phase]
                                                                 for p in mine)
                                        for phase in mine[0]["phases_mean_us"]},
                     "load_averages": [p["load_average"][0] for p in mine],
                     "target_us": target,
                     "met": None if target is None else statistics.median(host) <= target})
    return rows


def unpack(commit: str, into: Path) -> Path:
    """`commit`'s tree (git archive) unpacked in `into`, its kernels/ reached as minicb.kernels
    as an install would place them."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT,
                             capture_output=True)
    if archive.returncode != 0:
        raise ValueError(f"--baseline {commit}: git archive failed "
                         f"({archive.stderr.decode().strip()}); name a commit of {ROOT}.")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    if (into / "kernels").is_dir() and not (into / "minicb" / "kernels").exists():
        (into / "minicb" / "kernels").symlink_to(into / "kernels", target_is_directory=True)
    return into


def own_run(tree: Path, args: argparse.Namespace, model_path: str, batch_sizes: list[int],
            scratch: Path) -> dict:
    """One repeat of every batch size, measured by `tree`'s own `bench overhead` in a fresh
    process (its `minicb` the one in `tree`); the record it wrote."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    command = [sys.executable, "-m", "minicb", "bench", "overhead", "--model", model_path,
               "--batch-sizes", *map(str, batch_sizes), "--context", str(args.context),
               "--steps", str(args.steps), "--repeats", "1", "--out-dir", str(out)]
    done = subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
        raise RuntimeError(f"`bench overhead` of {tree} failed (exit {done.returncode}):\n{tail}")
    return json.loads((out / "overhead.json").read_text())


def measure_beside(args: argparse.Namespace, model_path: str) -> tuple[list[dict], dict]:
    """This tree's points and the baseline commit's (its points, summary and clock), each
    repeat one run of each tree, the tree that runs first alternating between repeats."""
    points: dict[str, list[dict]] = {"this": [], "baseline": []}
    clocks = {}
    with tempfile.TemporaryDirectory(prefix="minicb-baseline-") as scratch:
        trees = {"this": ROOT, "baseline": unpack(args.baseline, Path(scratch) / "tree")}
        for repeat in range(args.repeats):
            sizes = args.batch_sizes if repeat % 2 == 0 else args.batch_sizes[::-1]
            for name in turn_order(list(trees), repeat):
                record = own_run(trees[name], args, model_path, sizes, Path(scratch))
                points[name] += [{**point, "repeat": repeat} for point in record["points"]]
                clocks[name] = record.get("clock")
    # what the baseline's own benchmark says it clocked: a method that changed between the
    # commits shows here
    baseline = {"commit": args.baseline, "clock": clocks["baseline"],
                "points": points["baseline"],
                "summary": summarize(points["baseline"], args.batch_sizes)}
    return points["this"], baseline


def measure_here(args: argparse.Namespace, model_path: str) -> list[dict]:
    """Every batch size `--repeats` times in this process, the order of the sizes alternating."""
    points = []
    for repeat in range(args.repeats):      # alternate the order: drift hits every size alike
        for batch in args.batch_sizes if repeat % 2 == 0 else args.batch_sizes[::-1]:
            points.append({"repeat": repeat,
                           **host_step(model_path, batch, args.context, args.steps)})
    return points


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    torch.set_num_threads(1)
    model_path, label = resolve_model(args.model, None if args.model else args.random_model,
                                      "float32")
    points, baseline = (measure_beside(args, model_path) if args.baseline
                        else (measure_here(args, model_path), None))
    rows = summarize(points, args.batch_sizes)
    print(format_table([{**r, **{k: r["phases_mean_us"][k] for k in (*PHASES, "rest")},
                         "loads": " ".join(f"{x:.1f}" for x in r["load_averages"])}
                        for r in rows],
                       [("batch", "rows", "d"), ("host_us_median", "host µs (median)", ".0f"),
                        ("host_us_min", "min", ".0f"), ("host_us_max", "max", ".0f"),
                        ("forward_us_median", "forward µs", ".0f"),
                        ("schedule", "schedule", ".0f"), ("prepare", "prepare", ".0f"),
                        ("sample", "sample", ".0f"), ("update", "update", ".0f"),
                        ("rest", "rest of step()", ".0f"), ("loads", "load (1 min)", "s")]))
    for r in rows:
        if r["target_us"] is not None:
            print(f"{r['batch']} rows: host {r['host_us_median']:.0f} µs, target <= "
                  f"{r['target_us']:.0f} µs: {'met' if r['met'] else 'NOT met'}")
    for old, new in zip(baseline["summary"] if baseline else [], rows):
        print(f"{new['batch']} rows: {args.baseline} {old['host_us_median']:.0f} µs "
              f"({old['host_us_min']:.0f}-{old['host_us_max']:.0f}), this tree "
              f"{new['host_us_median']:.0f} µs ({new['host_us_min']:.0f}-{new['host_us_max']:.0f})"
              f": {old['host_us_median'] / new['host_us_median']:.2f}x")
    payload = {"benchmark": "overhead", "model": {"label": label,
                                                  "path": display_path(model_path)},
               "context": args.context, "steps": args.steps, "repeats": args.repeats,
               "clock": "CPU time of the stepping thread, one torch thread",
               "points": points, "summary": rows, "baseline": baseline}
    from minicb.viz.benchmarks import plot_overhead

    json_path, png_path = write_results(args.out_dir, args.stem, payload, plot_overhead)
    print(f"results: {json_path}, {png_path}")
    return 0

"""How every benchmark runs and records itself, in one place: its command line, the machine and
load it ran under, repeats that alternate the systems, the spread and the verdict read from
them, the results written (JSON with the machine, a PNG), tables, and servers started in
processes of their own.

    p = bench_parser("overhead", __doc__)
    add_flags(p, "model", "repeats", "out_dir", random_model="llama-tiny")
    for repeat, system in alternate(args.repeats, systems):
        rows.append({"repeat": repeat, "load_average": load_average(), **measure(system)})
    write_results(args.out_dir, "overhead", payload, plot_overhead)

What the benchmarks share about models and workloads (random checkpoints, fitting a workload to
a context, peak memory, kernel timers) lives in `minicb.bench.common`; facts about the machine in
`minicb.bench.machine`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from minicb.bench.machine import load_average, machine_info, machine_line
from minicb.repeats import MIN_REPEATS, Repeats

RESULTS_DIR = Path("benchmarks/results")


# --- the command line ---------------------------------------------------------------------------
def bench_parser(name: str, doc: str | None, *, full_doc: bool = False) -> argparse.ArgumentParser:
    """`python -m minicb bench NAME`'s parser, described by its module docstring's first line
    (or all of it)."""
    description = (doc or "") if full_doc else (doc or "").strip().split("\n")[0]
    return argparse.ArgumentParser(prog=f"python -m minicb bench {name}", description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


# the flags benchmarks spell alike: the same name, type and meaning everywhere
FLAGS: dict[str, dict] = {
    "model": dict(default=None, help="checkpoint directory or name (default: the shipped model)"),
    "random_model": dict(default=None, help="a public model's shape with random weights "
                                             "(minicb.bench.common.RANDOM_MODELS), built here"),
    "device": dict(default="cpu"),
    "dtype": dict(default="float32", choices=["float32", "float16", "bfloat16"]),
    "workload": dict(default="long-tail", help="a workload of minicb.sim.workload"),
    "num_prompts": dict(type=int, default=None, help="fewer requests for a quicker run"),
    # the fewest paired repeats that can give a direction (minicb.repeats)
    "repeats": dict(type=int, default=MIN_REPEATS, help="runs of each system, alternated"),
    "threads": dict(type=int, default=None, help="torch CPU threads (default: torch's)"),
    "seed": dict(type=int, default=0),
    "out_dir": dict(default=str(RESULTS_DIR), help="where the JSON and PNG go"),
}


def add_flags(parser: argparse.ArgumentParser, *names: str, **defaults) -> None:
    """Add FLAGS[name] for each name (`out_dir` becomes --out-dir); a keyword gives a flag its
    own default here (`repeats=7`), or a dict of its own settings (`threads=dict(default=1,
    help=...)`)."""
    for name in names + tuple(k for k in defaults if k not in names):
        if name not in FLAGS:
            raise ValueError(f"no shared flag {name!r}; the shared ones are {sorted(FLAGS)} "
                             "(add a benchmark's own flags with parser.add_argument).")
        spec = dict(FLAGS[name])
        own = defaults.get(name)
        if isinstance(own, dict):
            spec.update(own)
        elif name in defaults:
            spec["default"] = own
        parser.add_argument("--" + name.replace("_", "-"), **spec)


# --- the machine while it runs (machine.load_average: the load beside every run) -------------
def announce(*lines: str) -> None:
    """Print what the run is about to measure, then the machine and its load now."""
    for line in lines:
        print(line)
    from minicb.viz.benchmarks import describe  # matplotlib only where a figure is drawn

    print(f"machine: {describe(machine_info())}; load average {load_average()}", flush=True)


# --- repeats ------------------------------------------------------------------------------------
def alternate(repeats: int, systems: Sequence, rotate: bool = False) -> Iterator[tuple[int, Any]]:
    """(repeat, system) for every repeat and every system in turn (A, B, A, B, ...), so a change
    in the machine's other work falls on all systems alike; `rotate` starts each repeat one
    system later (A B C, B C A, ...), so no system always runs first after a pause."""
    for repeat in range(repeats):
        for system in turn_order(systems, repeat) if rotate else systems:
            yield repeat, system


def turn_order(systems: Sequence, repeat: int) -> list:
    """The systems in the order repeat number `repeat` runs them: rotated by one each repeat."""
    shift = repeat % len(systems) if systems else 0
    return list(systems[shift:]) + list(systems[:shift])


def spread(values: Iterable[float]) -> dict[str, float]:
    """The median of the repeats and their range: the numbers a table prints as '310 (300–330)'."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def verdict(ratios: Iterable[float], above: str = "higher", below: str = "lower") -> str:
    """The book's one rule (minicb.repeats) on paired ratios, repeat by repeat: `above` or
    `below` when the sign test gives a direction (five agreeing repeats at least), else
    "no direction"."""
    return Repeats.of(ratios).verdict(above, below)


def reading(ratios: Iterable[float], above: str = "higher", below: str = "lower") -> str:
    """The same rule as a sentence: the direction, then the size (the median of the ratios,
    with their range) and whether it is beyond the spread."""
    return Repeats.of(ratios).describe(above, below)


# --- results ------------------------------------------------------------------------------------
def write_results(out_dir: str | Path, stem: str, payload: dict,
                  plot: Callable | None = None) -> tuple[Path, Path | None]:
    """Write `stem`.json (the payload plus the machine it ran on), then `stem`.png drawn by
    `plot(payload)` from what was written, so a failed drawing never loses a measurement."""
    return write_record(out_dir, stem, {"machine": machine_info(), **payload}, plot)


def write_record(out_dir: str | Path, stem: str, record: dict,
                 plot: Callable | None = None) -> tuple[Path, Path | None]:
    """`stem`.json holding `record` as it is (the older benchmarks' records name the machine in
    one line, `machine.machine_line()`, themselves), and `stem`.png from `plot(record)`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps(record, indent=1, default=_jsonable) + "\n")
    if plot is None:
        return json_path, None
    import matplotlib.pyplot as plt

    figure = plot(record)
    png_path = out / f"{stem}.png"
    figure.savefig(png_path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return json_path, png_path


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)


def dated_record(**fields) -> dict:
    """The head of a record that names its machine in one line: date, machine, then `fields`."""
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(), **fields}


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A plain-text table. columns: (key, header, format spec); missing values (None, NaN) print
    as '-'."""
    def missing(value) -> bool:
        return value is None or (isinstance(value, float) and math.isnan(value))

    cells = [[header for _, header, _ in columns]]
    for row in rows:
        cells.append(["-" if missing(row.get(key)) else format(row[key], spec) for key, _, spec
                      in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --- servers in processes of their own ----------------------------------------------------------
def minicb_serve_command(port: int, *args: str) -> list[str]:
    """`python -m minicb serve` on 127.0.0.1:`port`, quiet, with `args` after."""
    return [sys.executable, "-m", "minicb", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning", *args]


@contextlib.contextmanager
def server_process(name: str, command: list[str], port: int, *, cpus: Iterable[int] | None = None,
                   env: dict[str, str] | None = None, log_dir: str | Path | None = None,
                   ready: str = "/v1/models", timeout: float = 600.0) -> Iterator[str]:
    """Start `command` (a server listening on `port`) in a process of its own, pinned to `cpus`,
    its output in `log_dir`/NAME.log; yield its URL once `ready` answers 200; stop it after
    (SIGTERM, then SIGKILL). The launcher is the cluster's (minicb.serving.cluster): one way to
    start a server in the package."""
    from minicb.serving.cluster import port_is_free, spawn, stop_processes, wait_healthy

    if not port_is_free(port):       # another server there would answer in this one's place
        raise RuntimeError(f"port {port} is already in use; pick a free one (--base-port).")
    log = Path(log_dir) / f"{name}.log" if log_dir is not None else None
    process = spawn(name, command, f"http://127.0.0.1:{port}", sorted(cpus) if cpus else None,
                    env, log)
    try:
        wait_healthy(process, ready, time.monotonic() + timeout)
        yield process.url
    finally:
        stop_processes([process], timeout=30)

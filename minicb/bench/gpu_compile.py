"""What each GPU will hold: every launch the engine can choose, compiled for seven GPUs.

    python -m minicb bench gpu-compile                 # the full matrix (tens of minutes)
    python -m minicb bench gpu-compile --quick         # the subset make test runs
    python -m minicb bench gpu-compile --targets sm_75 gfx942 --jobs 2
    python -m minicb bench gpu-compile --add-missing     # only launches the results lack

No GPU is needed: Triton compiles for a named target ahead of time (``triton.compile`` with a
``GPUTarget``; ptxas and cuobjdump ship in the triton wheel, and so does AMD's LLVM back end).
The launches (``minicb.kernels.launches``) are not a hand-written list: they come from the
same functions that pick them at run time, over every dtype, head size, GQA group, query length
(decode to long prefill chunk) and split count the engine can reach, each resolved for the
device first (bfloat16 on a T4 runs as float16, see ``minicb.kernels.targets.resolve_dtype``).
For each compiled kernel: shared memory (Triton's metadata) against the device's per-block
limit, registers per thread and spilled bytes (the cubin's resource usage on NVIDIA, the code
object's metadata on AMD), and the occupancy that follows. Results:
``benchmarks/results/gpu-targets.json``, rendered by ``minicb.kernels.launches.table_markdown``.

Triton's interpreter (``TRITON_INTERPRET=1``, how ``make test`` runs) replaces the kernels with
Python, so the compiles run in child processes without it; the compile cache goes to a
temporary directory unless ``TRITON_CACHE_DIR`` is set.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

from minicb.bench.harness import bench_parser
from minicb.kernels.aot import Result, compile_all, identity, launch_identity, problems, row_of
from minicb.kernels.launches import launches_for, table_markdown

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu-targets.json"
PAGE = RESULTS.parents[1] / "gpu-targets.md"   # its table is rewritten from the results
TABLE_START, TABLE_END = "<!-- table: python -m minicb bench gpu-compile -->", "<!-- end table -->"
# --- the table ---

def update_page(page: Path = PAGE, results: Path = RESULTS) -> bool:
    """Rewrite the table between the markers of ``page`` from ``results``; False if the page
    has no markers."""
    if not page.exists():
        return False
    text = page.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        return False
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    page.write_text(f"{head}{TABLE_START}\n{table_markdown(results)}\n{TABLE_END}{tail}")
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from minicb.kernels.targets import TARGETS

    parser = bench_parser("gpu-compile", __doc__)
    parser.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--quick", action="store_true",
                        help="the subset make test compiles: the largest tiles, every target")
    parser.add_argument("--corners", action="store_true",
                        help="the extremes of each dimension (about half the launches)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="compiler processes at once")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--add-missing", action="store_true",
                        help="compile only the launches --out lacks (a kernel added since) and "
                        "add their rows to it, the run recorded beside the first")
    return parser.parse_args(argv)


def _dumps(data: dict) -> str:
    """JSON with one result row per line: readable in a diff, a third of indent's size."""
    head = {k: v for k, v in data.items() if k != "rows"}
    rows = ",\n".join("  " + json.dumps(row) for row in data["rows"])
    return json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n' + rows + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from minicb.kernels.targets import TARGETS

    launches = [launch for key in args.targets
                for launch in launches_for(TARGETS[key], quick=args.quick,
                                           corners=args.corners)]
    before = json.loads(args.out.read_text()) if args.add_missing else None
    if before is not None:
        have = {identity(row) for row in before["rows"]}
        launches = [launch for launch in launches if launch_identity(launch) not in have]
    print(f"compiling {len(launches)} launches for {', '.join(args.targets)} "
          f"({args.jobs} at once)", flush=True)
    start = time.perf_counter()
    done = [0]

    def progress(result: Result) -> None:
        done[0] += 1
        if done[0] % 25 == 0 or not result.compiled:
            print(f"  {done[0]}/{len(launches)}  {time.perf_counter() - start:.0f} s", flush=True)

    results = compile_all(launches, jobs=args.jobs, progress=progress)
    rows = [row_of(r) for r in results]
    import triton

    from minicb.bench.machine import machine_info

    data = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "triton": triton.__version__, "machine": machine_info(),
            "compile_seconds": round(time.perf_counter() - start, 1),
            "quick": args.quick, "corners": args.corners, "rows": rows}
    if before is not None:   # the first run's record stays; this one is listed beside it
        added = {k: data[k] for k in ("when", "triton", "machine", "compile_seconds")}
        before["added"] = before.get("added", []) + [{**added, "launches": len(rows)}]
        rows = before["rows"] = before["rows"] + rows
        data = before
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(_dumps(data))
    print(table_markdown(args.out))
    if args.out == RESULTS and not args.quick and update_page():
        print(f"table rewritten in {PAGE}")
    bad = problems(rows)
    for line in bad:
        print("DEFECT:", line)
    print(f"{len(rows)} launches, {len(bad)} defects, {data['compile_seconds']} s -> {args.out}")
    return 1 if bad else 0

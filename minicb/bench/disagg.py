"""`python -m minicb bench disagg`: the simulator's studies beyond one GPU (minicb.sim.disagg),
run and recorded: disaggregation's goodput against co-located serving, and tensor parallelism.

    python -m minicb bench disagg            # a few minutes on 2 cores
    python -m minicb bench disagg --quick    # fewer requests, fewer SLO scales
    python -m minicb bench disagg --replot   # redraw the pictures from the results

Results: benchmarks/results/disagg.json and disagg-*.png.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from minicb.bench.harness import add_flags, bench_parser, dated_record, write_record
from minicb.sim.calibrate import A100_LLAMA2_7B
from minicb.sim.disagg import (
    GOAL,
    MIN_REQUESTS,
    SLO_SCALES,
    TASKS,
    disaggregation,
    knobs,
    tensor_parallel,
)
from minicb.sim.parallel import LINKS


def draw(record: dict, out: Path, name: str) -> None:
    """The pictures of a results record: attainment curves, goodput bars (the best split over
    each slower link beside the systems), SLO scales, and tensor parallelism's steps and TPOT."""
    from minicb.viz.cluster import (
        goodput_bars,
        slo_attainment_curves,
        slo_scale_plot,
        tp_parts,
        tp_tpot,
    )

    slo_attainment_curves(record["curves"], goal=record["goal"]).savefig(
        out / f"{name}-attainment.png")
    slower = [{**r, "system": "best split"} for r in record["links"] if r["link"] != "nvlink"]
    goodput_bars(record["goodput"] + slower).savefig(out / f"{name}-goodput.png")
    if len({r["scale"] for r in record["slo_scale"]}) > 1:
        slo_scale_plot(record["slo_scale"]).savefig(out / f"{name}-slo-scale.png")
    tp_parts(record["tp"]).savefig(out / f"{name}-tp-parts.png")
    tp_tpot(record["tp"]).savefig(out / f"{name}-tp-tpot.png")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("disagg", __doc__)
    parser.add_argument("--quick", action="store_true",
                        help="shorter runs, and the SLO targets as given only")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of arrivals per simulated run (default 40, 15 --quick)")
    add_flags(parser, "out_dir")
    parser.add_argument("--replot", action="store_true",
                        help="redraw the pictures from the results already written")
    args = parser.parse_args(argv)
    name = "disagg-quick" if args.quick else "disagg"
    out = Path(args.out_dir)
    if args.replot:
        if not (out / f"{name}.json").exists():
            parser.error(f"--replot draws {out / name}.json, which is not there; run the "
                         "benchmark without --replot first.")
        draw(json.loads((out / f"{name}.json").read_text()), out, name)
        return 0
    duration = args.duration or (15.0 if args.quick else 40.0)
    started = time.perf_counter()
    record = dated_record(cost_model=A100_LLAMA2_7B.name, arrival_seconds=duration,
                          min_requests=MIN_REQUESTS, goal=GOAL,
                          tasks={t.name: vars(t) for t in TASKS.values()}, knobs=knobs(),
                          link_specs={k: vars(v) for k, v in LINKS.items()},
                          **disaggregation(duration, (1.0,) if args.quick else SLO_SCALES),
                          tp=tensor_parallel(duration))
    record["wall_time_s"] = time.perf_counter() - started
    write_record(out, name, record)
    draw(record, out, name)
    print(f"\nresults: {out / name}.json and {name}-*.png ({record['wall_time_s']:.0f} s)")
    return 0

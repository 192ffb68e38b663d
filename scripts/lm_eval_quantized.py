"""The accuracy gate through a real client: lm-evaluation-harness scores the shipped model served by
`minicb serve` in float32 and in each format with fewer bytes (int8 and int4 weights, the int8
KV cache, bfloat16), and every format must stay within GATE_POINTS of float32 on the project's
two tasks (peers/lm_eval_tasks). Beside the scores: the parse rate of the generated lines, the
share of the line completions that Python's parser accepts, among the items whose own reference
line it accepts.

    make lm-eval-setup                                  # .venv-lmeval, once (a few minutes)
    .venv/bin/python scripts/lm_eval_quantized.py       # writes results/lm-eval-quant.json and
                                                        # the table in benchmarks/quant.md

The tasks are small (24 multiple-choice items, 16 generations): one item moves a score by four
or six points, so a gate of one point means no item may change its score. lm-eval runs in its
own environment, as `python -m minicb bench lm-eval` drives it; this script reuses that driver.
(A script beside the package rather than a `minicb bench` command: minicb/bench is capped.)
"""

from __future__ import annotations

import argparse
import ast
import json
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lm-eval-quant.json"
PAGE = ROOT / "benchmarks" / "quant.md"
MARKERS = ("<!-- lm-eval table -->", "<!-- end lm-eval table -->")
GATE_POINTS = 1.0
# each format as `minicb serve` takes it; float32 (the default) is the reference
FORMATS = {"float32": (), "bfloat16": ("--dtype", "bfloat16"),
           "int8 weights": ("--quantization", "int8"),
           "int4 weights (groups of 32)": ("--quantization", "int4"),
           "int8 KV": ("--kv-cache-dtype", "int8")}


def parses(context: str, completion: str) -> bool:
    """Whether Python's parser accepts the line `context` + `completion` on its own: dedented,
    with a block opened by a trailing colon given a body."""
    text = textwrap.dedent(context + completion).rstrip()
    if text.endswith(":"):
        text += "\n    pass"
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def scores(mc: list[dict], gen: list[dict]) -> dict:
    """One format's scores from lm-eval's logged samples (each sorted by doc_id)."""
    judged = [s for s in gen if parses(s["doc"]["context"], s["doc"]["target"])]
    return {"acc": sum(s["acc"] for s in mc) / len(mc),
            "exact_match": sum(s["exact_match"] for s in gen) / len(gen),
            "acc_items": [s["acc"] for s in mc],
            "generations": [s["filtered_resps"][0] for s in gen],
            "parse_rate": sum(parses(s["doc"]["context"], s["filtered_resps"][0])
                              for s in judged) / len(judged),
            "parse_items": len(judged)}


def gate(results: dict[str, dict]) -> dict[str, dict]:
    """Each format's change against float32 in points (hundredths of a score), and whether both
    tasks stay within GATE_POINTS."""
    base = results["float32"]
    out = {}
    for name, r in results.items():
        acc = 100 * (r["acc"] - base["acc"])
        em = 100 * (r["exact_match"] - base["exact_match"])
        out[name] = {**r, "acc_points": acc, "exact_match_points": em,
                     "items_changed": sum(a != b for a, b in zip(r["acc_items"], base["acc_items"]))
                     + sum(a != b for a, b in zip(r["generations"], base["generations"])),
                     "within_gate": abs(acc) <= GATE_POINTS and abs(em) <= GATE_POINTS}
    return out


def served(model: str, args: tuple[str, ...], work: Path) -> dict:
    from minicb.bench.lm_eval import GENERATION, MULTIPLE_CHOICE, read_samples, run_served

    run_served(model, work, *args)
    return scores(read_samples(work, MULTIPLE_CHOICE), read_samples(work, GENERATION))


def render(record: dict) -> str:
    rows = [f"lm-eval {record['lm_eval']} through `minicb serve` on the shipped model "
            f"({record['date'][:10]}, load average {record['load'][0]:.1f} before and "
            f"{record['load'][1]:.1f} after; the load changes how long it takes, not what it "
            f"computes). Gate: within {GATE_POINTS:g} point of float32 on both tasks; the "
            "parse rate counts the line completions Python's parser accepts, among the items "
            "whose own reference line it accepts.", "",
            "| format | stdlib_mc acc | points vs float32 | stdlib_gen exact match | points "
            "vs float32 | items changed | gate | lines that parse |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in record["formats"].items():
        rows.append(f"| {name} | {r['acc']:.4f} | {r['acc_points']:+.1f} | {r['exact_match']:.4f} "
                    f"| {r['exact_match_points']:+.1f} | {r['items_changed']} | "
                    f"{'met' if r['within_gate'] else 'NOT met'} | "
                    f"{r['parse_rate']:.0%} of {r['parse_items']} |")
    return "\n".join(rows)


def write_page(record: dict, page: Path = PAGE) -> None:
    text = page.read_text()
    table = f"{MARKERS[0]}\n{render(record)}\n{MARKERS[1]}"
    if MARKERS[0] in text:
        head, rest = text.split(MARKERS[0], 1)
        text = head + table + rest.split(MARKERS[1], 1)[1]
    else:
        text = (text.rstrip("\n") + "\n\n## The accuracy gate through lm-evaluation-harness\n\n"
                + table + "\n")
    page.write_text(text)


def main(argv: list[str] | None = None) -> int:
    from minicb import default_model_path
    from minicb.bench.harness import machine_info
    from minicb.bench.lm_eval import LMEVAL_VENV, installed_version
    from minicb.bench.machine import load_average

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page-only", action="store_true",
                        help="render the committed results into benchmarks/quant.md")
    args = parser.parse_args(argv)
    if args.page_only:
        write_page(json.loads(RESULTS.read_text()))
        return 0
    model = str(default_model_path())
    before = load_average()[0]
    with tempfile.TemporaryDirectory() as work:
        results = {name: served(model, flags, Path(work) / f"format{i}")
                   for i, (name, flags) in enumerate(FORMATS.items())}
    machine = machine_info()
    record = {"lm_eval": installed_version(LMEVAL_VENV, "lm_eval"), "date": machine["date"],
              "machine": machine, "load": [before, load_average()[0]],
              "gate_points": GATE_POINTS, "formats": gate(results)}
    RESULTS.write_text(json.dumps(record, indent=1) + "\n")
    write_page(record)
    print(render(record))
    return 0 if all(r["within_gate"] for r in record["formats"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

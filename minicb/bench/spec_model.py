"""The speculative benchmark's arithmetic: what a run measured and the ratios from paired runs.
Where speculation stops paying and the same curve predicted on a cost model live in
`minicb.sim.speculative`.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from minicb.bench.harness import format_table

KEY = ("system", "workload", "method", "batch_size")


def summarize_runs(rows: list[dict]) -> list[dict]:
    """Per system x workload x method x batch size: the tokens/s and TPOT ratios against the same
    system's run without speculation in the same repeat, their median over repeats, and the
    acceptance pooled over the repeats."""
    baseline = {(r["system"], r["workload"], r["batch_size"], r["repeat"]): r
                for r in rows if r["method"] == "none"}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["method"] != "none":
            groups[tuple(r[k] for k in KEY)].append(r)
    summary = []
    for key, runs in groups.items():
        pairs = [(r, baseline[r["system"], r["workload"], r["batch_size"], r["repeat"]])
                 for r in runs]
        speedups = [r["output_throughput"] / b["output_throughput"] for r, b in pairs]
        tpots = [r["tpot_p50_ms"] / b["tpot_p50_ms"] for r, b in pairs]
        proposed = sum(r["proposed_tokens"] for r in runs)
        accepted = sum(r["accepted_tokens"] for r in runs)
        verify = sum(r["verify_steps"] for r in runs)
        differ = [r.get("differs_from_none") for r in runs]
        summary.append(dict(
            zip(KEY, key), speedup=statistics.median(speedups), speedups=speedups,
            tpot_ratio=statistics.median(tpots),
            acceptance_rate=accepted / proposed if proposed else None,
            mean_accepted_length=(accepted + verify) / verify if verify else None,
            greedy_equal=all(d == 0 for d in differ)))
    return sorted(summary, key=lambda s: tuple(s[k] for k in KEY))


def _median_of(rows: list[dict], key: str, **match) -> float:
    values = [r[key] for r in rows if all(r[k] == v for k, v in match.items())]
    return statistics.median(values) if values else float("nan")


def markdown_tables(payload: dict) -> str:
    """The page's tables, generated from the benchmark's JSON: measured ratios, then the
    predictions (benchmarks/speculative.md embeds this text; `--table FILE` prints it)."""
    runs = payload["runs"]
    lines = ["| system | workload | method | B | tok/s without | tok/s with | with / without "
             "(median; each repeat) | TPOT p50 ms without → with | accepted | tokens / verify "
             "| greedy = without | = transformers |", "|---|---|---|---:|---:|---:|---|---|---:|"
             "---:|---|---|"]
    for s in payload["summary"]:
        key = dict(system=s["system"], workload=s["workload"], batch_size=s["batch_size"])
        mine = [r for r in runs if r["method"] == s["method"] and all(r[k] == v for k, v in
                                                                      key.items())]
        ref = [r.get("differs_from_transformers") for r in mine]
        checked = "–" if None in ref else ("yes" if not any(ref) else f"NO ({max(ref)})")
        accepted = "–" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.0%}"
        length = "–" if s["mean_accepted_length"] is None else f"{s['mean_accepted_length']:.2f}"
        lines.append(
            f"| {s['system']} | {s['workload']} | {s['method']} | {s['batch_size']} | "
            f"{_median_of(runs, 'output_throughput', method='none', **key):,.0f} | "
            f"{_median_of(mine, 'output_throughput'):,.0f} | **{s['speedup']:.2f}×** ("
            + ", ".join(f"{x:.2f}" for x in s["speedups"]) + ") | "
            f"{_median_of(runs, 'tpot_p50_ms', method='none', **key):.1f} → "
            f"{_median_of(mine, 'tpot_p50_ms'):.1f} | {accepted} | {length} | "
            f"{'yes' if s['greedy_equal'] else 'NO'} | {checked} |")
    for prediction in payload["predictions"]:
        sizes = sorted({r["batch_size"] for r in prediction["rows"]})
        lines += ["", f"{prediction['label']}:", "",
                  "| workload | method | " + " | ".join(f"B={b}" for b in sizes) + " |",
                  "|---|---|" + "---:|" * len(sizes)]
        for workload, method in sorted({(r["workload"], r["method"])
                                        for r in prediction["rows"]}):
            cells = {r["batch_size"]: r for r in prediction["rows"]
                     if (r["workload"], r["method"]) == (workload, method)}
            lines.append(f"| {workload} | {method} | " + " | ".join(
                "–" if b not in cells else f"{cells[b]['speedup']:.2f}"
                + ("*" if cells[b]["extrapolated"] else "") for b in sizes) + " |")
    return "\n".join(lines) + "\n"


def measurements(metrics: list, duration: float) -> dict:
    """What every system's run reports: throughput, TPOT, and what speculation proposed and kept."""
    from minicb.metrics import summarize

    s = summarize(metrics)
    proposed = sum(m.num_proposed_tokens for m in metrics)
    accepted = sum(m.num_accepted_tokens for m in metrics)
    verify = sum(m.num_verify_steps for m in metrics)
    tpots = [m.tpot for m in metrics if m.tpot is not None]
    return {"requests": len(metrics), "output_tokens": s.output_tokens, "duration_s": duration,
            "output_throughput": s.output_tokens / duration, "tpot_p50_ms": s.tpot["p50"] * 1e3,
            "tpot_mean_ms": statistics.fmean(tpots) * 1e3 if tpots else None,
            "proposed_tokens": proposed, "accepted_tokens": accepted, "verify_steps": verify,
            "acceptance_rate": accepted / proposed if proposed else None,
            "mean_accepted_length": (accepted + verify) / verify if verify else None}


def tokens_per_step(metrics: list) -> dict[str, int]:
    """How many tokens a request gained in each step it gained any (its first token, from the
    prompt's step, left out): 1 is a plain decode or a verification that kept no proposal."""
    counts: Counter = Counter()
    for m in metrics:
        counts.update(Counter(Counter(m.token_steps[1:]).values()))
    return {str(k): counts[k] for k in sorted(counts)}


def report(payload: dict) -> str:
    columns = [("system", "system", ""), ("workload", "workload", ""), ("method", "method", ""),
               ("batch_size", "B", "d"), ("speedup", "tok/s with / without", ".2f"),
               ("tpot_ratio", "TPOT with / without", ".2f"),
               ("acceptance_rate", "accepted", ".0%"),
               ("mean_accepted_length", "tokens/verify", ".2f"), ("equal", "greedy =", "")]
    rows = [dict(s, equal="yes" if s["greedy_equal"] else "NO") for s in payload["summary"]]
    return format_table(rows, columns)

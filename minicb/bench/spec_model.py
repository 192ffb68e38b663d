"""The speculative benchmark's arithmetic: what a run measured, ratios from paired runs, where
speculation stops paying, and the same curve PREDICTED on a cost model (`minicb.sim.calibrate`) from
measured rates.

A prediction prices one step of B requests both ways, with the cost model's own terms:

- without speculation, a step is B decode rows reading their keys and yields 1 token a request:
  `step_time(0, B, B * context)`;
- with it, a share f of the rows verify (f = verification rows / request-steps, measured) and
  carry 1 + k' tokens each (k' = tokens proposed per verification, measured), counted as prompt
  tokens, as the engine's step statistics count them; the other rows decode; every row reads
  its keys once. A request gains G tokens per step (measured, the target's own included). A
  draft model adds k of its own decode steps, each costing the target's decode step scaled by
  the draft's share of the weight bytes (a decode step reads every weight: an assumption, and
  generous to the draft on a GPU, where a small model's step is mostly launch overhead).

speedup = G * step_without / step_with, at each batch size measured, and at 2, 4 and 8 times the
largest with its rates (`extrapolated`: the big batches a GPU serves, out of this CPU's reach).
The rates are this machine's measurements on the shipped
models; the A100 terms are those of Llama-2-7B (`A100_LLAMA2_7B`): a prediction of what those
acceptance rates would buy on that GPU, not a measurement.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from pathlib import Path

from minicb.bench.harness import format_table
from minicb.sim import CostModel
from minicb.sim.calibrate import A100_LLAMA2_7B, REFERENCE_CPU

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


def break_even(summary: list[dict]) -> list[dict]:
    """Per system x workload x method: the batch size from which speculation no longer pays
    (speedup < 1 there and at every larger size measured); 0 if it paid at none, None if it
    still paid at the largest batch size measured."""
    curves: dict[tuple, list[dict]] = defaultdict(list)
    for s in summary:
        curves[s["system"], s["workload"], s["method"]].append(s)
    out = []
    for (system, workload, method), points in curves.items():
        points.sort(key=lambda s: s["batch_size"])
        paid = [s["batch_size"] for s in points if s["speedup"] >= 1]
        after = [s["batch_size"] for s in points if paid and s["batch_size"] > max(paid)]
        stops = 0 if not paid else (after[0] if after else None)
        out.append({"system": system, "workload": workload, "method": method,
                    "stops_paying_at": stops, "paid_at": paid})
    return out


def measured_rates(rows: list[dict]) -> dict:
    """Per workload x method x batch size of minicb's runs: G (tokens a request gains per step),
    f (share of request-steps that verify) and k' (tokens proposed per verification)."""
    pooled: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["system"] == "minicb" and r["method"] != "none":
            pooled[r["workload"], r["method"], r["batch_size"]].append(r)
    rates = {}
    for key, runs in pooled.items():
        hist: dict[int, int] = defaultdict(int)
        for r in runs:
            for tokens, count in r["tokens_per_step"].items():
                hist[int(tokens)] += count
        request_steps = sum(hist.values())
        verify = sum(r["verify_steps"] for r in runs)
        rates[key] = {"tokens_per_step": sum(t * c for t, c in hist.items()) / request_steps,
                      "verify_share": min(1.0, verify / request_steps),
                      "proposed_per_verify": sum(r["proposed_tokens"] for r in runs)
                      / max(verify, 1)}
    return rates


def predicted_speedup(cost: CostModel, batch_size: int, context: float, rate: dict,
                      draft_steps: int = 0, draft_share: float = 0.0) -> float:
    """G * step_without / step_with on `cost` (the module's docstring)."""
    b = batch_size
    without = cost.step_time(0, b, int(b * context))
    verify_rows = b * rate["verify_share"]
    verify_tokens = round(verify_rows * (1 + rate["proposed_per_verify"]))
    with_spec = cost.step_time(verify_tokens, round(b - verify_rows), int(b * context))
    with_spec += draft_steps * draft_share * without
    return rate["tokens_per_step"] * without / with_spec


def predictions(rows: list[dict], k: int, contexts: dict[str, float],
                model_path: Path, draft_path: Path) -> list[dict]:
    """The measured rates priced on the A100 model and on this book's reference CPU."""
    draft_share = ((draft_path / "model.safetensors").stat().st_size
                   / (Path(model_path) / "model.safetensors").stat().st_size)
    rates = measured_rates(rows)
    out = []
    for cost, label in ((A100_LLAMA2_7B, "PREDICTION for an A100-80GB running Llama-2-7B fp16 "
                         "(published step costs), at this machine's measured acceptance"),
                        (REFERENCE_CPU, "PREDICTION on this book's reference 2-core CPU "
                         "(calibrated step costs: decode-only steps on the fused C path, any "
                         "step with a verification row on the torch path)")):
        points = []
        for (workload, method, b), rate in sorted(rates.items()):
            largest = max(size for w, m, size in rates if (w, m) == (workload, method))
            # past the largest batch measured, that batch's rates carry on (marked extrapolated)
            for size in [b] + ([2 * b, 4 * b, 8 * b] if b == largest else []):
                steps = k if method == "draft_model" else 0
                points.append({"system": cost.name, "workload": workload, "method": method,
                               "batch_size": size, "extrapolated": size > largest,
                               "speedup": predicted_speedup(cost, size, contexts[workload], rate,
                                                            steps, draft_share), **rate})
        out.append({"label": label, "cost_model": cost.name, "unit": cost.unit,
                    "terms": {k_: getattr(cost, k_) for k_ in vars(cost) if k_ not in
                              ("name", "unit")},
                    "draft_weight_share": draft_share, "context_tokens": contexts,
                    "rows": points, "break_even": break_even(points)})
    return out


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

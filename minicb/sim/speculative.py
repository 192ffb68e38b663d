"""Speculative decoding PREDICTED on a cost model (`minicb.sim.calibrate`) from measured rates,
and where speculation stops paying.

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
The rates are this machine's measurements on the shipped models (`python -m minicb bench
speculative`); the A100 terms are those of Llama-2-7B (`A100_LLAMA2_7B`): a prediction of what
those acceptance rates would buy on that GPU, not a measurement.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from minicb.sim.calibrate import A100_LLAMA2_7B, REFERENCE_CPU
from minicb.sim.cost_model import CostModel


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

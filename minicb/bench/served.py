"""What the benchmarks that measure a running OpenAI-compatible server share: the vocabulary its
prompts' token ids must stay in, a warm-up request, and one run's row of throughput and latency
percentiles (`minicb.bench.load_study`, `minicb.bench.serve_peers`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx


def vocab_size_of(model: str | None) -> int:
    """The vocabulary the prompts' token ids must stay in: the model's, when `model` is a
    checkpoint directory (vLLM names a model by the path it loaded), else the shipped model's,
    an external server being assumed to serve the same weights unless --vocab-size says otherwise.
    """
    from minicb.model.default import default_model_path

    path = Path(model) if model and (Path(model) / "config.json").exists() else None
    return json.loads(((path or Path(default_model_path())) / "config.json").read_text())[
        "vocab_size"]


def warm_up(url: str, model: str | None = None) -> str:
    """Check the server serves `model` (default: the first it lists) and send one small request
    first, so the first measured one does not pay for lazy initialisation; return the model."""
    try:
        listing = httpx.get(f"{url}/v1/models", timeout=30)
        listing.raise_for_status()
    except httpx.HTTPError as error:
        raise SystemExit(f"no OpenAI-compatible server answers at {url} ({error}); start it "
                         "first, or check --base-url.") from None
    served = [entry["id"] for entry in listing.json()["data"]]
    if model is None:
        model = served[0]
    elif model not in served:
        raise SystemExit(f"the server at {url} does not serve {model!r}; it serves {served} "
                         "(--model names one of them).")
    httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": [5, 6, 7], "max_tokens": 4},
               timeout=120).raise_for_status()
    return model


def latency_row(scheduler: str, rate: float, result: dict) -> dict:
    """One run of `minicb.serving.loadgen` (its result) as a row: what it served, how fast, and
    its TTFT, TPOT and E2E percentiles."""
    ttft, tpot, e2e = result["ttft_ms"] or {}, result["tpot_ms"] or {}, result["e2e_ms"] or {}
    return {"scheduler": scheduler, "request_rate": rate, "completed": result["completed"],
            "failed": result["failed"], "duration_s": result["duration_s"],
            "request_throughput": result["request_throughput"],
            "output_throughput": result["output_throughput"],
            "ttft_p50_s": ttft.get("p50", math.nan) / 1000,
            "ttft_p95_s": ttft.get("p95", math.nan) / 1000,
            "tpot_p50_ms": tpot.get("p50", math.nan), "tpot_p95_ms": tpot.get("p95", math.nan),
            "e2e_p95_s": e2e.get("p95", math.nan) / 1000}

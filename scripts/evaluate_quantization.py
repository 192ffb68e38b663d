"""The accuracy cost of fewer bytes per token: held-out validation loss of the shipped model
through minicb's own forward, in float32, bfloat16, with int8 or int4 weights and with the int8 KV
cache.

The held-out stream is the one scripts/evaluate_default_model.py scores (the standard-library
files the model never trained on, cut into windows of the model's context). Each window runs as
one prompt through minicb's model on a paged KV cache of the chosen format, so the int8 cache's
attention reads keys and values that were quantized when written, as in serving. The gates (GATES):
the loss rises at most 0.5% with int8 weights and with the int8 KV cache, and at most 3% with int4
weights in groups of 32.

Usage::

    python scripts/evaluate_quantization.py [--windows N] [--out FILE] [--page FILE]

``--page`` renders the accuracy table from the results into that Markdown page, between the
markers ``<!-- accuracy table -->`` and ``<!-- end accuracy table -->``: the page's figures are
the JSON's, never typed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import train_default_model as T  # noqa: E402  (the held-out stream's code)

from minicb.config import blocks_for  # noqa: E402
from minicb.model.attention import AttentionMetadata  # noqa: E402
from minicb.model.default import default_model_path  # noqa: E402
from minicb.model.loader import DTYPES, load_model, load_tokenizer  # noqa: E402
from minicb.model.quant import kv_cache_layout  # noqa: E402

SETTINGS = {   # name: (dtype, quantization, kv_cache_dtype)
    "float32": ("float32", None, "auto"),
    "bfloat16": ("bfloat16", None, "auto"),
    "int8 weights": ("float32", "int8", "auto"),
    "int4 weights (groups of 32)": ("float32", "int4", "auto"),
    "int8 KV": ("float32", None, "int8"),
    "int8 weights + int8 KV": ("float32", "int8", "int8"),
}
GATES = {"int8 weights": 0.5, "int8 KV": 0.5, "int4 weights (groups of 32)": 3.0}   # max rise, %
MARKERS = ("<!-- accuracy table -->", "<!-- end accuracy table -->")


def held_out_windows(path: Path, tok, seq_len: int) -> torch.Tensor:
    log = json.loads((path / "training_log.json").read_text())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [(rel, T.split_top_level((stdlib / rel).read_text(encoding="utf-8")))
             for rel in log["data"]["val_file_list"] if (stdlib / rel).exists()]
    docs = T.tokenize_files(tok.backend_tokenizer, files, tok.eos_token_id)
    return T.validation_windows(docs, seq_len)


@torch.inference_mode()
def loss(path: Path, windows: torch.Tensor, dtype: str, quantization: str | None,
         kv_cache_dtype: str, block_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats/token) of minicb's forward, each window one prompt."""
    model = load_model(path, dtype=dtype, quantization=quantization)
    args, length = model.args, windows.shape[1] - 1
    row, cache_dtype = kv_cache_layout(args.num_kv_heads, args.head_dim, DTYPES[dtype],
                                       kv_cache_dtype)
    blocks = blocks_for(length, block_size)
    shape = (blocks, block_size, *row)
    caches = [(torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype))
              for _ in range(args.num_layers)]
    positions = torch.arange(length)
    total = 0.0
    for window in windows:
        meta = AttentionMetadata(slot_mapping=positions, cu_seqlens_q=torch.tensor(
            [0, length], dtype=torch.int32), seq_lens=torch.tensor([length], dtype=torch.int32),
            block_tables=torch.arange(blocks, dtype=torch.int32)[None], max_seqlen_q=length,
            max_seqlen_k=length)
        logits = model(window[:-1], positions, caches, meta, positions)
        total += F.cross_entropy(logits, window[1:], reduction="sum").item()
    return total / (len(windows) * length)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=0, help="score the first N windows (0: all)")
    p.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    p.add_argument("--page", type=Path, default=None,
                   help="render the accuracy table into this Markdown page (between MARKERS)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: a busy machine's other work cannot stall a barrier)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = Path(default_model_path())
    tok = load_tokenizer(path)
    windows = held_out_windows(path, tok, json.loads((path / "config.json").read_text())[
        "max_position_embeddings"])
    if args.windows:
        windows = windows[:args.windows]
    results = {"held_out_tokens": int(windows[:, 1:].numel()), "threads": args.threads,
               "load_before": os.getloadavg()}
    for name, setting in SETTINGS.items():
        start = time.perf_counter()
        results[name] = {"val_loss": round(loss(path, windows, *setting), 5),
                         "seconds": round(time.perf_counter() - start, 1)}
        print(name, results[name], flush=True)
    base = results["float32"]["val_loss"]
    for name in SETTINGS:
        results[name]["rise_vs_float32_pct"] = round(100 * (results[name]["val_loss"] / base - 1),
                                                     3)
        if name in GATES:
            results[name]["gate_pct"] = GATES[name]
            results[name]["gate_met"] = results[name]["rise_vs_float32_pct"] <= GATES[name]
    results["load_after"] = os.getloadavg()
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.page:
        render_page(results, args.page)


def render_page(results: dict, page: Path) -> None:
    """Replace the accuracy table between MARKERS in `page` with one rendered from `results`."""
    rows = ["| | val loss (nats/token) | rise vs float32 | gate |", "|---|---|---|---|"]
    for name in SETTINGS:
        r = results[name]
        rise = "-" if name == "float32" else f"{r['rise_vs_float32_pct']:+.3f}%"
        gate = (f"<= {r['gate_pct']:g}%: {'met' if r['gate_met'] else 'NOT met'}"
                if "gate_pct" in r else "")
        rows.append(f"| {name} | {r['val_loss']:.5f} | {rise} | {gate} |")
    text = page.read_text()
    start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
    page.write_text(text[:start] + "\n" + "\n".join(rows) + "\n" + text[end:])


if __name__ == "__main__":
    main()

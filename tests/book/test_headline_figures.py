"""The headline figures the docs type are the ones in the committed results, and they are read by
the book's rule (`minicb.repeats`): a page that calls a difference within the noise is right only
while the repeats' spread is wider than the difference.

The chapters render their numbers from the JSON; README.md, docs/ARCHITECTURE.md and the
benchmark pages are plain markdown, so this test reads the JSON and checks the text. A new run
that changes a figure, or turns noise into a verdict, fails here until the pages say so.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from minicb.repeats import Repeats
from minicb.sim.calibrate import A100_LLAMA2_7B
from minicb.sim.parallel import LINKS, LLAMA2_7B, tp_step_parts

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def text(name: str) -> str:
    return " ".join((ROOT / name).read_text().split())       # line breaks as spaces


@pytest.fixture(scope="module")
def speculative() -> dict:
    return json.loads((RESULTS / "speculative.json").read_text())


def ratio(record: dict, system: str, workload: str, method: str, batch: int) -> Repeats:
    row = next(s for s in record["summary"]
               if (s["system"], s["workload"], s["method"], s["batch_size"])
               == (system, workload, method, batch))
    return Repeats.of(row["speedups"])


def test_prompt_lookups_batch_1_loss_is_quoted_with_its_spread_and_direction(speculative):
    lookup = ratio(speculative, "minicb", "code", "ngram", 1)
    low, high = min(lookup.values), max(lookup.values)
    assert lookup.verdict("paid", "cost") == "cost" and not lookup.size_within_spread(), (
        "prompt lookup's batch-1 ratio no longer costs in every repeat beyond its spread: README, "
        "ARCHITECTURE and benchmarks/speculative.md say it does")
    assert len(lookup.values) == 5, "README says five repeats"
    assert (f"{lookup.median:.2f}× the tokens per second (five repeats, {low:.2f}× to "
            f"{high:.2f}×, every one slower)") in text("README.md")
    assert f"{lookup.median:.2f}× (repeats {low:.2f}–{high:.2f}×, every one slower)" \
        in text("docs/ARCHITECTURE.md")
    assert f"{lookup.median:.2f}× ({low:.2f}–{high:.2f}) on code" \
        in text("benchmarks/speculative.md")


def test_the_draft_model_lost_in_every_repeat_where_the_pages_say(speculative):
    """Five alternated repeats at each point: the draft model cost in every one, and the size of
    the loss, the median ratio, lies beyond its spread."""
    for workload in ("code", "random"):
        for batch in speculative["settings"]["batch_sizes"]:
            draft = ratio(speculative, "minicb", workload, "draft_model", batch)
            assert draft.verdict("paid", "cost") == "cost", (workload, batch, str(draft))
            assert draft.median < 1 and not draft.size_within_spread(), (workload, batch)


def test_the_step_times_architecture_quotes(speculative):
    def median(method: str, field: str) -> float:
        return statistics.median(r[field] for r in speculative["runs"] if r["system"] == "minicb"
                                 and r["workload"] == "code" and r["method"] == method
                                 and r["batch_size"] == 1 and r[field] is not None)

    quoted = text("docs/ARCHITECTURE.md")
    for method, field in (("none", "decode_step_ms"), ("ngram", "other_step_ms"),
                          ("draft_model", "other_step_ms")):
        assert f"{median(method, field):.2f} ms" in quoted, (method, field)


def test_the_tensor_parallel_record_is_the_current_model():
    """benchmarks/results/disagg.json's TP rows are what minicb.sim.parallel prices today."""
    record = json.loads((RESULTS / "disagg.json").read_text())
    for row in record["tp"]:
        if row["model"] != LLAMA2_7B.name:
            continue
        parts = tp_step_parts(A100_LLAMA2_7B, LLAMA2_7B, row["tp"], LINKS[row["link"]], 0, 32,
                              32 * 1024)
        assert parts == pytest.approx(row["decode_parts"], rel=1e-9), (row["link"], row["tp"])


def test_the_kv_pressure_figures_quant_md_quotes():
    """benchmarks/quant.md's int8-KV-under-pressure row is results/quant-pressure.json's."""
    record = json.loads((RESULTS / "quant-pressure.json").read_text())["pressure"]
    page = text("benchmarks/quant.md")
    for name, cache in (("float32", "float32"), ("int8 KV", "int8")):
        row, rate = record[name], record[name]["tokens_per_s"]
        assert (f"| {cache} | {row['kv_blocks']} | {row['preemptions']['median']:.0f} | "
                f"{rate['median']:,.0f} ({rate['min']:,.0f}-{rate['max']:,.0f}) |") in page, name
    verdict = record["int8 KV"]["vs float32"].replace("×", "x").replace("–", "-")
    assert verdict.split(";")[0].startswith("faster in every one of")
    size = verdict.split("the size, ")[1].split(", is")[0]
    assert f"| int8 | {record['int8 KV']['kv_blocks']} | 0 | " in page and size in page


def test_the_w8a8_paragraph_quotes_the_peers_record():
    """benchmarks/quant.md's paragraph on vLLM's W8A8 reads results/quant-peers.json's w8a8 part."""
    part = json.loads((RESULTS / "quant-peers.json").read_text())["parts"]["w8a8"]["systems"]

    def reading(system: str, baseline: str) -> Repeats:
        return Repeats.of([a["tokens_per_s"] / b["tokens_per_s"] for a, b in
                           zip(part[system]["repeats"], part[baseline]["repeats"])])

    w8a8 = reading("vLLM int8 (W8A8)", "vLLM bfloat16")
    best = reading("minicb bfloat16", "vLLM int8 (W8A8)")
    assert w8a8.verdict("higher", "lower") == "higher"
    assert best.verdict("higher", "lower") == "lower"
    page = text("benchmarks/quant.md")
    assert f"vLLM's W8A8 served {w8a8.median:.2f}x its own bfloat16 in every repeat" in page
    assert f"minicb's best (bfloat16) {best.median:.2f}x of it, lower in every repeat" in page
    rates = {s: part[s]["tokens_per_s"]["median"] for s in part}
    assert (f"served {rates['minicb bfloat16 + int8']:.0f} tokens/s against its bfloat16's "
            f"{rates['minicb bfloat16']:.0f} here") in page


def test_the_one_request_profile_quant_md_quotes():
    """The llama.cpp paragraph's host and step times are the overhead run's; its GB/s ranges are
    the rendered table's (scripts/quant_peers.py streamed)."""
    summary = json.loads((RESULTS / "overhead-llama-100m-one-row.json").read_text())["summary"][0]
    page = text("benchmarks/quant.md")
    assert (f"measured {summary['host_us_median'] / 1e3:.2f} ms of host work" in page
            and f"in a {summary['step_us_median'] / 1e3:.1f} ms step" in page)
    lines = (ROOT / "benchmarks" / "quant.md").read_text().split("Weights read per second")[1]
    rows = {}
    for line in lines.split("<!-- quant-peers: end -->")[0].splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[2] != "GB/s" and not cells[2].startswith("-"):
            rows[cells[0]] = float(cells[2])
    llama = [rows["llama.cpp F32"], rows["llama.cpp BF16"]]
    ours = [rows["minicb float32"], rows["minicb bfloat16"]]
    assert f"llama.cpp reads the decoder's weights at {min(llama):.1f}-{max(llama):.1f} GB/s" \
        in page
    assert f"minicb's kernels at {min(ours):.1f}-{max(ours):.1f} GB/s, and at " \
           f"{rows['minicb int8']:.1f} GB/s in int8" in page

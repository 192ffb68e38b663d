"""scripts/quant_peers.py's reading of its record: which minicb is "best", the paired ratios,
the load stated, and the page section replaced between its markers (no peer runs here)."""

from __future__ import annotations

import pytest
from project_scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("quant_peers")


def system(rates: list[float], load: float) -> dict:
    return {"tokens_per_s": {"median": sorted(rates)[len(rates) // 2], "min": min(rates),
                             "max": max(rates)},
            "repeats": [{"tokens_per_s": r, "load": [[load, 0, 0], [load, 0, 0]]}
                        for r in rates]}


def record(load: float) -> dict:
    many = {"minicb float32": system([100, 110, 90], load),
            "minicb bfloat16": system([200, 220, 180], load),
            "minicb int8": system([150, 150, 150], load),
            "vLLM bfloat16": system([100, 100, 100], load),
            "vLLM float32": system([50, 50, 50], load),
            "llama.cpp Q8_0": system([75, 50, 150], load)}
    return {"machine_line": "2 cores", "parts": {"many": {
        "requests": 24, "at_once": 24, "prompt_tokens": 64, "output_tokens": 128,
        "systems": many}}}


def test_best_minicb_and_ratios_are_paired_repeat_by_repeat(script):
    part = record(1.0)["parts"]["many"]
    assert script.paired(part, "best minicb", "vLLM bfloat16") == ("minicb bfloat16",
                                                                   [2.0, 2.2, 1.8])
    # the best with int8 weights is chosen among the int8 systems only
    assert script.paired(part, "best minicb int8", "llama.cpp Q8_0") == ("minicb int8",
                                                                         [2.0, 3.0, 1.0])


def test_the_page_states_the_load_and_is_rewritten_in_place(script, tmp_path, monkeypatch):
    page = tmp_path / "quant.md"
    page.write_text("# Fewer bytes\n\nabove\n")
    monkeypatch.setattr(script, "PAGE", page)
    script.write_page(record(4.0))
    first = page.read_text()
    assert first.startswith("# Fewer bytes\n\nabove\n") and "Part many ran with the load" in first
    assert "| best minicb (minicb bfloat16) / vLLM bfloat16 | many | >= 1.3x | met |" in first
    assert "| minicb float32 / vLLM float32 | many | >= 1.5x | met |" in first
    script.write_page(record(1.0))             # a quiet rerun replaces the section, once
    second = page.read_text()
    assert second.count(script.BEGIN) == 1 and "ran with the load" not in second


def test_one_requests_rates_are_read_as_weight_bytes_per_second(script):
    """100M Llama: 8 layers of (1024 x 64 x 2 x (16 + 8)) attention and 3 x 1024 x 2816 MLP
    weights; 10 tokens/s in float32 reads 10 x 94,371,840 x 4 bytes a second."""
    assert script.decoder_weights("llama-100m") == 94_371_840
    part = {"systems": {"minicb float32": system([10, 10, 10], 1.0),
                        "llama.cpp Q8_0": system([32, 32, 32], 1.0)}}
    lines = "\n".join(script.streamed(part, "llama-100m"))
    assert "| minicb float32 | 4 | 3.8 |" in lines
    assert "| llama.cpp Q8_0 | 1.0625 | 3.2 |" in lines

"""bench quant runs end to end on a tiny model and records every format it compares."""

from __future__ import annotations

import json

from minicb.bench import quant


def test_bench_quant_records_each_format(tiny_llama, tmp_path):
    assert quant.main(["--model", tiny_llama, "--rows", "2", "--in-features", "64",
                       "--out-features", "40", "--requests", "2", "--prompt-len", "5",
                       "--max-tokens", "3", "--repeats", "1", "--calls", "1", "--context", "32",
                       "--out-dir", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "quant.json").read_text())
    assert set(record["engine"]) == set(quant.ENGINE)
    assert record["engine"]["int8 KV"]["tokens_per_s"]["median"] > 0
    assert set(record["linear"]["2"]) >= {"C float32", "C bfloat16", "C int8",
                                           "C int4 (groups of 32)"}
    assert record["attention"]["int8"]["us"]["median"] > 0
    assert record["build"].split(":")[0] in ("avx512_bf16", "avx512", "avx2", "generic", "native")


def test_kv_pressure_gives_int8_the_same_bytes_and_float32_the_preemptions(tiny_llama, tmp_path):
    """The pressure part sizes float32's pool from the bytes int8 needs for the whole batch: int8
    gets bytes_ratio times the blocks and runs without preempting; float32 preempts."""
    assert quant.main(["--model", tiny_llama, "--parts", "pressure", "--requests", "4",
                       "--prompt-len", "12", "--max-tokens", "12", "--repeats", "1",
                       "--out-dir", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "quant-pressure.json").read_text())["pressure"]
    float32, int8 = record["float32"], record["int8 KV"]
    assert int8["kv_blocks"] == int(float32["kv_blocks"] * record["bytes_ratio"])
    assert int8["kv_blocks"] >= record["blocks_needed"] > float32["kv_blocks"]
    assert int8["preemptions"]["max"] == 0 and float32["preemptions"]["min"] > 0

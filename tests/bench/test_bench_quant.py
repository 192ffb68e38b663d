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

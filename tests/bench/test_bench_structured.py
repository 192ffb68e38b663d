"""`python -m minicb bench structured` on a small scale: every kind timed at every batch size in
every repeat, the tokens/s ratios taken within a repeat, and every constrained output that
stopped by itself a JSON document."""

from __future__ import annotations

import json

from minicb.bench import structured


def test_a_small_run_times_every_kind_and_compares_within_repeats(tmp_path):
    assert structured.main(["--batch-sizes", "1,4", "--repeats", "2", "--max-tokens", "24",
                            "--calls", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "structured.json").read_text())
    kinds = {*structured.KINDS, "sampler", "decode_step"}
    for repeat in (0, 1):
        for rows in (1, 4):
            timed = {s["kind"]: s["ms"] for s in result["steps"]
                     if s["repeat"] == repeat and s["batch_size"] == rows}
            assert set(timed) == kinds and all(ms > 0 for ms in timed.values())
            runs = {r["method"]: r for r in result["generate"]
                    if r["repeat"] == repeat and r["batch_size"] == rows}
            assert set(runs) == set(structured.METHODS)
            schema_run = runs["json_schema"]
            assert schema_run["stopped_and_parsed"] == schema_run["stopped"]
    for rows in ("1", "4"):
        ratio = result["summary"][rows]["ratio"]["json_schema"]
        plain = [r for r in result["generate"] if r["method"] == "plain" and
                 r["batch_size"] == int(rows)]
        constrained = [r for r in result["generate"] if r["method"] == "json_schema" and
                       r["batch_size"] == int(rows)]
        assert ratio["ratios"] == [c["tokens_per_s"] / p["tokens_per_s"]
                                   for p, c in zip(plain, constrained)]
        assert ratio["min"] <= ratio["median"] <= ratio["max"]
        assert ratio["verdict"] == "no direction"     # two repeats never give one
        assert ratio["reading"].startswith("no direction from 2 alternated repeats")

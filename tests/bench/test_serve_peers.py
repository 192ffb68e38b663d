"""`python -m minicb bench serve-peers`: servers started pinned, measured in turn under one load,
summarised with their spread, and a difference called only by the book's one rule
(minicb.repeats: a sign test over the paired repeats for the direction, the median ratio for
the size)."""

from __future__ import annotations

import json
import math
import os

import pytest

from minicb.bench import serve_peers, vllm_peer
from minicb.bench.serve_peers import format_summary, main, summarize, verdicts
from minicb.serving.cluster import free_port


def run(server: str, rate: float, repeat: int, tokens: float, ttft: float) -> dict:
    """One run's row as measure() returns it, with the fields the summary reads."""
    return {"server": server, "request_rate": rate, "repeat": repeat, "failed": 0,
            "load_before": 1.0 + repeat, "load_after": 1.5, "output_throughput": tokens,
            "request_throughput": tokens / 32, "ttft_p50_s": ttft / 2, "ttft_p95_s": ttft,
            "tpot_p50_ms": 5.0, "tpot_p95_ms": 6.0, "e2e_p95_s": 1.0}


def test_a_direction_needs_five_agreeing_repeats_and_the_size_is_read_apart():
    naive = [(300, 2.0), (330, 1.5), (310, 3.0), (305, 2.5), (320, 2.0)]
    continuous = [(900, 0.1), (320, 0.2), (950, 0.15), (280, 0.3), (910, 0.1)]
    runs = ([run("naive", 10.0, i, t, f) for i, (t, f) in enumerate(naive)]
            + [run("continuous", 10.0, i, t, f) for i, (t, f) in enumerate(continuous)])
    summary = summarize(runs)
    assert [(r["server"], r["repeats"]) for r in summary] == [("naive", 5), ("continuous", 5)]
    assert summary[0]["output_throughput"] == {"median": 310, "min": 300, "max": 330}
    assert (summary[0]["load_min"], summary[0]["load_max"]) == (1.0, 5.0)
    (verdict,) = verdicts(runs, "continuous", "naive")
    # repeat by repeat, continuous ÷ naive throughput is 3.0, 0.97, 3.06, 0.92, 2.84: three up,
    # two down, no direction however large the median; every p95 TTFT ratio lies below 1
    assert verdict["throughput_ratio"] == pytest.approx(2.84375)
    assert verdict["throughput"] == "no direction"
    assert verdict["ttft_p95"] == "lower"
    assert verdict["ttft_p95_reading"].startswith("lower in every one of 5 alternated repeats")
    assert verdicts(runs, "naive", "continuous")[0]["ttft_p95"] == "higher"
    assert verdict["tpot_p50"] == "no direction"          # every repeat's TPOT the same: ties
    four = [r for r in runs if r["repeat"] < 4]     # four repeats never give a direction
    assert verdicts(four, "continuous", "naive")[0]["ttft_p95"] == "no direction"
    table = format_summary(summary).splitlines()
    assert len(table) == 4 and "| 10 | naive | 5 | 0 | 1.0–5.0 | 310 (300–330) |" in table[2]


def test_minicb_naive_and_continuous_alternated_under_one_load(tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["--servers", "naive", "continuous", "--request-rates", "20", "--repeats", "3",
                 "--num-prompts", "4", "--input-len", "8", "--output-len", "8",
                 "--base-port", str(free_port()), "--out-dir", str(out), "--name", "short"])
    assert code == 0
    record = json.loads((out / "short.json").read_text())
    assert (out / "short.png").stat().st_size > 0
    runs = record["runs"]
    # every repeat serves naive, then continuous: the two take turns
    assert [r["server"] for r in runs] == ["naive", "continuous"] * 3
    assert [r["repeat"] for r in runs] == [0, 0, 1, 1, 2, 2]
    for r in runs:
        assert (r["completed"], r["failed"], r["errors"]) == (4, 0, [])
        assert r["load_before"] >= 0 and r["load_after"] >= 0
        assert r["output_throughput"] > 0 and r["ttft_p95_s"] > 0
    # both do exactly the same work: the forced output lengths are the workload's
    assert len({r["output_tokens"] for r in runs}) == 1
    assert record["config"]["cpus"] == sorted(os.sched_getaffinity(0))
    for row in record["summary"]:
        assert row["repeats"] == 3
        for metric in serve_peers.METRICS:
            assert row[metric]["min"] <= row[metric]["median"] <= row[metric]["max"]
    (verdict,) = record["verdicts"]
    assert verdict["pair"] == "continuous vs naive" and math.isfinite(verdict["throughput_ratio"])
    assert {verdict["throughput"], verdict["ttft_p95"]} == {"no direction"}   # 3 repeats
    assert "continuous vs naive" in capsys.readouterr().out


def test_asking_for_vllm_without_its_environment_names_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINICB_VLLM_VENV", str(tmp_path / "no-such-venv"))
    with pytest.raises(SystemExit) as stopped:
        main(["--servers", "continuous", "vllm", "--out-dir", str(tmp_path)])
    assert stopped.value.code == 2
    assert "make peer-vllm" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))        # nothing started, nothing written


def test_vllm_server_under_the_same_load(tmp_path):
    try:
        vllm_peer.check_available()
    except vllm_peer.VLLMUnavailable:
        pytest.skip("vLLM's CPU build is not installed: `make peer-vllm` builds .venv-vllm "
                    "(about 5 minutes) and this test then serves it")
    out = tmp_path / "results"
    code = main(["--servers", "continuous", "vllm", "--request-rates", "20", "--repeats", "1",
                 "--num-prompts", "4", "--input-len", "8", "--output-len", "8",
                 "--base-port", str(free_port()), "--out-dir", str(out), "--name", "short"])
    assert code == 0
    record = json.loads((out / "short.json").read_text())
    assert [r["server"] for r in record["runs"]] == ["continuous", "vllm"]
    assert record["vllm_version"] and record["vllm_version"] != "unknown"
    # vLLM generated exactly the tokens asked for, as minicb did
    assert len({r["output_tokens"] for r in record["runs"]}) == 1
    assert all(r["completed"] == 4 and not r["errors"] for r in record["runs"])

"""bench graphs: refused without a GPU, and its tiny CPU configuration runs every system."""

from __future__ import annotations

import json

from minicb.bench import graphs


def test_without_a_gpu_it_refuses_and_names_the_way_out(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(graphs.torch.cuda, "is_available", lambda: False)
    assert graphs.main(["--out", str(tmp_path)]) == 2
    assert "need a CUDA GPU" in capsys.readouterr().err and "--smoke" in graphs.REFUSAL
    assert not list(tmp_path.iterdir())


def test_the_smoke_run_writes_every_system_with_the_eager_tokens(tmp_path):
    assert graphs.main(["--smoke", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "graphs-smoke.json").read_text())
    assert result["smoke"] and result["device_name"] == "cpu" and result["software"]["torch"]
    (case,) = result["cases"]
    systems = {row["system"]: row for row in case["systems"]}
    assert {"minicb-eager", "minicb-graphs", "hf-generate-batch", "hf-generate"} <= set(systems)
    assert systems["minicb-graphs"]["graph_steps"] > 0          # the graph path ran
    assert systems["minicb-eager"]["graph_steps"] == 0
    for row in systems.values():                               # float32: token for token
        assert row["requests_equal_to_eager"] == row["requests"] == 4
        assert row["tokens_per_s"] > 0


def test_the_record_renders_as_one_table_per_case_with_every_system(tmp_path):
    assert graphs.main(["--smoke", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "graphs-smoke.json").read_text())
    table = graphs.markdown_table(payload)
    rows = [line for line in table.splitlines() if line.startswith("| minicb") or
            line.startswith("| hf")]
    systems = payload["cases"][0]["systems"]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == [s["system"] for s in systems]
    eager = next(row for row in rows if row.startswith("| minicb-eager |"))
    assert " | 1.00 | 4 of 4 |" in eager         # eager against itself, every request equal
    assert "cpu" in table.splitlines()[0]

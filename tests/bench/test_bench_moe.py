"""`bench moe` on a tiny random MoE: the experts a step touches, counted by the engine."""

from __future__ import annotations

import json

from minicb.bench import moe


def test_one_row_touches_top_k_and_many_rows_touch_more(tmp_path):
    """One row reads exactly its k experts per layer; 16 rows read more, never more than E."""
    args = ["--experts", "8", "--top-k", "2", "--hidden", "64", "--layers", "1", "--batches",
            "1", "16", "--speed-batches", "--steps", "2", "--repeats", "1", "--out-dir",
            str(tmp_path)]
    assert moe.main(args) == 0
    record = json.loads((tmp_path / "moe-E8-k2.json").read_text())
    one, many = record["touched"]
    assert one["touched_per_layer"] == [2.0] and one["predicted"] == 2.0
    assert 2.0 < many["touched"] <= 8.0
    assert (tmp_path / "moe-E8-k2.png").exists() and record["speed"] == []

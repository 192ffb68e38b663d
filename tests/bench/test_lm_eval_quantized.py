"""scripts/lm_eval_quantized.py's reading of lm-eval's samples: the parse rate of generated lines,
each format's points against float32 and the gate, and the page section rewritten in place (no
lm-eval run here: that needs .venv-lmeval and minutes)."""

from __future__ import annotations

import json

import pytest
from project_scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("lm_eval_quantized")


def test_a_line_parses_alone_dedented_and_with_its_block_given_a_body(script):
    assert script.parses("    for i in range(", "len(self)):")
    assert script.parses('if __name__ == "__main__":\n    ', "main()")
    assert not script.parses("    for i in range(", "len(self):")        # unbalanced
    assert not script.parses("import collections.", "")                  # a dangling dot


def samples(accs, texts):
    mc = [{"acc": a} for a in accs]
    gen = [{"doc": {"context": "import ", "target": "os"}, "exact_match": float(t == "os"),
            "filtered_resps": [t]} for t in texts]
    return mc, gen


def test_points_are_hundredths_of_a_score_and_one_changed_item_fails_the_gate(script):
    base = script.scores(*samples([1, 1, 0, 0], ["os", "os", "sys", "("]))
    same = script.scores(*samples([1, 1, 0, 0], ["os", "os", "sys", "re"]))
    worse = script.scores(*samples([1, 0, 0, 0], ["os", "os", "sys", "("]))
    assert base["parse_rate"] == 0.75 and same["parse_rate"] == 1.0 and base["parse_items"] == 4
    verdicts = script.gate({"float32": base, "same scores": same, "one item lost": worse})
    assert verdicts["same scores"]["within_gate"] and verdicts["same scores"]["items_changed"] == 1
    assert verdicts["one item lost"]["acc_points"] == -25.0
    assert not verdicts["one item lost"]["within_gate"]


def test_the_committed_record_agrees_with_its_own_items(script):
    """What the committed JSON says about each format follows from the items it logged."""
    if not script.RESULTS.exists():
        pytest.skip("no lm-eval-quant.json committed yet: run scripts/lm_eval_quantized.py")
    record = json.loads(script.RESULTS.read_text())
    base = record["formats"]["float32"]
    for name, r in record["formats"].items():
        assert r["acc"] == pytest.approx(sum(r["acc_items"]) / len(r["acc_items"])), name
        assert r["acc_points"] == pytest.approx(100 * (r["acc"] - base["acc"])), name
        assert r["within_gate"] == (abs(r["acc_points"]) <= record["gate_points"]
                                    and abs(r["exact_match_points"]) <= record["gate_points"]), name
    assert script.render(record) in script.PAGE.read_text()


def test_the_page_section_is_replaced_in_place(script, tmp_path):
    base = script.scores(*samples([1, 0], ["os", "os"]))
    record = {"lm_eval": "0.4", "date": "2026-01-01", "load": [1.0, 1.2], "gate_points": 1.0,
              "formats": script.gate({"float32": base})}
    page = tmp_path / "quant.md"
    page.write_text("# Fewer bytes\n")
    script.write_page(record, page)
    script.write_page(record, page)
    text = page.read_text()
    assert text.count(script.MARKERS[0]) == 1 and "| float32 | 0.5000 | +0.0 |" in text

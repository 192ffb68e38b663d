"""The speculative-decoding benchmark: a tiny run end to end on the shipped model, the table's
invariants checked against its own runs, the arithmetic of its prediction by hand, and vLLM's
n-gram speculation for real where `make peer-vllm` has built it.

Speed is never asserted (that is what the benchmark is for); what is checked is that every run
is there, that speculation's greedy tokens equal the runs without it and transformers', and that
the summary's ratios, break-even points and acceptance figures come from the runs.
"""

from __future__ import annotations

import ast
import json
import statistics
import sys
import types
from pathlib import Path

import pytest

from minicb.bench import main as bench_main
from minicb.bench import vllm_peer
from minicb.bench.spec_model import markdown_tables, summarize_runs, tokens_per_step
from minicb.bench.speculative import add_agreement, requests_at
from minicb.bench.vllm_peer import driver_request
from minicb.config import SPECULATIVE_METHODS
from minicb.metrics import RequestMetrics
from minicb.sim import CostModel
from minicb.sim.speculative import break_even, predicted_speedup
from minicb.sim.workload import code_completion
from tests.bench.test_vllm_peer import FakeEngine, fake_config, load_driver

BATCHES = [1, 2]


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("speculative")
    code = bench_main(["speculative", "--quick", "--batch-sizes", *map(str, BATCHES),
                       "--repeats", "2", "--min-requests", "2", "--output-len", "32",
                       "--reference-prompts", "2", "--threads", "1", "--out-dir", str(out)])
    assert code == 0
    assert (out / "speculative-quick.png").stat().st_size > 0
    return json.loads((out / "speculative-quick.json").read_text())


def test_every_run_is_there_and_does_the_same_work(payload):
    methods = ["none", *[m for m in ("ngram", "draft_model") if m in SPECULATIVE_METHODS]]
    runs = payload["runs"]
    keys = {(r["workload"], r["method"], r["batch_size"], r["repeat"]) for r in runs}
    assert keys == {(w, m, b, r) for w in ("code", "random") for m in methods
                    for b in BATCHES for r in (0, 1)}
    for r in runs:
        assert r["requests"] == requests_at(r["batch_size"], 2)
        assert r["output_tokens"] == 32 * r["requests"]
        assert len(r["load_average"]) == 3
        # every token after the first comes from a step that gave that request 1..k+1 tokens
        hist = {int(t): c for t, c in r["tokens_per_step"].items()}
        assert sum(t * c for t, c in hist.items()) == r["output_tokens"] - r["requests"]
        assert max(hist) <= 1 + payload["settings"]["num_speculative_tokens"]
        assert r["decode_steps"] + r["other_steps"] == r["steps"]
        if r["method"] == "none":
            assert r["proposed_tokens"] == 0 and set(hist) == {1}
        else:
            assert 0 <= r["accepted_tokens"] <= r["proposed_tokens"]
            assert r["verify_steps"] <= sum(hist.values())


def test_speculation_is_greedy_exact(payload):
    for r in payload["runs"]:
        assert r["differs_from_transformers"] == 0, r
        assert r["differs_from_none"] == (None if r["method"] == "none" else 0), r
    assert all(s["greedy_equal"] for s in payload["summary"])
    # prompt lookup finds proposals and some are accepted, so verification rows were exercised
    ngram = [r for r in payload["runs"] if r["method"] == "ngram"]
    assert sum(r["accepted_tokens"] for r in ngram) > 0


def test_summary_ratios_come_from_paired_runs(payload):
    runs = payload["runs"]
    for s in payload["summary"]:
        ratios = []
        for repeat in (0, 1):
            pick = {r["method"]: r for r in runs if r["repeat"] == repeat and
                    (r["system"], r["workload"], r["batch_size"]) ==
                    (s["system"], s["workload"], s["batch_size"])}
            ratios.append(pick[s["method"]]["output_throughput"]
                          / pick["none"]["output_throughput"])
        assert s["speedup"] == pytest.approx(statistics.median(ratios))
    for b in payload["break_even"]:
        curve = {s["batch_size"]: s["speedup"] for s in payload["summary"]
                 if (s["system"], s["workload"], s["method"]) == (b["system"], b["workload"],
                                                                  b["method"])}
        assert b["paid_at"] == [size for size in sorted(curve) if curve[size] >= 1]
    labels = [p["label"] for p in payload["predictions"]]
    assert labels[0].startswith("PREDICTION for an A100")


def test_the_committed_run_is_exact_and_the_page_shows_it():
    """benchmarks/results/speculative.json: every proposer's greedy tokens equal the run without
    speculation and transformers', its summary is the one its runs give, and the page's tables
    are generated from it (`python -m minicb bench speculative --table ...`)."""
    root = Path(__file__).resolve().parents[2]
    payload = json.loads((root / "benchmarks/results/speculative.json").read_text())
    assert {s["method"] for s in payload["summary"] if s["system"] == "minicb"} == {
        "ngram", "draft_model"}
    assert {s["batch_size"] for s in payload["summary"]} == {1, 4, 16, 64}
    assert all(r["differs_from_transformers"] == 0 for r in payload["runs"])
    assert all(s["greedy_equal"] for s in payload["summary"])
    assert summarize_runs(payload["runs"]) == payload["summary"]
    assert markdown_tables(payload) in (root / "benchmarks/speculative.md").read_text()


def test_code_prompts_are_seeded_functions_cut_after_their_docstring():
    first, again, other = (code_completion(6, seed=s) for s in (1, 1, 2))
    assert first.extra["texts"] == again.extra["texts"] != other.extra["texts"]
    assert first.output_lens == [128] * 6
    for text in first.extra["texts"]:
        last = text.rstrip("\n").splitlines()[-1]
        body = last[:len(last) - len(last.lstrip())] + "pass\n"    # the docstring's indent
        (function,) = ast.parse(text + body).body
        assert isinstance(function, ast.FunctionDef) and ast.get_docstring(function)
        assert len(function.body) == 2                    # the docstring, then only our `pass`


def metrics_with_steps(token_steps: list[int]) -> RequestMetrics:
    return RequestMetrics(0.0, 0.0, 0.1, 0.2, 0.2, [0.1] * len(token_steps), 0, 0, 0, 0,
                          token_steps, 4, len(token_steps))


def test_tokens_per_step_leaves_out_the_first_token():
    # first token at step 3, then 3 tokens at step 4, 1 at step 5, 2 at step 6
    hist = tokens_per_step([metrics_with_steps([3, 4, 4, 4, 5, 6, 6])])
    assert hist == {"1": 1, "2": 1, "3": 1}


def row(method: str, repeat: int, tok_s: float, batch: int = 1) -> dict:
    return {"system": "minicb", "workload": "code", "method": method, "batch_size": batch,
            "repeat": repeat, "output_throughput": tok_s, "tpot_p50_ms": 1000 / tok_s,
            "proposed_tokens": 8, "accepted_tokens": 4, "verify_steps": 2,
            "differs_from_none": None if method == "none" else 0}


def test_a_differing_output_is_flagged_and_the_curve_crosses_one():
    rows = [row("none", 0, 100), row("ngram", 0, 150), row("none", 1, 100), row("ngram", 1, 130),
            row("none", 0, 300, 4), row("ngram", 0, 240, 4)]
    add_agreement(rows[4:], {"none": [[1, 2, 3]], "ngram": [[1, 2, 4]]}, [[1, 2, 3]])
    assert rows[5]["differs_from_none"] == 1 and rows[4]["differs_from_transformers"] == 0
    summary = summarize_runs(rows)
    assert [s["speedup"] for s in summary] == pytest.approx([1.4, 0.8])
    assert [s["greedy_equal"] for s in summary] == [True, False]
    assert summary[0]["mean_accepted_length"] == pytest.approx((8 + 4) / 4)   # pooled repeats
    assert break_even(summary)[0]["stops_paying_at"] == 4


@pytest.mark.parametrize("speedups, stops", [
    ({1: 1.2, 4: 0.9, 16: 0.8}, 4),
    ({1: 0.9, 4: 0.8, 16: 1.1}, None),          # it paid only at the largest size: still paying
    ({1: 1.2, 4: 0.9, 16: 1.1, 64: 0.8}, 64),    # lost at 4, paid again at 16: it stops at 64
    ({1: 0.9, 4: 0.8}, 0),
])
def test_break_even_is_where_speculation_stops_paying_for_good(speedups, stops):
    summary = [{"system": "minicb", "workload": "code", "method": "ngram", "batch_size": b,
                "speedup": x} for b, x in speedups.items()]
    assert break_even(summary)[0]["stops_paying_at"] == stops


def test_prediction_prices_verification_rows_as_prompt_tokens():
    cost = CostModel(step_overhead=1.0, prefill_token=0.1, decode_seq=0.05, context_token=0.0)
    rate = {"tokens_per_step": 2.0, "verify_share": 0.5, "proposed_per_verify": 4.0}
    # 4 rows: without, 1 + 4 * 0.05 = 1.2; with, 2 rows verify 5 tokens each (10 * 0.1) and 2
    # decode (2 * 0.05): 1 + 1.0 + 0.1 = 2.1; 2 tokens a step: 2 * 1.2 / 2.1
    assert predicted_speedup(cost, 4, 10, rate) == pytest.approx(2 * 1.2 / 2.1)
    # a draft: 4 steps at a quarter of the target's step each add 1.2 to the step with it
    assert predicted_speedup(cost, 4, 10, rate, 4, 0.25) == pytest.approx(2 * 1.2 / 3.3)


class CountingEngine(FakeEngine):
    """The fake vLLM engine, noting the most requests it ever held unfinished at a step."""

    most = 0

    def step(self):
        unfinished = sum(len(done) < wanted for _, wanted, done in self.requests.values())
        CountingEngine.most = max(CountingEngine.most, unfinished)
        return super().step()


def test_driver_serves_several_runs_through_one_engine_with_their_concurrency(monkeypatch):
    fake = types.ModuleType("vllm")
    fake.__version__ = "fake"
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    counters = {"vllm:spec_decode_num_drafts": 0, "vllm:spec_decode_num_draft_tokens": 0,
                "vllm:spec_decode_num_accepted_tokens": 0}
    started = []

    class LLM:
        def __init__(self, **kwargs):
            started.append(kwargs)
            self.llm_engine = CountingEngine()
            self.llm_engine.vllm_config = fake_config(kwargs)

        def generate(self, prompts, params, use_tqdm=False):
            return []

        def get_metrics(self):      # counters that grow as the engine steps
            for name in counters:
                counters[name] += 2
            return [types.SimpleNamespace(name=n, value=v) for n, v in counters.items()]

    fake.LLM = LLM
    monkeypatch.setitem(sys.modules, "vllm", fake)
    driver = load_driver()
    request = driver_request("/m", [[10]], [1], 64, {"max_num_seqs": 8,
                                                     "speculative_config": {"method": "ngram"}})
    request["runs"] = [{"prompts": [[10], [20], [30], [40], [50]], "output_lens": [3] * 5,
                        "max_concurrency": 2},
                       {"prompts": [[60]], "output_lens": [2], "max_concurrency": 1}]
    result = driver.run(request)
    assert len(started) == 1 and started[0]["disable_log_stats"] is False
    first, second = result["runs"]
    assert first["outputs"] == [[p, p + 1, p + 2] for p in (10, 20, 30, 40, 50)]
    assert second["outputs"] == [[60, 61]]
    assert CountingEngine.most == 2                 # never more than max_concurrency at once
    # each run's counts are the growth of vLLM's counters across it
    assert first["spec_decode"] == {"verify_steps": 2, "proposed_tokens": 2,
                                    "accepted_tokens": 2}


needs_vllm = pytest.mark.skipif(not (vllm_peer.venv_dir() / ".installed").exists(),
                                reason="vLLM's environment is not built (make peer-vllm); the "
                                       "tests above cover the benchmark without it")


@needs_vllm
def test_vllm_ngram_speculation_is_greedy_exact_and_counted():
    from minicb import default_model_path
    from minicb.bench.speculative import VLLM_NGRAM
    from tests.reference import hf_greedy

    # a repeating prompt: prompt lookup proposes from it
    prompts = [[5, 6, 7, 8, 9] * 6, [100, 200, 300, 400] * 5]
    runs = vllm_peer.run_vllm_runs(str(default_model_path()), [(prompts, [16, 16], 2),
                                                               (prompts[:1], [8], 1)],
                                   {"max_num_seqs": 2, "speculative_config": VLLM_NGRAM})
    references = hf_greedy(str(default_model_path()), prompts, [16, 16])
    assert runs[0].outputs == [r.token_ids for r in references]
    assert runs[1].outputs == [references[0].token_ids[:8]]
    spec = runs[0].settings["spec_decode"]
    assert 0 < spec["accepted_tokens"] <= spec["proposed_tokens"]

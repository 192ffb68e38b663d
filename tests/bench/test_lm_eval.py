"""lm-evaluation-harness scores the shipped model through `minicb serve` exactly as through its own
`hf` model on the same weights: every continuation's log-likelihood within TOLERANCE, every
greedy flag and generation equal, so the accuracies too (minicb.bench.lm_eval).

lm-eval lives in its own environment; without it the two runs skip, naming the command that
builds it (`make lm-eval`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minicb import default_model_path
from minicb.bench import lm_eval

needs_lm_eval = pytest.mark.skipif(lm_eval.lm_eval_executable() is None,
                                   reason=f"lm-eval is not installed: {lm_eval.SETUP_HINT}")


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> dict:
    return lm_eval.run_comparison(default_model_path(), tmp_path_factory.mktemp("lm-eval"))


@needs_lm_eval
def test_multiple_choice_scores_through_the_server_equal_the_hf_models(comparison):
    mc = comparison[lm_eval.MULTIPLE_CHOICE]
    assert mc["continuations"] == 4 * mc["items"] and mc["items"] >= 20
    assert mc["max_abs_loglikelihood_difference"] <= lm_eval.TOLERANCE
    assert mc["greedy_flags_equal"] == mc["continuations"]
    assert mc["items_scored_alike"] == mc["items"] and mc["acc_served"] == mc["acc_hf"]


@needs_lm_eval
def test_generations_through_the_server_equal_the_hf_models(comparison):
    gen = comparison[lm_eval.GENERATION]
    assert gen["texts_equal"] == gen["items"] >= 10
    assert gen["exact_match_served"] == gen["exact_match_hf"]


def test_the_committed_result_agrees_and_matches_its_tasks():
    """benchmarks/results/lm-eval.json (from `make lm-eval`) holds an agreeing run of these very
    tasks."""
    result = json.loads((Path(lm_eval.ROOT) / "benchmarks/results/lm-eval.json").read_text())
    mc, gen = result[lm_eval.MULTIPLE_CHOICE], result[lm_eval.GENERATION]
    tasks = lm_eval.TASKS_DIR
    assert mc["items"] == len((tasks / "stdlib_mc.jsonl").read_text().splitlines())
    assert gen["items"] == len((tasks / "stdlib_gen.jsonl").read_text().splitlines())
    assert mc["max_abs_loglikelihood_difference"] <= result["tolerance"]
    assert mc["acc_served"] == mc["acc_hf"] and gen["texts_equal"] == gen["items"]

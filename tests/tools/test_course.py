"""The course track's grader reaches the verdicts it must: the reference meets every bar, a
correct but slow build fails its bar, performance counts only after correctness, the accuracy
gate reads the tasks as lm-eval does and fails a build whose scores move, verdicts repeat.

The timed tests are the track's cost in CI: each bar runs 5 alternated pairs of fresh (forked)
processes, a fraction of a second of CPU each for the reference, a few times that for a slow
build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mutation import load_mutant, write_mutant

from minicb.repeats import Repeats
from minicb.tools import course_bench
from minicb.tools.course import MILESTONES, REFERENCE, measure_bar, verdict
from minicb.tools.course_accuracy import compare_scores, score_items
from minicb.tools.course_grade import grade_milestone, milestone_card
from minicb.tools.grade import LEAN_PYTEST, Check

ROOT = Path(__file__).resolve().parents[2]
SLOW = sorted(p.stem for p in (ROOT / "tests" / "exercises" / "mutants").glob("slow_*.py"))
TIMED = [(m.number, bar) for m in MILESTONES.values() for bar in m.bars if bar.timed]
# the random-operation checks that hold each slow mutant's chapter to minicb's own part, call
# for call: a slow mutant must pass them, or it would be a wrong build, not a slow one
SAME_AS_MINICB = {"03": "step_by_step", "04": "behaves_like", "07": "behaves_like",
                  "08": "proposer_behaves_like"}


@pytest.fixture(scope="module")
def slow_build(tmp_path_factory) -> Path:
    """solutions/ with every slow mutant applied (each edits a chapter of its own)."""
    folder = tmp_path_factory.mktemp("slow")
    write_mutant(SLOW[0], folder)
    for name in SLOW[1:]:
        scratch = tmp_path_factory.mktemp(name)
        write_mutant(name, scratch)
        chapter = load_mutant(name).CHAPTER
        for path in scratch.glob(f"ch{chapter}_*.py"):
            (folder / path.name).write_text(path.read_text())
    return folder


@pytest.fixture(scope="module")
def graded(slow_build):
    """measure_bar, each (bar, folder) graded once for the module: the repeat test grades again
    what the other tests graded, instead of twice more."""
    results = {}

    def grade(bar, folder):
        if (bar, folder) not in results:
            results[bar, folder] = measure_bar(bar, folder)
        return results[bar, folder]
    return grade


def test_every_milestone_has_a_slow_mutant():
    milestones = {str(load_mutant(name).MILESTONE) for name in SLOW}
    assert milestones == set(MILESTONES), f"milestones without one: {set(MILESTONES) - milestones}"


def test_the_slow_mutants_are_correct(slow_build):
    """Each slow mutant does what minicb's part does, call for call: only its speed is wrong."""
    chapters = {load_mutant(name).CHAPTER for name in SLOW}
    files = [str(p) for c in sorted(chapters)
             for p in (ROOT / "tests" / "exercises").glob(f"test_ch{c}_*.py")]
    checks = " or ".join(f"(ch{c} and {SAME_AS_MINICB[c]})" for c in sorted(chapters))
    run = subprocess.run([sys.executable, "-m", "pytest", *files, "-k", checks, "-q",
                          *LEAN_PYTEST, "--no-header"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, MINICB_GRADE_DIR=str(slow_build)), timeout=300)
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("number,bar", TIMED, ids=[f"m{n}-{b.measure}" for n, b in TIMED])
def test_the_reference_meets_every_timed_bar(number, bar, graded):
    result = graded(bar, REFERENCE)
    assert result.verdict == "full" and result.points == bar.points, (
        f"milestone {number}, {bar.name}: the reference against itself gave {result.ratio_text()}"
        f" ({result.verdict}; {result.reason})")


@pytest.mark.parametrize("name", SLOW)
def test_a_slow_but_correct_build_fails_its_bar(name, slow_build, graded):
    mutant = load_mutant(name)
    results = [graded(bar, slow_build) for bar in MILESTONES[str(mutant.MILESTONE)].bars
               if bar.timed and bar.measure in _measures_of(mutant.CHAPTER)]
    assert results and all(r.verdict == "zero" and r.points == 0 for r in results), [
        (r.bar.name, r.ratio_text(), r.verdict, r.reason) for r in results]


def _measures_of(chapter: str) -> set[str]:
    """The bars a chapter's code is timed by (a milestone's other bars time other chapters)."""
    return {"03": {"scheduler_step_us"}, "04": {"kv_manager_step_us"},
            "07": {"prefix_cache_request_us"}, "08": {"proposer_call_us"}}[chapter]


def test_two_gradings_give_the_same_verdicts(graded):
    """A second grading of the speculative track's timed bar gives the verdict the first gave.
    Graded on the reference against itself: its ratios sit nearest a bar (1 against 0.67), so
    that is where a verdict could flip; a slow build's sit far below theirs."""
    for bar in [bar for bar in MILESTONES["4"].bars if bar.timed]:
        first, second = graded(bar, REFERENCE), measure_bar(bar, REFERENCE)
        assert first.verdict == second.verdict == "full", (
            bar.name, first.ratio_text(), second.ratio_text())


def test_a_verdict_needs_the_repeats_on_one_side_of_the_bar():
    assert verdict(Repeats.of([0.9, 1.0, 1.1, 0.95, 1.05]), 0.67, 0.33) == "full"
    assert verdict(Repeats.of([0.5, 0.45, 0.55, 0.6, 0.5]), 0.67, 0.33) == "partial"
    assert verdict(Repeats.of([0.1, 0.12, 0.2, 0.11, 0.1]), 0.67, 0.33) == "zero"
    # one repeat above the bar, four below: the sign test cannot tell, and neither does the grader
    assert verdict(Repeats.of([0.7, 0.6, 0.62, 0.6, 0.64]), 0.67, 0.33) == "no verdict"
    assert verdict(Repeats.of([0.9, 1.0, 1.1]), 0.67, 0.33) == "no verdict"   # too few repeats


def test_performance_counts_only_after_correctness(tmp_path):
    failing = [Check("08", "greedy_accept", False, "emitted [3, 4], expected [3]")]
    grade = grade_milestone(tmp_path, "4", failing)
    assert grade.gate is None and all(r.verdict == "not measured" and r.points == 0
                                      for r in grade.bars)
    card = milestone_card(grade)
    assert "correctness first (1 checks fail)" in card and "performance 0/" in card, card


def test_the_accuracy_gate_reads_a_change_of_one_item():
    same = {"mc": [True, False, True, True], "gen": [True, False]}
    assert compare_scores(same, same).passed
    moved = {"mc": [True, True, True, True], "gen": [True, False]}
    result = compare_scores(moved, same)
    assert not result.passed and "items [1] differ" in result.summary, result.summary
    assert result.scores["mc"] == (100.0, 75.0)


def test_the_gate_scores_the_tasks_as_lm_eval_did():
    """Through the engine, the reference's two task scores equal lm-eval's recorded run on the
    same weights (benchmarks/results/lm-eval.json)."""
    recorded = json.loads((ROOT / "benchmarks" / "results" / "lm-eval.json").read_text())
    items = score_items(REFERENCE, ("kv_manager",), MILESTONES["2"].engine)
    assert sum(items["stdlib_mc"]) / len(items["stdlib_mc"]) == pytest.approx(
        recorded["minicb_stdlib_mc"]["acc_served"])
    assert sum(items["stdlib_gen"]) / len(items["stdlib_gen"]) == pytest.approx(
        recorded["minicb_stdlib_gen"]["exact_match_served"])


def test_the_acceptance_bar_counts_what_speculation_bought(tmp_path):
    """The counted bar: the reference's tokens per verification step, and the larger count of a
    build that also accepts the target's second choice: a speedup that changes what the model
    says. Parity stops that build first (mutants/ch08_accepts_second_choice.py, caught in the
    mutation test), which is why performance counts only after correctness."""
    write_mutant("ch08_accepts_second_choice", tmp_path)
    reference = course_bench.acceptance_length(REFERENCE)
    assert 1.5 < reference < course_bench.acceptance_length(tmp_path)

"""Every mutant in tests/exercises/mutants/ (a plausible student bug) fails a grader check.

Each mutant is applied to a copy of solutions/ and graded on its chapter's fast checks that
should catch it: a mutant that passes them all means the grader would give a wrong answer full
marks. exercises/README.md reports the resulting mutation score.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = sorted(path.stem for path in (ROOT / "tests" / "exercises" / "mutants").glob("ch*.py"))
MUTANT_RUN_TIMEOUT_S = 120


def load_mutant(name: str):
    path = ROOT / "tests" / "exercises" / "mutants" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"mutant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_mutant(name: str, folder: Path) -> None:
    """solutions/ copied into `folder`, with the mutant's edits applied to its chapter."""
    mutant = load_mutant(name)
    for source in (ROOT / "solutions").glob("ch*.py"):
        shutil.copy(source, folder / source.name)
    target = next(folder.glob(f"ch{mutant.CHAPTER}_*.py"))
    text = target.read_text()
    for old, new in mutant.EDITS:
        assert text.count(old) == 1, (f"mutant {name}: {old!r} should occur once in "
                                      f"solutions/{target.name}, found {text.count(old)}; update "
                                      "the mutant to the solution's current text.")
        text = text.replace(old, new)
    target.write_text(text)


def test_there_are_mutants_for_every_chapter():
    sys.path.insert(0, str(ROOT / "tests" / "exercises"))
    try:
        from adapter import CHAPTERS
    finally:
        sys.path.pop(0)
    covered = {load_mutant(name).CHAPTER for name in MUTANTS}
    assert covered == set(CHAPTERS), f"chapters without a mutant: {sorted(set(CHAPTERS) - covered)}"


@pytest.mark.timeout(MUTANT_RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize("name", MUTANTS)
def test_mutant_fails_a_grader_check(name, tmp_path):
    mutant = load_mutant(name)
    write_mutant(name, tmp_path)
    env = dict(os.environ, MINICB_GRADE_DIR=str(tmp_path), TRITON_INTERPRET="1")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/exercises", "-k", mutant.CHECKS, "-x", "-q",
         "-p", "no:cacheprovider", "--no-header", "-rN"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=MUTANT_RUN_TIMEOUT_S)
    summary = run.stdout.strip().splitlines()[-1:] or ["(no output)"]
    assert run.returncode == 1 and " failed" in summary[0], (
        f"mutant {name} ({mutant.WHAT}) was not caught by the checks {mutant.CHECKS!r}: "
        f"pytest said {summary[0]!r} (exit {run.returncode}).\n{run.stderr[-2000:]}")


def test_the_unmutated_copy_passes_the_checks_that_kill_mutants(tmp_path):
    """Without this, a mutant could 'fail' because grading a copied folder itself is broken."""
    for source in (ROOT / "solutions").glob("ch*.py"):
        shutil.copy(source, tmp_path / source.name)
    checks = " or ".join(f"({load_mutant(name).CHECKS})" for name in MUTANTS)
    env = dict(os.environ, MINICB_GRADE_DIR=str(tmp_path), TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/exercises", "-k", checks, "-q",
                          "-p", "no:cacheprovider", "--no-header"],
                         cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=MUTANT_RUN_TIMEOUT_S * 2)
    assert run.returncode == 0, f"a copy of solutions/ fails its own checks:\n{run.stdout[-3000:]}"


def test_the_readme_reports_every_mutant():
    readme = (ROOT / "exercises" / "README.md").read_text()
    count = len(MUTANTS)
    assert f"Mutation score: {count} of {count} mutants caught (100%)" in readme, \
        f"exercises/README.md should report the mutation score over all {count} mutants"
    missing = [name for name in MUTANTS if f"`{name}`" not in readme]
    assert not missing, f"exercises/README.md does not list the mutants {missing}"

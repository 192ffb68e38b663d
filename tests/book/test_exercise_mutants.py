"""Every mutant in tests/exercises/mutants/ (a plausible student bug) fails a grader check.

Each mutant is applied to a copy of solutions/ and graded on its chapter's fast checks that
should catch it: a mutant that passes them all means the grader would give a wrong answer full
marks. exercises/README.md reports the resulting mutation score.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mutation import MUTANTS, load_mutant, write_mutant

from minicb.tools.grade import LEAN_PYTEST

ROOT = Path(__file__).resolve().parents[2]
MUTANT_RUN_TIMEOUT_S = 120


def test_there_are_mutants_for_every_chapter():
    sys.path.insert(0, str(ROOT / "tests" / "exercises"))
    try:
        from adapter import CHAPTERS
    finally:
        sys.path.pop(0)
    covered = {load_mutant(name).CHAPTER for name in MUTANTS}
    assert covered == set(CHAPTERS), f"chapters without a mutant: {sorted(set(CHAPTERS) - covered)}"


def pytest_generate_tests(metafunc):
    if metafunc.cls is not None and issubclass(metafunc.cls, MutantsOfOneChapter):
        metafunc.parametrize("name", [name for name in MUTANTS
                                      if load_mutant(name).CHAPTER == metafunc.cls.CHAPTER])


class MutantsOfOneChapter:
    """Each chapter's mutants are a class of their own: make test's workers (pytest-xdist,
    --dist loadscope) take a class at a time, so the chapters' mutants, each graded in a process
    of its own, are shared out between the cores instead of queueing on one."""

    CHAPTER = ""

    @pytest.mark.timeout(MUTANT_RUN_TIMEOUT_S + 30)
    def test_mutant_fails_a_grader_check(self, name, tmp_path):
        _grade_mutant(name, tmp_path)


class TestChapter00Mutants(MutantsOfOneChapter):
    CHAPTER = "00"


class TestChapter01Mutants(MutantsOfOneChapter):
    CHAPTER = "01"


class TestChapter02Mutants(MutantsOfOneChapter):
    CHAPTER = "02"


class TestChapter03Mutants(MutantsOfOneChapter):
    CHAPTER = "03"


class TestChapter04Mutants(MutantsOfOneChapter):
    CHAPTER = "04"


class TestChapter05Mutants(MutantsOfOneChapter):
    CHAPTER = "05"


class TestChapter06Mutants(MutantsOfOneChapter):
    CHAPTER = "06"


class TestChapter07Mutants(MutantsOfOneChapter):
    CHAPTER = "07"


class TestChapter08Mutants(MutantsOfOneChapter):
    CHAPTER = "08"


class TestChapter09Mutants(MutantsOfOneChapter):
    CHAPTER = "09"


class TestChapter10Mutants(MutantsOfOneChapter):
    CHAPTER = "10"


class TestChapter12Mutants(MutantsOfOneChapter):
    CHAPTER = "12"


class TestChapter13Mutants(MutantsOfOneChapter):
    CHAPTER = "13"


class TestChapter14Mutants(MutantsOfOneChapter):
    CHAPTER = "14"


def test_every_mutant_has_its_chapters_class():
    classes = {cls.CHAPTER for cls in MutantsOfOneChapter.__subclasses__()}
    missing = sorted({load_mutant(name).CHAPTER for name in MUTANTS} - classes)
    assert not missing, f"mutants of chapters {missing} have no TestChapterNNMutants class"


def _grade_mutant(name: str, tmp_path: Path) -> None:
    mutant = load_mutant(name)
    write_mutant(name, tmp_path)
    env = dict(os.environ, MINICB_GRADE_DIR=str(tmp_path), TRITON_INTERPRET="1")
    # every check is named after its chapter (CHECKS starts with "chNN and"): collecting only that
    # chapter's test files selects the same tests without importing the other chapters' modules
    assert mutant.CHECKS.startswith(f"ch{mutant.CHAPTER} and "), mutant.CHECKS
    files = sorted(f"tests/exercises/{p.name}"
                   for p in (ROOT / "tests" / "exercises").glob(f"test_ch{mutant.CHAPTER}_*.py"))
    assert files, f"no tests/exercises/test_ch{mutant.CHAPTER}_*.py for mutant {name}"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *files, "-k", mutant.CHECKS, "-x", "-q", *LEAN_PYTEST,
         "--no-header", "-rN"],
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
                          *LEAN_PYTEST, "--no-header"],
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

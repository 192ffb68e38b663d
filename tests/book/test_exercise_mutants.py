"""Every mutant in tests/exercises/mutants/ (a plausible student bug) fails a grader check.

Each mutant is applied to a copy of solutions/ and graded on its chapter's fast checks that
should catch it: a mutant that passes them all means the grader would give a wrong answer full
marks. exercises/README.md reports the resulting mutation score.
"""

from __future__ import annotations

import json
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


@pytest.fixture(scope="class")
def graded(request, tmp_path_factory) -> dict[str, dict]:
    """Every mutant of the class's chapters graded on its checks, all in one fresh process (each
    mutant in a folder of its own; see mutation.grade_in_one_process), each chapter's first after
    an unmutated copy of solutions/ graded on all of its mutants' checks."""
    names = [name for name in MUTANTS if load_mutant(name).CHAPTER in request.cls.CHAPTERS]
    return _grade_mutants(names, tmp_path_factory.mktemp("mutants"))


class MutantsOfSomeChapters:
    """The chapters' mutants in two classes, each graded in one process: make test's workers
    (pytest-xdist, --dist loadscope) take a class at a time, so the two share the cores, and
    torch, transformers and the graders' fixtures are imported twice rather than once a
    chapter (about 3 s of CPU each). The split balances the chapters' grading times."""

    CHAPTERS: tuple[str, ...] = ()

    @pytest.mark.timeout(MUTANT_RUN_TIMEOUT_S * 30)
    def test_mutant_fails_a_grader_check(self, name, graded):
        mutant, verdict = load_mutant(name), graded[name]
        assert verdict["exit"] == 1 and verdict["failed"], (
            f"mutant {name} ({mutant.WHAT}) was not caught by the checks {mutant.CHECKS!r}: "
            f"{verdict['passed']} passed, none failed (pytest exit {verdict['exit']}).")

    def test_the_unmutated_copy_passes_the_checks_that_kill_mutants(self, graded):
        """Without this, a mutant could 'fail' because grading a copied folder itself is
        broken."""
        for chapter in self.CHAPTERS:
            verdict = graded[unmutated(chapter)]
            assert verdict["exit"] == 0 and verdict["passed"] and not verdict["failed"], (
                f"a copy of solutions/ fails its own chapter {chapter} checks: {verdict}")


def pytest_generate_tests(metafunc):
    if (metafunc.cls is not None and issubclass(metafunc.cls, MutantsOfSomeChapters)
            and "name" in metafunc.fixturenames):
        metafunc.parametrize("name", [name for name in MUTANTS
                                      if load_mutant(name).CHAPTER in metafunc.cls.CHAPTERS])


class TestMutantsGroupA(MutantsOfSomeChapters):
    CHAPTERS = ("00", "01", "02", "04", "09", "13", "14")


class TestMutantsGroupB(MutantsOfSomeChapters):
    CHAPTERS = ("03", "05", "06", "07", "08", "10", "12")


def test_every_mutants_chapter_is_graded_once():
    chapters = [c for cls in MutantsOfSomeChapters.__subclasses__() for c in cls.CHAPTERS]
    assert len(chapters) == len(set(chapters)), "a chapter is in two classes"
    missing = sorted({load_mutant(name).CHAPTER for name in MUTANTS} - set(chapters))
    assert not missing, f"mutants of chapters {missing} are in no MutantsOfSomeChapters class"


def unmutated(chapter: str) -> str:
    return f"(unmutated ch{chapter})"


def _grade_mutants(names: list[str], folder: Path) -> dict[str, dict]:
    jobs, chapters = [], {}
    for name in names:
        mutant = load_mutant(name)
        (folder / name).mkdir()
        write_mutant(name, folder / name)
        # every check is named after its chapter (CHECKS starts with "chNN and"): collecting only
        # that chapter's test files selects the same tests without importing the other chapters
        assert mutant.CHECKS.startswith(f"ch{mutant.CHAPTER} and "), mutant.CHECKS
        files = sorted(f"tests/exercises/{p.name}" for p in
                       (ROOT / "tests" / "exercises").glob(f"test_ch{mutant.CHAPTER}_*.py"))
        assert files, f"no tests/exercises/test_ch{mutant.CHAPTER}_*.py for mutant {name}"
        job = {"name": name, "folder": str(folder / name), "files": files,
               "checks": mutant.CHECKS, "lean": LEAN_PYTEST}
        chapters.setdefault(mutant.CHAPTER, []).append(job)
    (folder / "unmutated").mkdir()
    for source in (ROOT / "solutions").glob("ch*.py"):
        shutil.copy(source, folder / "unmutated" / source.name)
    for chapter, own in chapters.items():
        jobs += [{"name": unmutated(chapter), "folder": str(folder / "unmutated"),
                  "files": own[0]["files"], "lean": LEAN_PYTEST,
                  "checks": " or ".join(f"({job['checks']})" for job in own)}, *own]
    (folder / "jobs.json").write_text(json.dumps(jobs))
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "mutation.py"), str(folder / "jobs.json"),
         str(folder / "verdicts.json")],
        cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True,
        timeout=MUTANT_RUN_TIMEOUT_S * len(jobs))
    assert run.returncode == 0, f"grading the mutants {names} broke:\n{run.stderr[-3000:]}"
    return json.loads((folder / "verdicts.json").read_text())


def test_the_readme_reports_every_mutant():
    readme = (ROOT / "exercises" / "README.md").read_text()
    count = len(MUTANTS)
    assert f"Mutation score: {count} of {count} mutants caught (100%)" in readme, \
        f"exercises/README.md should report the mutation score over all {count} mutants"
    missing = [name for name in MUTANTS if f"`{name}`" not in readme]
    assert not missing, f"exercises/README.md does not list the mutants {missing}"

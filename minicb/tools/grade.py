"""python -m minicb grade PATH: grade a student's copy of exercises/ with the book's exercise tests.

PATH is a folder holding the chapter files (ch01_kv_loop.py, ...) or a zip of one. The scorecard
lists each chapter's checks, failures first, one line each; -v adds the full tracebacks. Each
chapter is graded on its own: a chapter whose file is missing or does not parse costs that
chapter alone, and its scorecard's first line says why.
--milestone N grades a milestone of the course track (course/README.md): its chapters' checks,
then the accuracy gate and the performance bars (minicb.tools.course).
--json FILE writes Gradescope's autograder results (tests with name, score, max_score, output);
--batch FOLDER grades every submission in FOLDER (sub-folders and zips) into one --csv file.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from minicb.tools.chapters import CHAPTERS, first_stub, why_not_loadable

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "exercises"
CHAPTER_FILES = tuple(CHAPTERS.values())
RUN_TIMEOUT_S = 1800
LOADS = "loads"          # the one check of a chapter that could not be loaded


@dataclass
class Check:
    chapter: str
    name: str
    passed: bool
    message: str = ""        # the failure's first line
    details: str = ""        # the full traceback

    @property
    def reached_a_stub(self) -> bool:
        """Failed on a NotImplementedError: the student has not written that part yet."""
        return not self.passed and "NotImplementedError" in (_raised(self.details)
                                                             or self.message)


def find_chapters(path: Path, scratch: Path) -> Path:
    """The folder holding the chapter files: PATH itself, inside it, or inside a zip of it."""
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            archive.extractall(scratch)
        path = scratch
    if not path.is_dir():
        raise SystemExit(f"grade: {path} is neither a folder nor a zip of exercises/.")
    found = sorted((p.parent for name in CHAPTER_FILES for p in path.rglob(f"{name}.py")
                    if "__MACOSX" not in p.parts), key=lambda p: len(p.parts))
    if not found:
        raise SystemExit(f"grade: no chapter file ({CHAPTER_FILES[0]}.py, ...) under {path}.")
    return found[0]


# Plugins a grading run never uses (notebooks, property-based and schema testing): pytest loads
# every installed plugin at start-up, and these three cost seconds a run; each mutant and each
# `grade` pays them again. And the one that reports exceptions raised where nothing can catch
# them (in __del__, say): at the end of every session it runs the garbage collector over the
# whole heap, torch and transformers included, several times (a quarter of a second of CPU a
# session, over a third of grading many mutants in one process).
LEAN_PYTEST = ["-p", "no:cacheprovider", "-p", "no:nbval", "-p", "no:hypothesispytest",
               "-p", "no:schemathesis", "-p", "no:unraisableexception"]


def run_checks(folder: Path, chapters: list[str] | None = None) -> tuple[list[Check], str]:
    """Run the exercise tests of `chapters` (every chapter by default) on `folder`'s files.

    A chapter whose file is missing or does not parse is not run: it gets one failing check
    saying why. The rest run in one pytest, which carries on past a chapter whose file fails
    while it is imported (--continue-on-collection-errors), so one bad file costs one chapter.
    """
    if not TESTS.is_dir():
        raise SystemExit(f"grade: the exercise tests are not at {TESTS}; grading needs minicb "
                         "installed from a clone of its repository (pip install -e .).")
    chapters = chapters or list(CHAPTERS)
    checks, runnable = [], []
    for number in chapters:
        why = why_not_loadable(folder, number)
        if why:
            checks.append(Check(number, LOADS, False, why, why))
        else:
            runnable.append(number)
    files = [str(path) for number in runnable
             for path in sorted(TESTS.glob(f"test_ch{number}_*.py"))]
    if not files:
        return checks, ""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        env = dict(os.environ, MINICB_GRADE_DIR=str(folder.resolve()))
        env.setdefault("TRITON_INTERPRET", "0" if _has_cuda() else "1")
        command = [sys.executable, "-m", "pytest", *files, "-q", *LEAN_PYTEST,
                   "--continue-on-collection-errors", f"--junitxml={report}", "--tb=long",
                   "-o", "junit_family=xunit1"]
        run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S)
        if not report.exists():
            raise SystemExit(f"grade: pytest did not run:\n{run.stdout}\n{run.stderr}")
        return checks + parse_report(report), run.stdout


def parse_report(report: Path) -> list[Check]:
    checks = []
    for case in ElementTree.parse(report).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            problem = case.find("skipped")
        if not module:          # a test file that failed to import: its chapter's file did
            module = case.get("name", "").rsplit(".", 1)[-1]
            chapter = module[len("test_ch"):len("test_ch00")]
            if any(c.chapter == chapter and c.name == LOADS for c in checks):
                continue        # (chapter 04's second test file says the same)
            why = _why_import_failed(problem.text or "" if problem is not None else "")
            checks.append(Check(chapter, LOADS, False, why, "" if problem is None
                                else problem.text or ""))
            continue
        chapter = module[len("test_ch"):len("test_ch00")] if module.startswith("test_ch") else "?"
        message = "" if problem is None else (problem.get("message") or "").strip()
        name = case.get("name", "?").removeprefix(f"test_ch{chapter}_")
        checks.append(Check(chapter, name, problem is None,
                            _first_line(message), "" if problem is None else problem.text or ""))
    return checks


def _raised(traceback: str) -> str:
    """The exception a pytest traceback ends with ("E   KeyError: 3" lines), on one line."""
    lines = [line[1:].strip() for line in traceback.splitlines() if line.startswith("E ")]
    return " ".join(lines[-3:]) if lines else ""


def _why_import_failed(traceback: str) -> str:
    """'could not import: <the error> (<file> line N)', the line in the student's own file."""
    where = ""
    for line in traceback.splitlines():
        for name in CHAPTER_FILES:
            marker = f"{name}.py:"
            if marker in line and not line.lstrip().startswith("E "):
                where = f" ({name}.py line {line.split(marker)[1].split(':')[0]})"
    return f"could not import: {_raised(traceback) or 'collection failure'}{where}"


def _first_line(message: str, width: int = 200) -> str:
    """The failure message on one line (its own lines joined), shortened to `width`."""
    message = message.removeprefix("AssertionError: ").split("\nassert ")[0]  # pytest's echo
    line = " ".join(message.split())
    return line if len(line) <= width else line[:width - 3] + "..."


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def ordered(checks: list[Check]) -> list[Check]:
    """Failures first (a failing worked example before the rest), then what passed."""
    return sorted(checks, key=lambda c: (c.passed, "worked_examples" not in c.name))


def chapter_card(chapter: str, mine: list[Check], folder: Path | None = None,
                 verbose: bool = False) -> list[str]:
    """One chapter's lines. The first says why the chapter failed when one reason covers it:
    a file that could not be loaded, or stubs not yet written (then: where to start)."""
    in_file_order, mine = mine, ordered(mine)
    passed = sum(c.passed for c in mine)
    head = f"ch{chapter}  {passed}/{len(mine)} checks passed"
    stubs = [c for c in mine if c.reached_a_stub]
    if any(c.name == LOADS for c in mine):
        return [f"ch{chapter}  not graded: {mine[0].message}"] + (
            ["        " + line for line in mine[0].details.splitlines()] if verbose else [])
    start = None
    if stubs and folder is not None:
        found = first_stub(folder / f"{CHAPTERS[chapter]}.py")
        # the worked examples, else the chapter's first check (each file starts with its smallest)
        smallest = next((c.name for c in mine if "worked_examples" in c.name),
                        next(c.name for c in in_file_order if c.reached_a_stub))
        if found:
            start = (f"write {found[0]} first ({CHAPTERS[chapter]}.py line {found[1]}); the "
                     f"smallest check is {smallest}"
                     + (", the examples in its docstrings" if "worked" in smallest else ""))
    lines = [head + (f": not started; {start}" if start and not passed and len(stubs) == len(mine)
                     else "")]
    for check in mine:
        if check.passed:
            lines.append(f"  ok    {check.name}")
        elif check.reached_a_stub and not verbose:
            continue
        else:
            lines.append(f"  FAIL  {check.name}: {check.message}")
            if verbose:
                lines += ["        " + line for line in check.details.splitlines()]
    if stubs and not verbose:
        lines.insert(1, f"  TODO  {len(stubs)} checks reach a NotImplementedError"
                     + (f"; next: {start}" if start and passed else "") + " (V=1 lists them)")
    return lines


def scorecard(checks: list[Check], verbose: bool = False, folder: Path | None = None) -> str:
    lines = []
    for chapter in sorted({c.chapter for c in checks}):
        lines += chapter_card(chapter, [c for c in checks if c.chapter == chapter], folder,
                              verbose)
    total = sum(c.passed for c in checks)
    lines.append(f"total  {total}/{len(checks)} checks passed "
                 f"({100 * total / max(len(checks), 1):.0f}%)")
    return "\n".join(lines)


def gradescope(checks: list[Check], more: list[dict] = ()) -> dict:
    """Gradescope's autograder results.json: one point per check, then `more` tests (a
    milestone's accuracy gate and performance bars, scored on their own)."""
    tests = [{"name": f"ch{c.chapter} {c.name}", "score": float(c.passed), "max_score": 1.0,
              "output": "passed" if c.passed else f"{c.message}\n\n{c.details}".strip()}
             for c in checks] + list(more)
    return {"score": float(sum(t["score"] for t in tests)), "tests": tests}


@contextlib.contextmanager
def submission(path: Path) -> Iterator[Path]:
    """The folder of a submission's chapter files, unpacked while in use if it is a zip."""
    with tempfile.TemporaryDirectory() as scratch:
        yield find_chapters(path, Path(scratch))


def problems(checks: list[Check]) -> str:
    """Why chapters could not be graded, for the CSV's problem column."""
    return "; ".join(f"ch{c.chapter}: {c.message}" for c in checks if c.name == LOADS)


def grade_batch(folder: Path, out: Path, chapter: str | None, milestone: str | None) -> None:
    from minicb.tools import course_grade
    submissions = sorted(p for p in folder.iterdir()
                         if p.is_dir() or (p.is_file() and zipfile.is_zipfile(p)))
    chapters = ([chapter] if chapter else list(course_grade.chapters_of(milestone)) if milestone
                else list(CHAPTERS))
    extra = course_grade.csv_header(milestone) if milestone else []
    with open(out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["submission", *(f"ch{c}" for c in chapters), "passed", "checks",
                         "percent", *extra, "problem"])
        for path in submissions:
            try:
                with submission(path) as graded:
                    checks, _ = run_checks(graded, chapters)
                    result = course_grade.grade_milestone(graded, milestone, checks) \
                        if milestone else None
            except SystemExit as problem:          # one broken submission never stops the batch
                writer.writerow([path.name, *([""] * len(chapters)), 0, 0, 0,
                                 *([""] * len(extra)), str(problem)])
                continue
            passed = sum(c.passed for c in checks)
            per_chapter = [f"{sum(c.passed for c in checks if c.chapter == ch)}/"
                           f"{sum(c.chapter == ch for c in checks)}" for ch in chapters]
            writer.writerow([path.name, *per_chapter, passed, len(checks),
                             f"{100 * passed / max(len(checks), 1):.1f}",
                             *(course_grade.csv_row(result) if result else []), problems(checks)])
            points = (", performance {:g}/{:g}".format(*course_grade.performance_points(result))
                      if result else "")
            print(f"{path.name}: {passed}/{len(checks)}{points}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicb grade", description=__doc__.split(
        "\n")[0])
    parser.add_argument("path", nargs="?", type=Path,
                        help="a student's exercises/ folder, or a zip of it")
    parser.add_argument("--chapter", help="grade one chapter only, e.g. 03")
    parser.add_argument("--milestone", help="grade one milestone of the course track (1-4): "
                        "its chapters, the accuracy gate and the performance bars")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="full tracebacks under each failing check")
    parser.add_argument("--json", type=Path, help="write Gradescope's results.json here")
    parser.add_argument("--report", type=Path,
                        help="with --milestone: write the milestone's report template here, its "
                        "measured table filled in")
    parser.add_argument("--batch", type=Path,
                        help="a folder of submissions (folders or zips), graded into --csv")
    parser.add_argument("--csv", type=Path, default=Path("grades.csv"),
                        help="where --batch writes one row per submission (default grades.csv)")
    args = parser.parse_args(argv)
    chapter = args.chapter.zfill(2) if args.chapter else None
    if chapter and chapter not in CHAPTERS:
        parser.error(f"--chapter {args.chapter}: the chapters are {', '.join(CHAPTERS)}")
    if args.milestone:
        from minicb.tools.course import MILESTONES
        if args.milestone not in MILESTONES:
            parser.error(f"--milestone {args.milestone}: the milestones are "
                         f"{', '.join(MILESTONES)}")
    if args.batch:
        grade_batch(args.batch, args.csv, chapter, args.milestone)
        print(f"wrote {args.csv}")
        return 0
    if args.path is None:
        parser.error("give PATH (a folder or zip of exercises/) or --batch FOLDER")
    if args.milestone:
        from minicb.tools import course_grade
        return course_grade.main(args.path, args.milestone, args.verbose, args.json,
                                 args.report)
    with submission(args.path) as folder:
        checks, _ = run_checks(folder, [chapter] if chapter else None)
        print(scorecard(checks, verbose=args.verbose, folder=folder))
    if args.json:
        args.json.write_text(json.dumps(gradescope(checks), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if checks and all(c.passed for c in checks) else 1

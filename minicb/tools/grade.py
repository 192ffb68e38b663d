"""python -m minicb grade PATH: grade a student's copy of exercises/ with the book's exercise tests.

PATH is a folder holding the chapter files (ch01_kv_loop.py, ...) or a zip of one. The scorecard
lists each chapter's checks, failures first, one line each; -v adds the full tracebacks.
--json FILE writes Gradescope's autograder results (tests with name, score, max_score, output);
--batch FOLDER grades every submission in FOLDER (sub-folders and zips) into one --csv file.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "exercises"
CHAPTER_FILES = ("ch00_load_test", "ch01_kv_loop", "ch02_static_batch", "ch03_scheduler_step",
                 "ch04_block_allocator", "ch05_decode_kernel", "ch06_serving_metrics",
                 "ch07_prefix_cache", "ch08_speculative", "ch09_routing", "ch10_overlap")
RUN_TIMEOUT_S = 1800


@dataclass
class Check:
    chapter: str
    name: str
    passed: bool
    message: str = ""        # the failure's first line
    details: str = ""        # the full traceback


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
# `grade` pays them again.
LEAN_PYTEST = ["-p", "no:cacheprovider", "-p", "no:nbval", "-p", "no:hypothesispytest",
               "-p", "no:schemathesis"]


def run_checks(folder: Path, chapter: str | None = None) -> tuple[list[Check], str]:
    """Run the exercise tests on `folder`'s chapter files; the checks and pytest's own output."""
    if not TESTS.is_dir():
        raise SystemExit(f"grade: the exercise tests are not at {TESTS}; grading needs minicb "
                         "installed from a clone of its repository (pip install -e .).")
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        env = dict(os.environ, MINICB_GRADE_DIR=str(folder.resolve()))
        env.setdefault("TRITON_INTERPRET", "0" if _has_cuda() else "1")
        command = [sys.executable, "-m", "pytest", str(TESTS), "-q", *LEAN_PYTEST,
                   f"--junitxml={report}", "--tb=long", "-o", "junit_family=xunit1"]
        if chapter:
            command += ["-k", f"ch{chapter}"]
        run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S)
        if not report.exists():
            raise SystemExit(f"grade: pytest did not run:\n{run.stdout}\n{run.stderr}")
        return parse_report(report), run.stdout


def parse_report(report: Path) -> list[Check]:
    checks = []
    for case in ElementTree.parse(report).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        chapter = module[len("test_ch"):len("test_ch00")] if module.startswith("test_ch") else "?"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            problem = case.find("skipped")
        message = "" if problem is None else (problem.get("message") or "").strip()
        name = case.get("name", "?").removeprefix(f"test_ch{chapter}_")
        checks.append(Check(chapter, name, problem is None,
                            _first_line(message), "" if problem is None else problem.text or ""))
    return checks


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


def scorecard(checks: list[Check], verbose: bool = False) -> str:
    lines = []
    for chapter in sorted({c.chapter for c in checks}):
        mine = ordered([c for c in checks if c.chapter == chapter])
        passed = sum(c.passed for c in mine)
        lines.append(f"ch{chapter}  {passed}/{len(mine)} checks passed")
        for check in mine:
            if check.passed:
                lines.append(f"  ok    {check.name}")
            else:
                lines.append(f"  FAIL  {check.name}: {check.message}")
                if verbose:
                    lines += ["        " + line for line in check.details.splitlines()]
    total = sum(c.passed for c in checks)
    lines.append(f"total  {total}/{len(checks)} checks passed "
                 f"({100 * total / max(len(checks), 1):.0f}%)")
    return "\n".join(lines)


def gradescope(checks: list[Check]) -> dict:
    """Gradescope's autograder results.json: one point per check."""
    tests = [{"name": f"ch{c.chapter} {c.name}", "score": float(c.passed), "max_score": 1.0,
              "output": "passed" if c.passed else f"{c.message}\n\n{c.details}".strip()}
             for c in checks]
    return {"score": float(sum(c.passed for c in checks)), "tests": tests}


def grade_one(path: Path, chapter: str | None) -> tuple[list[Check], str]:
    with tempfile.TemporaryDirectory() as scratch:
        return run_checks(find_chapters(path, Path(scratch)), chapter)


def grade_batch(folder: Path, out: Path, chapter: str | None) -> None:
    submissions = sorted(p for p in folder.iterdir()
                         if p.is_dir() or (p.is_file() and zipfile.is_zipfile(p)))
    chapters = [chapter] if chapter else [name[2:4] for name in CHAPTER_FILES]
    with open(out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["submission", *(f"ch{c}" for c in chapters), "passed", "checks",
                         "percent", "problem"])
        for submission in submissions:
            try:
                checks, _ = grade_one(submission, chapter)
            except SystemExit as problem:          # one broken submission never stops the batch
                writer.writerow([submission.name, *([""] * len(chapters)), 0, 0, 0, str(problem)])
                continue
            passed = sum(c.passed for c in checks)
            per_chapter = [f"{sum(c.passed for c in checks if c.chapter == ch)}/"
                           f"{sum(c.chapter == ch for c in checks)}" for ch in chapters]
            writer.writerow([submission.name, *per_chapter, passed, len(checks),
                             f"{100 * passed / max(len(checks), 1):.1f}", ""])
            print(f"{submission.name}: {passed}/{len(checks)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicb grade", description=__doc__.split(
        "\n")[0])
    parser.add_argument("path", nargs="?", type=Path,
                        help="a student's exercises/ folder, or a zip of it")
    parser.add_argument("--chapter", help="grade one chapter only, e.g. 03")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="full tracebacks under each failing check")
    parser.add_argument("--json", type=Path, help="write Gradescope's results.json here")
    parser.add_argument("--batch", type=Path,
                        help="a folder of submissions (folders or zips), graded into --csv")
    parser.add_argument("--csv", type=Path, default=Path("grades.csv"),
                        help="where --batch writes one row per submission (default grades.csv)")
    args = parser.parse_args(argv)
    if args.batch:
        grade_batch(args.batch, args.csv, args.chapter)
        print(f"wrote {args.csv}")
        return 0
    if args.path is None:
        parser.error("give PATH (a folder or zip of exercises/) or --batch FOLDER")
    checks, _ = grade_one(args.path, args.chapter)
    print(scorecard(checks, verbose=args.verbose))
    if args.json:
        args.json.write_text(json.dumps(gradescope(checks), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if checks and all(c.passed for c in checks) else 1

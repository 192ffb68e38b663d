"""The exercise mutants (tests/exercises/mutants/: plausible student bugs), read and applied to a
copy of solutions/: shared by the mutation test (tests/book/test_exercise_mutants.py) and the
grading tool's tests (tests/tools/test_grade_tool.py)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = sorted(path.stem for path in (ROOT / "tests" / "exercises" / "mutants").glob("ch*.py"))


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


class _Tally:
    """Counts one pytest run's outcomes (a plugin handed to pytest.main)."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            self.failed.append(report.nodeid)
        elif report.passed and report.when == "call":
            self.passed += 1


def grade_in_one_process(jobs: list[dict]) -> dict[str, dict]:
    """Grade several mutant folders one after the other in this process, each as
    `MINICB_GRADE_DIR=folder pytest files -k checks -x` would in a process of its own.

    One process instead of one per mutant: importing torch, transformers and the tests costs
    seconds, grading a mutant a fraction of that. Between runs the exercise test modules and the
    graded chapter modules are dropped, so each run imports its own folder's code afresh; what
    stays loaded (torch, minicb, the transformers references) does not depend on the graded code.
    """
    import os
    import sys

    import pytest

    exercises = str(ROOT / "tests" / "exercises")
    results = {}
    for job in jobs:
        for name in [name for name, module in sys.modules.items()
                     if name.startswith("graded_") or
                     str(getattr(module, "__file__", "") or "").startswith(exercises)]:
            del sys.modules[name]
        os.environ["MINICB_GRADE_DIR"] = job["folder"]
        tally = _Tally()
        code = pytest.main([*job["files"], "-k", job["checks"], "-x", "-q", *job["lean"],
                            "--no-header", "-rN"], plugins=[tally])
        results[job["name"]] = {"exit": int(code), "failed": tally.failed,
                                "passed": tally.passed}
    return results


if __name__ == "__main__":       # python tests/mutation.py JOBS.json RESULTS.json
    import json
    import os
    import sys

    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    jobs_file, results_file = sys.argv[1:3]
    verdicts = grade_in_one_process(json.loads(Path(jobs_file).read_text()))
    Path(results_file).write_text(json.dumps(verdicts))

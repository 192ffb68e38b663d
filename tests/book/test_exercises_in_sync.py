"""exercises/ is what scripts/make_exercises.py makes of solutions/, and its stubs fail every test.

The second half is the proof that the exercise tests can fail: graded against the untouched
stubs (MINICB_IMPL=exercises), every one of them must fail, and fail with NotImplementedError,
so no test passes by asserting something the student's code never decides.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from minicb.tools.grade import LEAN_PYTEST

ROOT = Path(__file__).resolve().parents[2]
STUB_RUN_TIMEOUT_S = 420     # the stubs fail fast; this bounds a hang (it would fail the test)


def _generator():
    spec = importlib.util.spec_from_file_location("make_exercises",
                                                  ROOT / "scripts" / "make_exercises.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exercises_are_generated_from_solutions():
    stale = _generator().out_of_step()
    assert not stale, (f"exercises/{', exercises/'.join(stale)} differ from what solutions/ "
                       "generates; edit solutions/ and run `python scripts/make_exercises.py`.")


def test_every_chapter_has_a_solution_with_stubs():
    generator = _generator()
    sys.path.insert(0, str(ROOT / "tests" / "exercises"))
    try:
        from adapter import CHAPTERS
    finally:
        sys.path.pop(0)
    modules = {path.stem for path in (ROOT / "solutions").glob("ch*.py")}
    assert modules == set(CHAPTERS.values()), \
        f"tests/exercises/adapter.py names {sorted(CHAPTERS.values())}, solutions/ has " \
        f"{sorted(modules)}"
    for name in modules:
        exercise = generator.strip_solutions((ROOT / "solutions" / f"{name}.py").read_text(),
                                             f"{name}.py")
        assert "raise NotImplementedError(" in exercise, (f"solutions/{name}.py marks no solution "
                                                          "region")


def test_stripping_keeps_the_contract_and_names_the_function():
    source = ('def area(width, height):\n'
              '    """Width times height."""\n'
              '    # BEGIN SOLUTION: multiply "width" by height\n'
              '    return width * height\n'
              '    # END SOLUTION\n')
    exercise = _generator().strip_solutions(source, "ch09_area.py")
    assert exercise.endswith('def area(width, height):\n'
                             '    """Width times height."""\n'
                             '    raise NotImplementedError(\n'
                             '        "area: multiply \\"width\\" by height")\n')
    namespace: dict = {}
    exec(exercise, namespace)
    with pytest.raises(NotImplementedError, match='area: multiply "width" by height'):
        namespace["area"](2, 3)


@pytest.mark.parametrize("source, problem", [
    ("def f():\n    # BEGIN SOLUTION: x\n    return 1\n", "never closed"),
    ("def f():\n    return 1\n    # END SOLUTION\n", "without a BEGIN"),
    ("def f():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n", "what to implement"),
    ("def f():\n    # BEGIN SOLUTION: a\n    # BEGIN SOLUTION: b\n    # END SOLUTION\n",
     "inside the region"),
    ("# BEGIN SOLUTION: a\nX = 1\n# END SOLUTION\n", "inside a function"),
])
def test_malformed_markers_are_refused(source, problem):
    with pytest.raises(ValueError, match=problem):
        _generator().strip_solutions(source, "ch09_bad.py")


def test_every_exercise_test_fails_on_the_stubs_with_not_implemented(tmp_path):
    report = tmp_path / "stubs.xml"
    env = {**os.environ, "MINICB_IMPL": "exercises", "TRITON_INTERPRET": "1"}
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/exercises", "-q", *LEAN_PYTEST,
             f"--junitxml={report}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=STUB_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"grading the stubs took over {STUB_RUN_TIMEOUT_S} s; a stub should fail at "
                    "once")
    assert report.exists(), ("the stub run wrote no "
                             f"report:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcomes = {}
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        failure = case.find("failure")
        outcomes[name] = "passed" if len(case) == 0 else \
            "NotImplementedError" if failure is not None and "NotImplementedError" in (
                failure.get("message") or "") \
            else f"{case[0].tag}: {(case[0].get('message') or '')[:200]}"
    chapters = {tag for tag in (f"ch0{n}" for n in range(1, 7))
                if any(tag in name for name in outcomes)}
    assert chapters == {f"ch0{n}" for n in range(1, 7)}, \
        f"the stub run graded chapters {sorted(chapters)} only:\n{run.stdout[-3000:]}"
    wrong = {name: outcome for name, outcome in outcomes.items()
             if outcome != "NotImplementedError"}
    assert not wrong, (
        "against the stubs every exercise test must fail with NotImplementedError; these did not:\n"
        + "\n".join(f"  {name}: {outcome}" for name, outcome in sorted(wrong.items())))

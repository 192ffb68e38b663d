"""The one door between the exercise tests and the code they grade.

MINICB_IMPL=solutions (the default) grades solutions/, MINICB_IMPL=exercises grades the
student's exercises/ (`make grade`), and MINICB_GRADE_DIR=/some/folder grades the chapter files in
that folder (`python -m minicb grade PATH`: a student's copy, or a mutant of the solutions). Tests
never import any of them directly, so the same tests grade all.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

from minicb.tools.chapters import CHAPTERS, load_chapter

ROOT = Path(__file__).resolve().parents[2]
IMPLEMENTATIONS = ("solutions", "exercises")

# Triton decides at definition time whether a kernel is compiled or interpreted: without CUDA,
# the chapter 05 kernel must be defined under the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def implementation() -> str:
    name = os.environ.get("MINICB_IMPL", "solutions")
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"MINICB_IMPL={name!r} is not one of {IMPLEMENTATIONS}: use 'exercises' "
                         "to grade your work (make grade) or 'solutions' for the reference.")
    return name


def chapter(number: str) -> ModuleType:
    """The module of chapter `number` ("00" … "10") from the graded implementation."""
    folder = os.environ.get("MINICB_GRADE_DIR")
    if not folder:
        return importlib.import_module(f"{implementation()}.{CHAPTERS[number]}")
    return load_chapter(Path(folder), number)


def run_docstring_examples(module: ModuleType) -> None:
    """Run the worked examples in the module's docstrings, raising the first problem.

    An exception inside an example is re-raised as it is (a stub's NotImplementedError stays one);
    a wrong result becomes an AssertionError showing the example, what it expected and what came.
    """
    finder, runner = doctest.DocTestFinder(), doctest.DebugRunner(verbose=False)
    for test in finder.find(module, module.__name__):
        try:
            runner.run(test)
        except doctest.UnexpectedException as failure:
            raise failure.exc_info[1].with_traceback(failure.exc_info[2]) from None
        except doctest.DocTestFailure as failure:
            raise AssertionError(
                f"the worked example in {test.name.removeprefix('graded_')} gave a different "
                "result.\n"
                f"  example:  {failure.example.source.strip()}\n"
                f"  expected: {failure.example.want.strip()}\n"
                f"  got:      {failure.got.strip()}") from None


@contextlib.contextmanager
def must_raise(error: type[BaseException], call: str):
    """Like pytest.raises, but a call that returns instead of raising is named in the failure."""
    try:
        yield
    except error:
        return
    raise AssertionError(f"{call} should raise {error.__name__}; yours returned without raising.")

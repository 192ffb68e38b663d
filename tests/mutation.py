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

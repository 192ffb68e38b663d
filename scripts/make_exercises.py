"""Generate exercises/ from solutions/: every marked solution region becomes a stub.

solutions/ is the single source. Inside a function, the code a student writes sits between

    # BEGIN SOLUTION: what to implement, in one line
    ...the reference code...
    # END SOLUTION

and the exercise gets, at the same indentation,

    raise NotImplementedError(
        "function_name: what to implement, in one line")

Everything else (imports, docstrings with the contract and hints, given functions) is copied as it
is. A file without regions (a package's __init__.py) is copied unchanged.

    python scripts/make_exercises.py           write exercises/*.py
    python scripts/make_exercises.py --check   exit 1 and name the files that are out of step
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?::\s*(?P<hint>.*\S))?\s*$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?def\s+(?P<name>\w+)")
LINE_LENGTH = 100
HEADER = ("# Generated from solutions/{name} by scripts/make_exercises.py. Replace each\n"
          "# NotImplementedError with your code, then run `make grade CH={chapter}`.\n")


def _enclosing_function(lines: list[str], indent: str) -> str:
    """The name of the innermost `def` above the marker that encloses its indentation."""
    for line in reversed(lines):
        match = DEF.match(line)
        if match and len(match["indent"]) < len(indent):
            return match["name"]
    raise ValueError("a solution region must sit inside a function")


def _stub(indent: str, function: str, hint: str) -> list[str]:
    message = f"{function}: {hint}".replace("\\", "\\\\").replace('"', '\\"')
    inner = indent + "    "
    chunks = textwrap.wrap(message, LINE_LENGTH - len(inner) - 2, drop_whitespace=False)
    quoted = [f'{inner}"{chunk}"' for chunk in chunks]
    quoted[-1] += ")"
    return [f"{indent}raise NotImplementedError(", *quoted]


def strip_solutions(source: str, filename: str) -> str:
    """The exercise version of one solution file's text; ValueError names a malformed marker."""
    out: list[str] = []
    inside: tuple[int, str] | None = None       # (line number, indentation) of the open BEGIN
    regions = 0
    for number, line in enumerate(source.splitlines(), start=1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if inside:
                raise ValueError(f"{filename}:{number}: BEGIN SOLUTION inside the region opened at "
                                 f"line {inside[0]}; close it with END SOLUTION first.")
            if not begin["hint"]:
                raise ValueError(f"{filename}:{number}: write what to implement after the marker: "
                                 "`# BEGIN SOLUTION: <one line for the student>`.")
            inside = (number, begin["indent"])
            out.extend(_stub(begin["indent"], _enclosing_function(out, begin["indent"]),
                             begin["hint"]))
            regions += 1
        elif end:
            if not inside:
                raise ValueError(f"{filename}:{number}: END SOLUTION without a BEGIN SOLUTION.")
            inside = None
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{filename}:{inside[0]}: BEGIN SOLUTION is never closed with END "
                         "SOLUTION.")
    if regions == 0:
        return source
    chapter = re.match(r"ch(\d+)", filename)
    header = HEADER.format(name=filename, chapter=chapter[1] if chapter else "")
    return header + "\n".join(out) + "\n"


def generate(solutions: Path = SOLUTIONS) -> dict[str, str]:
    """{file name: exercise text} for every module of solutions/."""
    return {path.name: strip_solutions(path.read_text(), path.name)
            for path in sorted(solutions.glob("*.py"))}


def out_of_step(solutions: Path = SOLUTIONS, exercises: Path = EXERCISES) -> list[str]:
    """Exercise files that differ from what generate() makes, or that have no solution."""
    expected = generate(solutions)
    present = {path.name for path in exercises.glob("*.py")}
    stale = [name for name, text in expected.items()
             if name not in present or (exercises / name).read_text() != text]
    return sorted(stale + [name for name in present - expected.keys()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only report files that are out of step")
    args = parser.parse_args(argv)
    if args.check:
        stale = out_of_step()
        for name in stale:
            print(f"exercises/{name} is out of step with solutions/; run python "
                  "scripts/make_exercises.py")
        return 1 if stale else 0
    EXERCISES.mkdir(exist_ok=True)
    for name, text in generate().items():
        (EXERCISES / name).write_text(text)
        print(f"wrote exercises/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The exercise chapters' files, loaded from any folder: a student's copy, solutions/, a mutant.

The grader, the course's timed workloads and the exercise tests' adapter all load a chapter's
module through `load_chapter`, so a file is found, refused or explained the same way everywhere.
`why_not_loadable` says, before anything runs, why a chapter cannot be graded at all (the file is
missing, or a SyntaxError and its line): the first line of that chapter's scorecard.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

CHAPTERS = {
    "00": "ch00_load_test",
    "01": "ch01_kv_loop",
    "02": "ch02_static_batch",
    "03": "ch03_scheduler_step",
    "04": "ch04_block_allocator",
    "05": "ch05_decode_kernel",
    "06": "ch06_serving_metrics",
    "07": "ch07_prefix_cache",
    "08": "ch08_speculative",
    "09": "ch09_routing",
    "10": "ch10_overlap",
    "12": "ch12_quantize",
    "13": "ch13_tensor_parallel",
    "14": "ch14_moe",
}


def chapter_file(folder: Path, number: str) -> Path:
    return Path(folder) / f"{CHAPTERS[number]}.py"


def load_chapter(folder: Path, number: str) -> ModuleType:
    """Chapter `number`'s module from `folder`, imported once per process as graded_<name> (a
    process that grades another folder next imports that folder's file in its place)."""
    name = f"graded_{CHAPTERS[number]}"
    path = chapter_file(folder, number)
    loaded = sys.modules.get(name)
    if loaded is not None and Path(loaded.__file__).resolve() == path.resolve():
        return loaded
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the graded folder must hold "
                                f"{path.name} (a copy of exercises/).")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module       # before running it: dataclasses and Triton look it up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]        # a second try fails the same way instead of half-loaded
        raise
    return module


def why_not_loadable(folder: Path, number: str) -> str | None:
    """None when chapter `number`'s file exists and parses; else the reason, in one line."""
    path = chapter_file(folder, number)
    if not path.is_file():
        return f"file is missing: {path.name} is not in the submission"
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as error:
        kind = type(error).__name__          # IndentationError and TabError are SyntaxErrors
        return (f"{kind} in {path.name} line {error.lineno}: {error.msg}"
                + (f": {error.text.strip()}" if error.text and error.text.strip() else ""))
    except ValueError as error:              # e.g. a null byte in the file
        return f"{path.name} cannot be read as Python: {error}"
    return None


def first_stub(path: Path) -> tuple[str, int] | None:
    """The function a student should write first: the first one, in file order, still raising
    NotImplementedError; its qualified name and the line of that raise."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(child):
                    if (isinstance(inner, ast.Raise) and inner.exc is not None
                            and "NotImplementedError" in ast.unparse(inner.exc)):
                        found.append((inner.lineno, f"{prefix}{child.name}"))
                        break
    visit(tree, "")
    if not found:
        return None
    line, name = min(found)
    return name, line

"""Show the engine's own code in a notebook, from the installed package, never from a pasted copy.

    from minicb import viz
    from minicb.scheduler.continuous import ContinuousScheduler
    viz.show_source(ContinuousScheduler.schedule)

The cell's output is the source with its path (relative to the repository) and line numbers, as
Markdown. A chapter committed with that output fails its notebook test as soon as the code
changes and the notebook is not rebuilt, so what the book shows is what the engine runs.
"""

from __future__ import annotations

import inspect
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class Source:
    """Source lines of one object, shown as Markdown in a notebook and as text elsewhere."""

    def __init__(self, obj, start: str | None = None, stop: str | None = None) -> None:
        lines, first = inspect.getsourcelines(obj)
        path = Path(inspect.getsourcefile(obj)).resolve()
        begin, end = 0, len(lines)
        if start is not None:
            begin = _find(lines, start, 0, obj)
        if stop is not None:
            end = _find(lines, stop, begin, obj) + 1
        self.lines = lines[begin:end]
        self.first_line = first + begin
        self.path = _display_path(path)

    @property
    def last_line(self) -> int:
        return self.first_line + len(self.lines) - 1

    def numbered(self) -> str:
        width = len(str(self.last_line))
        return "".join(f"{self.first_line + i:>{width}}  {line}"
                       for i, line in enumerate(self.lines))

    def header(self) -> str:
        return f"{self.path}, lines {self.first_line}-{self.last_line}"

    def __str__(self) -> str:
        return f"{self.header()}\n{self.numbered()}"

    __repr__ = __str__          # the plain-text form a notebook stores beside the Markdown

    language = "python"

    def _repr_markdown_(self) -> str:
        return f"**`{self.header()}`**\n\n```{self.language}\n{self.numbered()}```\n"


class FileSource(Source):
    """Lines of a file that is not Python (the C kernels), shown the same way."""

    def __init__(self, path, start: str | None = None, stop: str | None = None) -> None:
        path = Path(path).resolve()
        lines = path.read_text().splitlines(keepends=True)
        begin = _find(lines, start, 0, path.name) if start is not None else 0
        if stop is None:
            end = len(lines)
        else:   # a whole line first ("}" closes a C function), else a line that contains it
            whole = [i for i in range(begin, len(lines)) if lines[i].rstrip("\n") == stop]
            end = (whole[0] if whole else _find(lines, stop, begin, path.name)) + 1
        self.lines, self.first_line = lines[begin:end], begin + 1
        self.path = _display_path(path)
        self.language = {".c": "c", ".h": "c"}.get(path.suffix, "text")


def _find(lines: list[str], text: str, begin: int, obj) -> int:
    for index in range(begin, len(lines)):
        if text in lines[index]:
            return index
    raise ValueError(f"{text!r} is not in the source of {getattr(obj, '__qualname__', obj)!r}: "
                     "the code changed; update the chapter's start/stop text.")


def _display_path(path: Path) -> str:
    """minicb/... or kernels/... as a reader finds it in the repository."""
    parts = path.parts
    for anchor in ("minicb", "kernels"):
        if anchor in parts:
            index = len(parts) - 1 - parts[::-1].index(anchor)
            if anchor == "minicb" and index + 1 < len(parts) and parts[index + 1] == "kernels":
                return "/".join(parts[index + 1:])       # installed minicb/kernels is kernels/ here
            return "/".join(parts[index:])
    try:
        return str(path.relative_to(_PACKAGE_ROOT))
    except ValueError:
        return path.name


def show_source(obj, start: str | None = None, stop: str | None = None) -> Source:
    """The source of a function, method or class from the installed package, with its path and
    line numbers. `start` and `stop` (text on a line) show only the lines from one to the other."""
    return Source(obj, start, stop)


def show_file(path, start: str | None = None, stop: str | None = None) -> FileSource:
    """A file's lines with its path and line numbers (for the C kernels, which have no Python
    object to inspect); `start` and `stop` as for show_source."""
    return FileSource(path, start, stop)

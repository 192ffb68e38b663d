"""benchmarks/results/ holds what a page, a chapter, the README or a test reads: the run of
record for each figure. A rerun or a picture that nothing shows is left out of the tree (the
git history keeps it), so a reader who opens the folder finds the evidence the pages cite."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# where a result can be shown or read: the pages, the chapters, the code and the tests
READERS = ("README.md", "Makefile", "benchmarks/*.md", "docs/*.md", "notebooks/*.md", "book/*",
           "minicb/**/*.py", "tests/**/*.py", "scripts/*")


def _reader_text() -> str:
    files = subprocess.run(["git", "ls-files", "--", *READERS], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    here = Path(__file__).resolve()
    return "\n".join((ROOT / f).read_text(encoding="utf-8", errors="replace") for f in files
                     if (ROOT / f).is_file() and (ROOT / f).resolve() != here)


def _shown(relative: str, text: str) -> bool:
    """Named whole (`offline-chat.json`, not as the tail of `x-offline-chat.json`), in a folder
    that is named (`routing-kv320/`), or as `stem.{json,png}`."""
    path = Path(relative)
    whole = rf"(?<![\w.-]){re.escape(path.name)}(?![\w-])"
    if re.search(whole, text):
        return True
    if len(path.parts) > 1 and f"{path.parts[0]}/" in text:
        return True
    braces = rf"(?<![\w.-]){re.escape(path.stem)}\.\{{[^}}]*\b{re.escape(path.suffix[1:])}\b"
    return re.search(braces, text) is not None


def test_every_result_is_shown_or_read():
    tracked = subprocess.run(["git", "ls-files", "--", "benchmarks/results"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout: the tracked results cannot be listed")
    text = _reader_text()
    unshown = [f for f in (Path(t).relative_to("benchmarks/results").as_posix() for t in tracked)
               if not _shown(f, text)]
    assert not unshown, (f"benchmarks/results/ holds results no page, chapter, code or test "
                         f"shows: {unshown}. Show each on the page that discusses it, or leave "
                         "it out of the tree (git rm; the history keeps it).")


def test_the_check_sees_a_result_nothing_names():
    text = "see [`offline-chat.json`](results/offline-chat.json) and results/routing-kv320/"
    assert _shown("offline-chat.json", text)
    assert not _shown("chat.json", text)                   # only as another name's tail
    assert not _shown("offline-chat.png", text)            # its picture is shown nowhere
    assert _shown("routing-kv320/policies.png", text)
    assert _shown("load-study.png", "results/load-study.{json,png}")

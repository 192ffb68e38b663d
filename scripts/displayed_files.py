"""Rewrite docs/ARCHITECTURE.md's list of the files the chapters display from the committed
chapters (run after `make notebooks`; tests/book/test_displayed_files.py checks it)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "book"))

from test_displayed_files import ARCHITECTURE, BEGIN, END, expected_block  # noqa: E402

text = ARCHITECTURE.read_text()
head, rest = text.split(BEGIN)
_, tail = rest.split(END)
ARCHITECTURE.write_text(f"{head}{BEGIN}\n{expected_block()}\n{END}{tail}")
print(f"{ARCHITECTURE.relative_to(ROOT)}: the displayed files listed")

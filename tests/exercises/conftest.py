"""Exercise tests grade students' code: a bug must fail its test within a minute, never hang."""

from __future__ import annotations

import pytest

EXERCISE_TEST_TIMEOUT_S = 60


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/exercises/" in item.nodeid.replace("\\", "/") or item.nodeid.startswith(
                "test_ch"):
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(EXERCISE_TEST_TIMEOUT_S))

"""The cited facts table: every row has a value, a unit and a source a reader can follow."""

import pytest

from minicb.facts import FACTS, fact, facts_table


@pytest.mark.parametrize("name", sorted(FACTS))
def test_every_fact_is_cited(name):
    f = FACTS[name]
    assert f.unit.strip(), f"{name} has no unit"
    assert len(f.source.strip()) > 15, f"{name} has no usable source"
    assert f.value not in (None, ""), f"{name} has no value"


def test_unknown_fact_names_the_file_to_add_it_to():
    with pytest.raises(KeyError, match="minicb/facts.py"):
        fact("no_such_fact")


def test_table_lists_every_fact_once():
    table = facts_table()
    for name in FACTS:
        assert table.count(f"`{name}`") == 1

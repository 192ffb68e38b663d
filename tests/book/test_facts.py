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


def test_no_fact_is_defined_twice():
    """A second definition would silently replace the first, source and all."""
    import ast
    import inspect

    import minicb.facts

    names = [key.value for node in ast.walk(ast.parse(inspect.getsource(minicb.facts)))
             if isinstance(node, ast.Dict) for key in node.keys
             if isinstance(key, ast.Constant) and isinstance(key.value, str)]
    twice = sorted({name for name in names if names.count(name) > 1})
    assert not twice, f"facts defined more than once in minicb/facts.py: {twice}"


def _paper_claims(facts: dict) -> dict:
    """Facts that cite an arXiv paper, grouped by (paper, value, unit)."""
    import re

    claims: dict = {}
    for name, f in facts.items():
        for paper in re.findall(r"arxiv\.org/abs/(\d{4}\.\d{4,5})", f.source):
            claims.setdefault((paper, f.value, f.unit), []).append(name)
    return claims


def test_no_paper_claim_is_defined_under_two_names():
    """The same number from the same paper under a second name is a copy that can drift."""
    twice = {claim: names for claim, names in _paper_claims(FACTS).items() if len(names) > 1}
    assert not twice, f"one paper's number under several names in minicb/facts.py: {twice}"


def test_a_paper_claim_copied_under_a_new_name_is_found():
    from minicb.facts import Fact

    copy = Fact(2.6, "x", "Sarathi-Serve again, https://arxiv.org/abs/2403.02310")
    claims = _paper_claims({**FACTS, "sarathi_gain_copy": copy})
    assert sorted(claims[("2403.02310", 2.6, "x")]) == ["sarathi_gain_copy",
                                                          "sarathi_serve_capacity_gain"]

"""The rule for a verdict from repeats: the difference must exceed the repeats' spread."""

import pytest

from minicb.repeats import Repeats


def test_a_gain_inside_the_spread_is_noise():
    # prompt lookup at batch 1 on code: every repeat above 1, but spread 0.35 > gain 0.16
    lookup = Repeats.of([1.07, 1.41, 1.16])
    assert lookup.median == 1.16 and lookup.spread == pytest.approx(0.34)
    assert not lookup.beyond_noise()
    assert lookup.verdict("paid", "cost") == "within this machine's noise"
    assert str(lookup) == "1.16 (1.07–1.41)"


def test_a_loss_beyond_the_spread_is_a_verdict_either_way():
    assert Repeats.of([0.65, 0.76, 0.77]).verdict("paid", "cost") == "cost"
    assert Repeats.of([1.9, 2.0, 2.1]).verdict("paid", "cost") == "paid"
    assert Repeats.of([6.9, 7.0, 7.05]).beyond_noise(reference=8.0)


def test_fewer_than_three_repeats_never_make_a_verdict():
    assert not Repeats.of([0.5, 0.5]).beyond_noise()
    with pytest.raises(ValueError, match="at least one"):
        Repeats.of([])
